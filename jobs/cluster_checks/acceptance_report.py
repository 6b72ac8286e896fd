"""The acceptance report as people read it: ``report.txt`` (the table), ``report.png`` (one bar per
check) and ``report.json`` beside them, from a ``verdict.Report``."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from cluster_checks.verdict import FAIL, NOT_MEASURED, PASS, Report  # noqa: E402


def render_table(report: Report) -> str:
    blocking = report.blocking()
    target = "GPU cluster" if report.gpu else "CPU cluster: checks that need a GPU may be not measured"
    head = f"acceptance: {report.verdict.upper()} ({target})"
    if blocking:
        head += f": {len(blocking)} of {len(report.checks)} checks block it"
    columns = ["status", "check", "measured", "expected"]
    rows = [[c.status, c.name, c.measured or "-", c.expected] for c in report.checks]
    widths = [max(len(cell) for cell in column) for column in zip(columns, *rows)]
    lines = [head, ""]
    for row in [columns, *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    # The reasons under the table: what failed first (with what to do), then what did not run.
    notes = [c for c in report.checks if c.status == FAIL] + [c for c in report.checks if c.status == NOT_MEASURED]
    if notes:
        lines.append("")
        lines.extend(f"{c.status}: {c.name}: {c.why}" for c in notes)
    lines.append("")
    lines.append("sources:")
    lines.extend(f"  {source}" for source in dict.fromkeys(c.source for c in report.checks if c.source))
    return "\n".join(lines) + "\n"


def plot_report(report: Report, path: Path) -> None:
    """One horizontal bar per check: measured / expected, coloured by status, a tick where it passes."""
    colours = {PASS: "tab:green", FAIL: "tab:red", NOT_MEASURED: "tab:gray"}
    checks = report.checks[::-1]  # first check on top
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.32 * max(len(checks), 1)))
    for y, c in enumerate(checks):
        numeric = c.ratio is not None and math.isfinite(c.ratio)
        # Checks without a number (pass/fail facts) get a full-length hatched bar in their colour.
        width = max(min(c.ratio, 2.0), 0.02) if numeric else 1.0  # a failing 0.001 stays visible
        ax.barh(y, width, color=colours.get(c.status, "black"), alpha=0.85 if numeric else 0.35,
                hatch=None if numeric else "//", edgecolor="black", linewidth=0.3)
        if c.limit is not None:
            ax.plot([c.limit, c.limit], [y - 0.4, y + 0.4], color="black", linewidth=1.5)
        label = (f"{c.ratio:.2f}" + (f" (limit {c.limit:.2f})" if c.limit is not None else "")) if numeric \
            else c.status
        ax.text(width + 0.02, y, label, va="center", fontsize=7)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(checks)), [c.name for c in checks], fontsize=7)
    ax.set_xlim(0, 2.3)
    ax.set_xlabel("measured / expected (black tick: pass limit; hatched: no number, status only)")
    ax.set_title(f"acceptance: {report.verdict.upper()} "
                 f"({'GPU' if report.gpu else 'CPU'} cluster, {len(report.blocking())} blocking)")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(report: Report, out_dir: Path) -> dict[str, Path]:
    """report.json, report.txt and report.png in ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "table": out_dir / "report.txt", "plot": out_dir / "report.png"}
    paths["json"].write_text(report.to_json())
    paths["table"].write_text(render_table(report))
    plot_report(report, paths["plot"])
    return paths
