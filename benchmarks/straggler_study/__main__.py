"""The seeded straggler study (study.py): the trainer's rule against a whole slow node, an intermittent one, a
starved loader and a slow link at model7's size, and 14 days of healthy noise, fitted to the H200 probe.

    .venv/bin/python -m benchmarks.straggler_study [--runs 200] [--days 14] [--seed 1] [--out FILE] [--figures]

Prints the table and writes it as Markdown beside the JSON (default benchmarks/results/straggler_study.json
and .md). The plan (`python -m cluster_config plan`) takes the detection time and false evictions from
cluster_config/straggler_study.json, these defaults' figures; ``--figures`` rewrites that file (after
changing the rule or the noise), and tests/training/test_straggler_study.py fails while it differs.
Pure Python and numpy, seconds. Exit 1 when a fault misses its target in more than 5 % of the runs,
anything is named falsely, or a healthy node is evicted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "jobs")]

from benchmarks.straggler_study.study import Study, table  # noqa: E402
from cli import ArgumentParser  # noqa: E402

FIGURES = REPO / "cluster_config" / "straggler_study.json"


def figures(result: dict) -> dict:
    """What the plan takes from the study (cluster_config/straggler_study.json)."""
    h = result["healthy"]
    return {"setup": result["setup"],
            "detection_intervals": {name: {k: r[k] for k in ("runs", "within_target", "target", "missed", "median",
                                                             "p95", "false_alarms")}
                                    for name, r in result["faults"].items()},
            "healthy": {k: h[k] for k in ("days", "intervals", "node_days", "saves", "hiccups", "false_evictions")}}


def passed(result: dict) -> bool:
    return all(r["within_target"] >= 0.95 * r["runs"] and not r["false_alarms"] for r in result["faults"].values()) \
        and not result["healthy"]["false_evictions"]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.straggler_study", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=Study.runs, help="runs per fault")
    parser.add_argument("--days", type=float, default=Study.days, help="days of healthy intervals")
    parser.add_argument("--seed", type=int, default=Study.seed)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/straggler_study.json")
    parser.add_argument("--figures", action="store_true", help=f"rewrite {FIGURES.relative_to(REPO)} (the plan's)")
    args = parser.parse_args(argv)
    result = Study(runs=args.runs, days=args.days, seed=args.seed).run()
    text = table(result)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(text + "\n")
    if args.figures:
        FIGURES.write_text(json.dumps(figures(result), indent=1) + "\n")
        print(f"wrote {FIGURES.relative_to(REPO)}")
    return 0 if passed(result) else 1


if __name__ == "__main__":
    sys.exit(main())
