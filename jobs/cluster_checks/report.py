"""A collective benchmark's report: the table printed to the log, and results.csv, results.json and
busbw.png written beside it. Data (``results``) and drawing (``plot``) come from their own modules."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, fields
from pathlib import Path

from cluster_checks.plot import plot_bus_bandwidth
from cluster_checks.results import Row, human_bytes


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


def write_all(rows: list[Row], out_dir: Path, title: str, **meta) -> dict[str, Path]:
    """Write results.csv, results.json and busbw.png into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / "results.csv", "json": out_dir / "results.json", "plot": out_dir / "busbw.png"}
    write_csv(rows, paths["csv"])
    write_json(rows, paths["json"], title=title, **meta)
    plot_bus_bandwidth(rows, paths["plot"], title)
    return paths
