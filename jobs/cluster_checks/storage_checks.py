"""The acceptance run's storage checks: each FSx mount's write and read throughput against what it is
provisioned for, from ``python -m cluster_checks.fsx_perf``'s summary.json. ``fsx_report`` gives
each mount its status and notes; this module turns them into checks."""

from __future__ import annotations

from dataclasses import fields
from typing import Mapping, Optional, Sequence

from cluster_checks import fsx_report
from cluster_checks.verdict import NOT_MEASURED, Check, check, not_measured

STORAGE_SOURCE = ("provisioned = capacity x MB/s per TiB (cluster_config storage.<fs>.throughput_mb_s, "
                  "FSX_EXPECTED_MB_S); limit: jobs/cluster_checks/fsx_report.py min ratio")


def storage_checks(summary: Optional[Mapping], mounts: Sequence[str] = ()) -> list[Check]:
    """One check per mount from fsx_perf's summary.json (None: the storage step wrote none).

    ``mounts``: the mounts the run must cover (expected.json); default those in the summary."""
    # Keys this version of MountResult does not know (a summary from another bundle) are left out.
    known = {f.name for f in fields(fsx_report.MountResult)}
    results = [fsx_report.MountResult(**{k: v for k, v in m.items() if k in known})
               for m in (summary or {}).get("mounts", [])]
    by_mount = {r.mount: r for r in results}
    min_ratio = float((summary or {}).get("min_ratio", fsx_report.DEFAULT_MIN_RATIO))
    wanted = list(dict.fromkeys([m.rstrip("/") or "/" for m in mounts] or list(by_mount)))
    if not wanted:
        return [not_measured("storage: FSx throughput", f">= {min_ratio:.0%} of provisioned",
                             "no storage/summary.json and no mounts in expected.json: jobs/acceptance.sh runs "
                             "python -m cluster_checks.fsx_perf --out DIR/storage", STORAGE_SOURCE)]
    return [_mount_check(by_mount.get(m), m, min_ratio) for m in wanted]


def _mount_check(r: Optional[fsx_report.MountResult], mount: str, min_ratio: float) -> Check:
    name = f"storage: {mount} read/write vs provisioned"
    if r is None:
        return not_measured(name, f">= {min_ratio:.0%} of provisioned", f"{mount} is not in storage/summary.json: "
                            "add it to FSX_PERF_MOUNTS", STORAGE_SOURCE)
    if r.provisioned_mb_s:
        expected = f">= {min_ratio:.0%} of provisioned {r.provisioned_mb_s / 1000:.3f} GB/s (read and write)"
    else:
        expected = f">= {min_ratio:.0%} of provisioned"
    measured = "" if r.write_mb_s is None and r.read_mb_s is None else (
        f"write {_gb(r.write_mb_s)} GB/s, read {_gb(r.read_mb_s)} GB/s ({r.tool})")
    notes = "; ".join(r.notes)
    if r.status == fsx_report.NOT_COMPARED:
        return Check(name, NOT_MEASURED, measured, expected,
                     "no provisioned throughput to compare with: export FSX_EXPECTED_MB_S=$(python -m cluster_config "
                     "fsx-expected --env ENV) before submitting (docs/storage_validation.md)", STORAGE_SOURCE)
    ratios = [x for x in (r.write_ratio, r.read_ratio) if x is not None]
    why = {fsx_report.BELOW: notes, fsx_report.FAILED: f"the measurement failed: {notes}",
           fsx_report.MISSING: f"{mount} is not mounted on the nodes: check the cluster's SharedStorage and "
                               "'mount -t lustre' on a compute node"}.get(r.status, notes)
    return check(name, r.status == fsx_report.OK, measured, expected, why or r.status, STORAGE_SOURCE,
                 ratio=min(ratios) if ratios else None, limit=min_ratio)


def _gb(mb_s: Optional[float]) -> str:
    return "-" if mb_s is None else f"{mb_s / 1000:.3f}"
