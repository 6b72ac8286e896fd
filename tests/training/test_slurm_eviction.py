"""Straggler eviction on the real local Slurm cluster (3 nodes, 2 per job with 2 ranks on each, one spare):
both ranks of one node get 10 % of a CPU each mid-run (one cgroup CPU quota over the two,
local_cluster/cpu_limit.py); the trainer names the node by its ranks' median with its cause, saves, and the
node's first rank reports it; the root epilog drains it with the evidence into the failure history; the job
requeues itself onto the spare and completes with every loss bit-identical to an uninterrupted run's
(train.deterministic: DDP on 4 ranks reduces each parameter alone, benchmarks/false_eviction/drill.py).

The uninterrupted run is `python -m benchmarks.false_eviction --runs 1` (its smoke test): the same
settings with nothing slowed, which must report and evict nothing; `make bench` repeats it 10 times.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.false_eviction.drill import INTERVAL, INTERVALS, MARGIN, RANKS, RUN, STEPS
from local_cluster.cpu_limit import CpuLimit
from local_cluster.training_job import release_node

pytestmark = [pytest.mark.slurm, pytest.mark.any_cluster, pytest.mark.drill]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference(training_jobs, tmp_path_factory) -> dict[int, tuple[float, int]]:
    """The same run, nothing slowed (the false-eviction benchmark, once): it completes on its first start,
    reports no straggler and evicts nothing."""
    out = tmp_path_factory.mktemp("false_eviction") / "false_eviction.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.false_eviction", "--runs", "1", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    [run] = result["runs"]
    assert proc.returncode == 0 and result["total"]["clean_runs"] == 1, (proc.stdout[-2000:], run)
    assert (run["state"], run["restarts"], run["stragglers"], run["evictions"]) == ("COMPLETED", 0, [], [])
    assert run["world_size"] == 2 * int(RANKS["NPROC_PER_NODE"])  # 2 nodes x 2 ranks, as the drill's
    assert run["intervals"] == STEPS // INTERVAL and run["most_in_window"] < INTERVALS
    assert 0 <= run["excess_pct_median"] <= run["excess_pct_max"]
    losses = {int(step): tuple(value) for step, value in run["losses"].items()}
    assert sorted(losses) == list(range(INTERVAL, STEPS + 1, INTERVAL))
    print(proc.stdout.strip().splitlines()[-1])
    return losses


def scontrol_node(node: str) -> str:
    return subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True).stdout


def test_a_slowed_node_is_evicted_drained_and_the_run_completes_on_the_spare_exactly(training_jobs, reference):
    cluster = training_jobs.cluster
    job = training_jobs.submit("evict", *RUN, **RANKS)
    job.wait_for_step(6)  # past start-up on both nodes
    slow = job.nodes()[-1]
    pids = job.worker_pids(node=slow)
    assert len(pids) == 2, job.output()[-3000:]  # both of the node's ranks, slowed together
    history = cluster.fsx / "logs/node-health/history.tsv"
    try:
        with CpuLimit(pids, 0.2) as limit:  # 10 % of a CPU for each rank
            print(f"slowed {slow}: {limit.how}")
            job.wait_until("an eviction", lambda rs: any(r.get("event") == "evict" for r in rs), timeout=240)
        assert job.wait() == ("COMPLETED", 0), job.output()[-4000:]
        assert int(job.record()["Restarts"]) == 1

        [straggler] = job.events("straggler")
        [evict] = job.events("evict")
        assert straggler["node"] == slow and evict["node"] == slow and evict["step"] == straggler["step"]
        rank, step = straggler["rank"], straggler["step"]
        assert straggler["excess_pct"] > 100 * MARGIN and straggler["intervals"] == INTERVALS
        assert straggler["scope"] == "node" and rank % 2 == 0  # judged as a node; its first rank reports it
        assert straggler["cause"] in ("gpu", "host") and evict["cause"] == straggler["cause"]  # CPU ranks: either probe
        # Saved at that step, then requeued (counted: a recovery), resumed from it on the spare.
        [recovery] = job.events("recovery")
        assert recovery["action"] == "requeue" and recovery["cause"].startswith(f"straggler: rank {rank} on {slow} ")
        assert f"saved step {step}, evicting the node" in recovery["cause"]
        starts = job.events("start")
        assert [(s["step"], s["resumed"], s["world_size"]) for s in starts] == [(0, False, 4), (step, True, 4)]
        last = job.events("launch")[-1]
        moved_to = subprocess.run(["scontrol", "show", "hostnames", last["nodes"]], capture_output=True,
                                  text=True).stdout.split()
        assert slow not in moved_to and len(moved_to) == 2
        # The epilog drained it with the job's evidence, and the failure history has it.
        node = scontrol_node(slow)
        reason = f"job {job.id}: straggler: rank {rank} on {slow} "
        assert "DRAIN" in node and reason in node, node
        drained = subprocess.run(["sinfo", "-R", "-h", "-o", "%n|%E"], capture_output=True, text=True).stdout
        assert any(line.startswith(f"{slow}|{reason}") for line in drained.splitlines()), drained
        lines = [line.split("\t") for line in history.read_text().splitlines()]
        assert any(f[1] == slow and f[3] == "drain" and f[4] == job.id and f[5].startswith(reason) for f in lines), lines
        # Every loss, before the eviction and after the resume, as the uninterrupted run's, bit for bit.
        losses = job.losses()
        assert losses == reference and max(losses) == STEPS and any(s > step for s in losses)
        print(f"evicted {slow} (rank {rank}) at step {step}: {straggler['cause']} {straggler['excess_pct']} % "
              f"over the other node in {straggler['intervals']} of {straggler['window']} intervals; drained: {reason}...; "
              f"resumed on {','.join(moved_to)}; "
              f"{len(losses)} logged losses equal the reference, {len([s for s in losses if s > step])} after the eviction")
    finally:
        release_node(cluster, slow, "test cleanup")  # the operator's release: back into service
