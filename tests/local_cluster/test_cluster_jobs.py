"""Jobs on the local two-node cluster: placement, arrays, requeue, and the validation payloads, each submitted
by the cluster's user (ec2-user), as on ParallelCluster."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from cluster_checks.results import COLLECTIVES, bus_factor
from local_cluster.client import CLUSTER_USER, give_to, hostnames

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.any_cluster]


@pytest.fixture
def folder(slurm_cluster):
    """A folder of the cluster's user that the nodes and this process see at the same path (pytest's
    temporary folders are root's alone)."""
    folder = slurm_cluster.fsx / "tests/cluster_jobs" / uuid.uuid4().hex[:8]
    folder.mkdir(parents=True)
    give_to(CLUSTER_USER, folder)
    yield folder
    shutil.rmtree(folder)


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + body)
    return path


def test_two_node_smoke_test_lands_one_task_per_node(slurm_cluster):
    job = slurm_cluster.sbatch("jobs/test_2nodes.sh", user=CLUSTER_USER)  # as make demo submits it
    assert slurm_cluster.wait(job, timeout=90) == ("COMPLETED", 0)
    log = (slurm_cluster.fsx / "logs" / "validation" / f"test-2nodes_{job}.out").read_text()
    hosts = sorted(line.split()[-1] for line in log.splitlines() if line.startswith("task "))
    (record,) = slurm_cluster.jobs(job)
    assert hosts == hostnames(record["NodeList"]) and len(hosts) == 2, (hosts, record["NodeList"])
    assert log.count("GPUs: none (nvidia-smi not found)") == 2
    assert "OK: 2 distinct hosts" in log


def test_job_array_runs_every_index(slurm_cluster, folder):
    script = write_script(folder / "array.sh", 'echo "$SLURM_ARRAY_TASK_ID $(hostname)" > "$1/task_$SLURM_ARRAY_TASK_ID"\n')
    job = slurm_cluster.sbatch(script, str(folder), user=CLUSTER_USER,
                               options=["--array=0-3", "--job-name=array", f"--output={folder}/%x_%A_%a.out"])
    assert slurm_cluster.wait(job, timeout=90) == ("COMPLETED", 0)
    indices = sorted(int(p.read_text().split()[0]) for p in folder.glob("task_*"))
    assert indices == [0, 1, 2, 3]
    assert len(list(folder.glob(f"array_{job}_*.out"))) == 4
    ran_on = {host for record in slurm_cluster.jobs(job) for host in hostnames(record["NodeList"])}
    assert {p.read_text().split()[1] for p in folder.glob("task_*")} <= ran_on


def test_requeue_reruns_the_job_with_incremented_restart_count(slurm_cluster, folder):
    # The first run waits to be requeued (by the operator, root); the second finishes at once.
    script = write_script(folder / "requeue.sh", """
echo "run restart_count=${SLURM_RESTART_COUNT:-0}"
if [[ ${SLURM_RESTART_COUNT:-0} == 0 ]]; then
  touch "$1/first_run_started"
  sleep 120
fi
""")
    out = folder / "requeue.out"
    job = slurm_cluster.sbatch(script, str(folder), user=CLUSTER_USER,
                               options=["--requeue", "--open-mode=append", f"--output={out}"])
    deadline = time.monotonic() + 60
    while not (folder / "first_run_started").exists():
        assert time.monotonic() < deadline, "first run never started"
        time.sleep(0.5)
    subprocess.run(["scontrol", "requeue", job], check=True)
    assert slurm_cluster.wait(job, timeout=120) == ("COMPLETED", 0)
    assert [line for line in out.read_text().splitlines() if line.startswith("run ")] == [
        "run restart_count=0", "run restart_count=1"]
    assert slurm_cluster.jobs(job)[0]["Restarts"] == "1"


def test_collective_benchmark_across_both_nodes(slurm_cluster):
    job = slurm_cluster.sbatch("jobs/collectives.sh", "--max-bytes", "64K", "--iters", "3", user=CLUSTER_USER)
    out_dir = slurm_cluster.fsx / "logs/validation" / f"collectives_{job}"  # its default, the cluster user's
    state = slurm_cluster.wait(job, timeout=180)
    log = (slurm_cluster.fsx / "logs" / "validation" / f"collectives_{job}.out").read_text()
    assert state == ("COMPLETED", 0), log[-3000:]

    meta = json.loads((out_dir / "results.json").read_text())
    (record,) = slurm_cluster.jobs(job)
    nodes = hostnames(record["NodeList"])
    assert meta["world_size"] == 4 and meta["nodes"] == nodes and len(nodes) == 2 and meta["backend"] == "gloo"
    rows = meta["results"]
    assert sorted({r["collective"] for r in rows}) == sorted(COLLECTIVES)
    for r in rows:
        # Every rank checked its result against the exact expected values (reduce: only the root has one).
        assert r["correct"], r
        assert r["ranks_checked"] == (1 if r["collective"] == "reduce" else 4), r
        assert r["time_us"] > 0 and r["algbw_gbps"] > 0 and r["busbw_gbps"] > 0, r
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bus_factor(r["collective"], 4))
    assert (out_dir / "busbw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out_dir / "results.csv").read_text().count("\n") == len(rows) + 1
    assert f"gloo: 4 ranks on 2 node(s) ({', '.join(nodes)})" in log
