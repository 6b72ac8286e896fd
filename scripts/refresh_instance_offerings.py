#!/usr/bin/env python3
"""Regenerate cluster_config/instance_offerings.json and availability_zones.json from moto's
DescribeInstanceTypeOfferings data.

moto ships, per region, the instance types EC2's DescribeInstanceTypeOfferings returned when its
data was last refreshed (including reservation-only types such as p5e.48xlarge, which cfn-lint's
price-list data misses), and per zone the same offerings, whose locations are the region's zones.
Settings check every instance type and the zone against these files at synth, offline, without
importing moto. Refresh them after upgrading moto in requirements-dev.txt:

    .venv/bin/python scripts/refresh_instance_offerings.py
"""

from __future__ import annotations

import gzip
import json
from importlib.metadata import version
from pathlib import Path

import moto

OUT = Path(__file__).resolve().parent.parent / "cluster_config" / "instance_offerings.json"
ZONES_OUT = OUT.with_name("availability_zones.json")
SOURCE = Path(moto.__file__).parent / "ec2" / "resources" / "instance_type_offerings" / "region"
ZONES_SOURCE = SOURCE.with_name("availability-zone")


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
    source = write_by_region(OUT, "region", regions)
    print(f"{OUT}: {len(regions)} regions, {sum(len(s.split()) for r in regions.values() for s in r.values())} offerings, from {source}")
    write_zones()


def write_by_region(path: Path, folder: str, by_region: dict) -> str:
    """``path`` as JSON, one region per line (a refresh shows up in review as the regions that changed), headed by
    where it came from: moto's ``instance_type_offerings/<folder>`` data. Returns that source."""
    header = {"source": f"moto {version('moto')} ec2/resources/instance_type_offerings/{folder}",
              "refresh": "python scripts/refresh_instance_offerings.py"}
    lines = [f'  "_about": {json.dumps(header)}']
    lines += [f"  {json.dumps(region)}: {json.dumps(value, separators=(',', ':'))}" for region, value in by_region.items()]
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    return header["source"]


def write_zones() -> None:
    zones = {}
    for path in sorted(ZONES_SOURCE.glob("*.json.gz")):
        region = path.name.removesuffix(".json.gz")
        offerings = json.loads(gzip.decompress(path.read_bytes()))
        # {"ap-southeast-3": "a b c"}: the zone names are the region's name and these letters.
        zones[region] = " ".join(sorted({item["Location"].removeprefix(region) for item in offerings}))
    source = write_by_region(ZONES_OUT, "availability-zone", zones)
    print(f"{ZONES_OUT}: {len(zones)} regions, {sum(len(z.split()) for z in zones.values())} zones, from {source}")


if __name__ == "__main__":
    main()
