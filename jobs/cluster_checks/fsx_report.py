"""The FSx performance summary: one row per mount, compared with its provisioned throughput.

Provisioned throughput is capacity (TiB) x throughput per unit (MB/s/TiB), which the cluster's
settings define (``cluster_config``: ``storage.<fs>.throughput_mb_s``). The job does not read those
settings (they are not shipped with the payloads); the submitter passes them as
``FSX_EXPECTED_MB_S="/fsx/data=146,/fsx/logs=146"``. Without it the report says it did not compare.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Optional

DEFAULT_MIN_RATIO = 0.8

# Status of one mount, most severe last (the job's exit code follows the worst one).
OK, NOT_COMPARED, BELOW, MISSING, FAILED = "ok", "not compared", "BELOW", "missing", "failed"


@dataclass
class MountResult:
    mount: str
    fs_type: str = ""
    tool: str = ""
    write_mb_s: Optional[float] = None
    read_mb_s: Optional[float] = None
    creates_per_s: Optional[float] = None
    stats_per_s: Optional[float] = None
    removes_per_s: Optional[float] = None
    provisioned_mb_s: Optional[float] = None
    write_ratio: Optional[float] = None
    read_ratio: Optional[float] = None
    status: str = NOT_COMPARED
    notes: list[str] = field(default_factory=list)


def parse_expectations(spec: str) -> dict[str, float]:
    """``"/fsx/data=7031,/fsx/logs=2343"`` (commas or spaces) -> {mount: MB/s}."""
    expected: dict[str, float] = {}
    for item in spec.replace(",", " ").split():
        mount, sep, value = item.partition("=")
        try:
            mb_s = float(value) if sep else -1.0
        except ValueError:
            mb_s = -1.0
        if not mount.startswith("/") or mb_s <= 0:
            raise ValueError(f"FSX_EXPECTED_MB_S: {item!r} is not MOUNT=MB/s; write e.g. "
                             "/fsx/data=146.5,/fsx/checkpoints=146.5 (capacity TiB x MB/s per TiB)")
        expected[mount.rstrip("/") or "/"] = mb_s
    return expected


def assess(result: MountResult, provisioned_mb_s: Optional[float], min_ratio: float) -> MountResult:
    """Fill in ratios to the provisioned throughput and the status (unless missing or failed)."""
    if result.status in (MISSING, FAILED):
        return result
    if provisioned_mb_s is None:
        result.status = NOT_COMPARED
        return result
    result.provisioned_mb_s = provisioned_mb_s
    if result.write_mb_s is not None:
        result.write_ratio = result.write_mb_s / provisioned_mb_s
    if result.read_mb_s is not None:
        result.read_ratio = result.read_mb_s / provisioned_mb_s
    ratios = [r for r in (result.write_ratio, result.read_ratio) if r is not None]
    result.status = BELOW if ratios and min(ratios) < min_ratio else OK
    if result.status == BELOW:
        result.notes.append(
            f"below {min_ratio:.0%} of the provisioned {provisioned_mb_s:,.0f} MB/s: check the clients "
            "first (more nodes or tasks per node raise the offered load), then FSx CloudWatch "
            "metrics (DataReadBytes/DataWriteBytes) and the throughput setting")
    return result


def exit_code(results: list[MountResult]) -> int:
    """docs/cli.md: 0 every mount measured and not below threshold; 1 some mount below or its measurement
    failed (the check did not pass); 2 a mount that does not exist, or none given (bad input)."""
    statuses = {r.status for r in results}
    if MISSING in statuses or not results:
        return 2
    return 1 if statuses & {BELOW, FAILED} else 0


def _fmt(value: Optional[float], scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value / scale:,.{digits}f}"


def render_table(results: list[MountResult], header: str = "") -> str:
    columns = ["mount", "fs", "tool", "write GB/s", "read GB/s", "creates/s", "stats/s", "removes/s",
               "prov. GB/s", "write/prov", "read/prov", "status"]
    rows = [[r.mount, r.fs_type or "-", r.tool or "-", _fmt(r.write_mb_s, 1000, 3), _fmt(r.read_mb_s, 1000, 3),
             _fmt(r.creates_per_s, digits=0), _fmt(r.stats_per_s, digits=0), _fmt(r.removes_per_s, digits=0),
             _fmt(r.provisioned_mb_s, 1000, 3), _fmt(r.write_ratio), _fmt(r.read_ratio), r.status]
            for r in results]
    widths = [max(len(str(cell)) for cell in column) for column in zip(columns, *rows)]
    lines = [header] if header else []
    for row in [columns, *rows]:
        lines.append("  ".join(cell.ljust(w) if i in (0, 1, 2, len(row) - 1) else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    for r in results:
        lines.extend(f"  {r.mount}: {note}" for note in r.notes)
    return "\n".join(lines) + "\n"


def to_json(results: list[MountResult], **context) -> str:
    return json.dumps({**context, "mounts": [asdict(r) for r in results]}, indent=2) + "\n"
