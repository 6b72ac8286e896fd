"""One result row per (collective, message size), shared by the torch benchmark and the nccl-tests parser.

Sizes and bandwidths follow nccl-tests (its PERFORMANCE.md): ``size_bytes`` is the larger of a
rank's input and output buffers (the full gathered buffer for all_gather, the full input for
reduce_scatter, the whole per-rank buffer for all_to_all), algorithm bandwidth is size / time and
bus bandwidth scales it by how much data each rank must move over the slowest link, so the
figure is comparable with the hardware's link speed whatever the number of ranks.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "all_to_all")


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor for ``collective`` over ``world_size`` ranks."""
    n = world_size
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")


@dataclass(frozen=True)
class Row:
    collective: str
    size_bytes: int
    count: int  # elements in the size_bytes buffer
    dtype: str
    world_size: int
    time_us: float  # per operation, slowest rank
    algbw_gbps: float  # GB/s, 1 GB = 1e9 bytes as in nccl-tests
    busbw_gbps: float
    correct: bool  # every checked rank got the expected result
    ranks_checked: int
    method: str  # "native", or how the collective was emulated when the backend lacks it
    backend: str

    @classmethod
    def measured(cls, collective: str, size_bytes: int, count: int, dtype: str, world_size: int,
                 seconds: float, correct: bool, ranks_checked: int, method: str, backend: str) -> Row:
        algbw = size_bytes / seconds / 1e9
        return cls(collective, size_bytes, count, dtype, world_size, seconds * 1e6, algbw,
                   algbw * bus_factor(collective, world_size), correct, ranks_checked, method, backend)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} GiB"


def format_table(rows: list[Row]) -> str:
    header = (f"{'collective':<15}{'size':>10}{'time (us)':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}"
              f"{'check':>14}  method")
    lines = [header, "-" * len(header)]
    for r in rows:
        check = f"{'ok' if r.correct else 'WRONG'} {r.ranks_checked}/{r.world_size}"
        lines.append(f"{r.collective:<15}{human_bytes(r.size_bytes):>10}{r.time_us:>12.1f}"
                     f"{r.algbw_gbps:>12.3f}{r.busbw_gbps:>12.3f}{check:>14}  {r.method}")
    return "\n".join(lines)


def write_csv(rows: list[Row], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[fl.name for fl in fields(Row)])
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


def write_json(rows: list[Row], path: Path, **meta) -> None:
    path.write_text(json.dumps({**meta, "results": [asdict(r) for r in rows]}, indent=2) + "\n")


def read_json(path: Path) -> tuple[dict, list[Row]]:
    data = json.loads(path.read_text())
    rows = [Row(**r) for r in data.pop("results")]
    return data, rows


def write_all(rows: list[Row], out_dir: Path, title: str, **meta) -> dict[str, Path]:
    """Write results.csv, results.json and busbw.png into ``out_dir``; return their paths."""
    from cluster_checks.plot import plot_bus_bandwidth  # matplotlib only when writing files

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / "results.csv", "json": out_dir / "results.json", "plot": out_dir / "busbw.png"}
    write_csv(rows, paths["csv"])
    write_json(rows, paths["json"], title=title, **meta)
    plot_bus_bandwidth(rows, paths["plot"], title)
    return paths
