"""False evictions: the eviction drill's run with nothing slowed, repeated on the local Slurm cluster.

    local_cluster/cluster.sh up && .venv/bin/python -m benchmarks.false_eviction [--runs 10] [--out FILE]

The eviction drill's run (drill.py: tiny preset, 2 ranks on each of 2 of the 3 nodes, 40 steps logged every 2,
eviction on, a straggler at 400 % over the other node in 2 of the last 5 intervals), with no node slowed.
Per run: the slowest node's excess over the other (its ranks' median) at every log interval, how many
intervals were over the margin, the most intervals of a window of 5 one node was over it (the rule needs 2), the
straggler reports and evictions, and the run's losses. The target is none reported and none evicted
in every run; the headroom is that count against the 2 intervals. Exit 0 on that, 1 if any
run reported a straggler, evicted a node or did not complete. Writes JSON (default
benchmarks/results/false_eviction.json); the eviction test's uninterrupted reference is this
benchmark at ``--runs 1`` (its smoke test in `make test`).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "jobs")]

from benchmarks.false_eviction.drill import INTERVAL, INTERVALS, MARGIN, RANKS, RUN, STEPS, WINDOW  # noqa: E402
from cli import ArgumentParser, fail  # noqa: E402
from local_cluster import demo_data  # noqa: E402
from local_cluster.client import LocalCluster  # noqa: E402
from local_cluster.training_job import TrainingJob, release_node  # noqa: E402


def most_in_window(intervals: list[dict], margin_pct: float, window: int) -> int:
    """The most log intervals of any ``window`` in a row that one node was the slowest and over the margin
    (what the rule counts: a report needs INTERVALS of them)."""
    most = 0
    for end in range(len(intervals)):
        seen = intervals[max(0, end - window + 1):end + 1]
        nodes = [r.get("slowest_node", r["slowest_rank"]) for r in seen if r["slowest_excess_pct"] > margin_pct]
        most = max([most] + [nodes.count(n) for n in set(nodes)])
    return most


def summarize(job: TrainingJob, state: tuple[str, int]) -> dict:
    """One run, from Slurm's record and the run's metrics."""
    records = job.records()
    intervals = [r for r in records if "slowest_excess_pct" in r]
    excess = [r["slowest_excess_pct"] for r in intervals]
    return {
        "job": job.id, "state": state[0], "exit_code": state[1], "restarts": int(job.record().get("Restarts", 0)),
        "world_size": max((r["world_size"] for r in records if r.get("event") == "start"), default=0),
        "intervals": len(intervals),
        "excess_pct_median": round(statistics.median(excess), 1) if excess else None,
        "excess_pct_max": round(max(excess), 1) if excess else None,
        "intervals_over_margin": sum(e > 100 * MARGIN for e in excess),
        "most_in_window": most_in_window(intervals, 100 * MARGIN, WINDOW),
        "stragglers": [r for r in records if r.get("event") == "straggler"],
        "evictions": [r for r in records if r.get("event") == "evict"],
        "losses": {str(step): list(value) for step, value in sorted(job.losses().items())},
    }


def run_once(cluster: LocalCluster, name: str) -> dict:
    job = TrainingJob(cluster, name).submit(*RUN, **RANKS)
    run = summarize(job, job.wait())
    for eviction in run["evictions"]:  # a healthy node drained: the operator's release, so the next run has its spare
        release_node(cluster, eviction["node"], "false eviction")
    return run


def clean(run: dict) -> bool:
    return (run["state"], run["exit_code"], run["restarts"]) == ("COMPLETED", 0, 0) \
        and not run["stragglers"] and not run["evictions"]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.false_eviction", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="unslowed runs of the drill (default 10)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/false_eviction.json")
    args = parser.parse_args(argv)
    cluster = LocalCluster()
    if not cluster.is_up():
        return fail("the local cluster is not up", "run `local_cluster/cluster.sh up` first")
    demo_data.build(cluster.fsx / "data/tokenized/sample")
    runs = []
    for i in range(args.runs):
        run = run_once(cluster, f"no-limit-{i + 1}")
        runs.append(run)
        print(f"run {i + 1}/{args.runs} (job {run['job']}): {run['state']}, {run['intervals']} intervals, "
              f"the slowest node {run['excess_pct_median']} % over the other in the median interval "
              f"(max {run['excess_pct_max']} %), "
              f"{run['intervals_over_margin']} over {100 * MARGIN:.0f} %, at most {run['most_in_window']} of "
              f"{WINDOW} in a row over (a report needs {INTERVALS}); {len(run['stragglers'])} straggler report(s), "
              f"{len(run['evictions'])} eviction(s)",
              flush=True)
    total = {"runs": len(runs), "steps": STEPS * len(runs), "intervals": sum(r["intervals"] for r in runs),
             "intervals_over_margin": sum(r["intervals_over_margin"] for r in runs),
             "most_in_window": max(r["most_in_window"] for r in runs),
             "excess_pct_max": max(r["excess_pct_max"] or 0 for r in runs),
             "stragglers": sum(len(r["stragglers"]) for r in runs), "evictions": sum(len(r["evictions"]) for r in runs),
             "clean_runs": sum(clean(r) for r in runs)}
    result = {"settings": {"steps": STEPS, "log_interval": INTERVAL, "margin_pct": 100 * MARGIN,
                           "intervals": INTERVALS, "window": WINDOW, "nodes": 2,
                           "ranks_per_node": int(RANKS["NPROC_PER_NODE"])}, "total": total, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{total['runs']} runs, {total['intervals']} log intervals with nothing slowed: {total['intervals_over_margin']} "
          f"over the margin, at most {total['most_in_window']} in a window of {WINDOW} (a report needs {INTERVALS}), "
          f"max {total['excess_pct_max']} %; {total['stragglers']} straggler report(s), {total['evictions']} eviction(s)")
    return 0 if total["clean_runs"] == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
