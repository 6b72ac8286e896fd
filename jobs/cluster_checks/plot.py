"""Bus bandwidth vs message size, one line per collective (PNG, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from cluster_checks.results import Row, human_bytes  # noqa: E402


def plot_bus_bandwidth(rows: list[Row], path: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 5))
    for collective in dict.fromkeys(r.collective for r in rows):
        series = sorted((r for r in rows if r.collective == collective), key=lambda r: r.size_bytes)
        emulated = any(r.method != "native" for r in series)
        ax.plot([r.size_bytes for r in series], [r.busbw_gbps for r in series],
                marker="o", linestyle="--" if emulated else "-",
                label=f"{collective} (emulated)" if emulated else collective)
    sizes = sorted({r.size_bytes for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [human_bytes(s) for s in sizes], rotation=45, ha="right")
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
