"""Which EC2 instance types each region offers, from data that ships with the app (no AWS call).

``instance_offerings.json`` is generated from moto's copy of EC2 DescribeInstanceTypeOfferings
(``scripts/refresh_instance_offerings.py`` says how to refresh it). It lists reservation-only types
too (p5e.48xlarge in ap-southeast-3), which price-list data such as cfn-lint's misses. The check is
per region: zone names map to different physical zones in each account, so a per-zone list from
another account would mislead.

``availability_zones.json``, from the same moto data per zone, holds each region's zone names (the
region's name and a letter), so that a zone the region lacks is refused offline.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

DATA = Path(__file__).resolve().parent / "instance_offerings.json"
ZONES = DATA.with_name("availability_zones.json")
# Zone names some accounts have and moto's account lacks: us-west-1 gives each account two of a, b and c;
# accounts older than ap-northeast-1's closed zone still see ap-northeast-1b.
OLDER_ACCOUNTS_ZONES = {"us-west-1": "c", "ap-northeast-1": "b"}

# GPUs of each instance type (EC2 instance types): gpu_queue.gpus_per_instance follows from it, and a
# different count in the settings is refused (the jobs would ask Slurm for GPUs the nodes lack).
GPUS_PER_INSTANCE = {"p5e.48xlarge": 8, "p5en.48xlarge": 8, "p5.48xlarge": 8, "p4de.24xlarge": 8, "p4d.24xlarge": 8,
                     "g5.12xlarge": 4, "g5.48xlarge": 8}


@lru_cache(maxsize=1)
def _offerings() -> dict[str, dict[str, frozenset[str]]]:
    raw = json.loads(DATA.read_text())
    raw.pop("_about")
    return {region: {family: frozenset(sizes.split()) for family, sizes in families.items()} for region, families in raw.items()}


@lru_cache(maxsize=1)
def _zone_letters() -> dict[str, str]:
    raw = json.loads(ZONES.read_text())
    raw.pop("_about")
    return raw


def zones(region: str) -> list[str]:
    """The region's Availability Zone names, e.g. ap-southeast-3a; empty for a region the data lacks."""
    letters = set(_zone_letters().get(region, "").split()) | set(OLDER_ACCOUNTS_ZONES.get(region, "").split())
    return [f"{region}{letter}" for letter in sorted(letters)]


def known_regions() -> list[str]:
    return sorted(_offerings())


def is_offered(region: str, instance_type: str) -> bool:
    family, _, size = instance_type.partition(".")
    return size in _offerings().get(region, {}).get(family, ())


def alternatives(region: str, instance_type: str, limit: int = 5) -> list[str]:
    """Offered types of the same class (c, m, p, ...), size and architecture, newest generation first."""
    family, _, size = instance_type.partition(".")
    wanted = _parts(family)
    if not wanted:
        return []
    candidates = []
    for other, sizes in _offerings().get(region, {}).items():
        parts = _parts(other)
        # Same class; Graviton ('g' after the generation) only for Graviton: nodes share one AMI architecture.
        if size in sizes and other != family and parts and parts[0] == wanted[0] and ("g" in parts[2]) == ("g" in wanted[2]):
            candidates.append((parts, f"{other}.{size}"))
    # Newest generation first; within one, the plain family (c7i) before variants (c7in, c7i-flex).
    candidates.sort(key=lambda item: (-item[0][1], len(item[1]), item[1]))
    return [name for _, name in candidates[:limit]]


def _parts(family: str) -> tuple[str, int, str] | None:
    """'c6in' -> ('c', 6, 'in'): class, generation, attributes."""
    match = re.fullmatch(r"([a-z]+?)(\d+)([a-z-]*)", family)
    return (match.group(1), int(match.group(2)), match.group(3)) if match else None


def check_offered(region: str, instance_types: dict[str, str]) -> list[str]:
    """One message per ``{settings key: instance type}`` the region does not offer; empty when all are."""
    if region not in _offerings():
        return [
            f"region: no instance offerings data for {region!r} in {DATA.name} "
            f"(known: {', '.join(known_regions())}); refresh it with scripts/refresh_instance_offerings.py"
        ]
    problems = []
    for key, instance_type in instance_types.items():
        if not is_offered(region, instance_type):
            offered = alternatives(region, instance_type)
            hint = f"; offered there: {', '.join(offered)}" if offered else ""
            problems.append(f"{key}: {instance_type} is not offered in {region}{hint}")
    return problems


# Commercial regions where CloudFormation has AWS::Grafana::Workspace (Amazon Managed Grafana), from the
# region schemas of the pinned cfn-lint (requirements.txt; tests/test_settings.py
# compares the two, so an upgrade that adds a region shows here).
GRAFANA_REGIONS = frozenset({
    "ap-northeast-1", "ap-northeast-2", "ap-southeast-1", "ap-southeast-2", "eu-central-1", "eu-west-1",
    "eu-west-2", "us-east-1", "us-east-2", "us-west-2",
})
