#!/usr/bin/env python3
"""Regenerate cluster_config/instance_offerings.json from moto's DescribeInstanceTypeOfferings data.

moto ships, per region, the instance types EC2's DescribeInstanceTypeOfferings returned when its
data was last refreshed (including reservation-only types such as p5e.48xlarge, which cfn-lint's
price-list data misses). Settings check every instance type against this file at synth, offline,
without importing moto. Refresh it after upgrading moto in requirements-dev.txt:

    .venv/bin/python scripts/refresh_instance_offerings.py
"""

from __future__ import annotations

import gzip
import json
from importlib.metadata import version
from pathlib import Path

import moto

OUT = Path(__file__).resolve().parent.parent / "cluster_config" / "instance_offerings.json"
SOURCE = Path(moto.__file__).parent / "ec2" / "resources" / "instance_type_offerings" / "region"


def main() -> None:
    regions = {}
    for path in sorted(SOURCE.glob("*.json.gz")):
        offerings = json.loads(gzip.decompress(path.read_bytes()))
        families: dict[str, list[str]] = {}
        for instance_type in sorted({item["InstanceType"] for item in offerings}):
            family, size = instance_type.split(".", 1)
            families.setdefault(family, []).append(size)
        # {"c7i": "12xlarge 16xlarge ... xlarge"}: a third of the size of a flat list of types.
        regions[path.name.removesuffix(".json.gz")] = {family: " ".join(sizes) for family, sizes in families.items()}
    header = {"source": f"moto {version('moto')} ec2/resources/instance_type_offerings/region",
              "refresh": "python scripts/refresh_instance_offerings.py"}
    # One region per line: a refresh shows up in review as the regions that changed.
    lines = [f'  "_about": {json.dumps(header)}']
    lines += [f"  {json.dumps(region)}: {json.dumps(families, separators=(',', ':'))}" for region, families in regions.items()]
    OUT.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"{OUT}: {len(regions)} regions, {sum(len(s.split()) for r in regions.values() for s in r.values())} offerings, from {header['source']}")


if __name__ == "__main__":
    main()
