"""Loss curve PNG from a run's metrics.jsonl; restarts (resumed runs) are marked.

    python -m training.plot /fsx/logs/model1/metrics.jsonl --out /fsx/logs/model1/loss.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from cli import ArgumentParser, fail  # noqa: E402


def plot(metrics: str | Path, out: str | Path, title: str = "") -> Path:
    records = [json.loads(line) for line in Path(metrics).read_text().splitlines() if line.strip()]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}  # a rerun step overwrites its twin
    if not losses:
        raise ValueError(f"{metrics}: no loss records yet — plot once training has logged a step")
    resumes = [r["step"] for r in records if r.get("event") == "start" and r.get("resumed")]
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = sorted(losses)
    ax.plot(steps, [losses[s] for s in steps], marker=".", label="training loss")
    for i, step in enumerate(resumes):
        ax.axvline(step, color="tab:red", linestyle="--", label="resumed from checkpoint" if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title or str(metrics))
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.plot", description=__doc__.splitlines()[0])
    parser.add_argument("metrics")
    parser.add_argument("--out", required=True)
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    try:
        print(plot(args.metrics, args.out, args.title))
    except OSError as exc:
        return fail(exc, "pass the metrics.jsonl of a run (<log.dir>/metrics.jsonl)")
    except ValueError as exc:
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
