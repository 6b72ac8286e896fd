"""Self-healing on the real local Slurm cluster (3 nodes, 2 per job): real faults, no resubmission.

The requeue path: the jobs here have no in-job relaunches (MAX_RELAUNCHES=0) unless a test says otherwise,
so a failure requeues the job as it does once the relaunches are spent or no spare node is left
(test_slurm_relaunch.py: the relaunch inside the job). Every recovered run is compared with an
uninterrupted one, loss and samples of every step, bit for bit.
Runs are short (tiny preset, 18 steps, a checkpoint every 6) because CI has two cores.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from local_cluster.training_job import TrainingJob, continue_stopped, release_node
from local_cluster import demo_data

pytestmark = [pytest.mark.slurm, pytest.mark.any_cluster]
REPO = Path(__file__).resolve().parents[2]

STEPS, EVERY = 18, 6
RUN = (f"train.steps={STEPS}", f"checkpoint.every={EVERY}", "log.interval=1", "optim.warmup_steps=3")
# Seconds: the watchdog's floor (its window is max(floor, 10 x median step); a tiny step is ~0.1 s).
WATCHDOG_FLOOR_S = 8
WATCHDOG = (f"train.watchdog_floor_s={WATCHDOG_FLOOR_S}",)


SUBMITTED: list[TrainingJob] = []  # cancelled at the end of the module, so a failed test leaves no job behind


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    demo_data.build(slurm_cluster.fsx / "data/tokenized/sample")
    yield slurm_cluster
    subprocess.run(["scancel", *[j.id for j in SUBMITTED if j.id]], check=False)


def submit(cluster, name: str, *overrides: str, options: tuple[str, ...] = (), **env: str) -> TrainingJob:
    job = TrainingJob(cluster, name)
    SUBMITTED.append(job)
    return job.submit(*RUN, *WATCHDOG, *overrides, options=options, **{"MAX_RELAUNCHES": "0", **env})


@pytest.fixture(scope="module")
def reference(cluster) -> dict[int, tuple[float, int]]:
    job = submit(cluster, "reference")
    assert job.wait() == ("COMPLETED", 0), job.output()[-4000:]
    losses = job.losses()
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def recovered(job: TrainingJob, reference) -> list[dict]:
    """The job completed by itself, requeued (never resubmitted), with the uninterrupted run's losses."""
    state = job.wait()
    assert state == ("COMPLETED", 0), job.output()[-4000:]
    assert int(job.record()["Restarts"]) >= 1
    assert job.losses() == reference
    launches = job.events("launch")
    assert {e["job"] for e in launches} == {job.id} and [e["restart_count"] for e in launches] == list(range(len(launches)))
    # gloo bound to the interface of the node's own address (jobs/env.sh), as NCCL's is on GPU nodes.
    assert {e["gloo_socket_ifname"] for e in launches} == {"eth0"}
    return job.events("recovery")


def repeated_steps(job: TrainingJob) -> int:
    steps = [r["step"] for r in job.records() if "loss" in r]
    return len(steps) - len(set(steps))


def test_killed_worker_recovers_with_no_resubmission_on_its_first_code(cluster, reference):
    job = TrainingJob(cluster, "sigkill")
    SUBMITTED.append(job)
    bundle = job.host_root / "bundle/jobs"  # the job's own copy of jobs/, as /opt/llm-jobs/bundle on the cluster
    shutil.copytree(REPO / "jobs", bundle, ignore=shutil.ignore_patterns("__pycache__"))
    job.submit(*RUN, *WATCHDOG, JOBS_DIR=f"/fsx/{job.root}/bundle/jobs", MAX_RELAUNCHES="0")
    job.wait_for_step(8)
    # A cluster update rewrites the bundle under the running job: the requeue must not run it.
    (bundle / "training/train.py").write_text('raise SystemExit("the updated code ran")\n')
    job.kill_worker(signal.SIGKILL, node=job.nodes()[-1])  # what an Xid error, an OOM kill or a lost GPU does
    [event] = recovered(job, reference)
    assert "running the snapshot taken at its first start" in job.output()
    assert event["action"] == "requeue" and event["recovery"] == 1
    # Whichever noticed first: torchrun's exit (srun ends the step) or the peer's watchdog (its
    # collective never returns: gloo does not always see a peer vanish).
    assert "srun exit" in event["cause"] or event["cause"].startswith("hang: rank 0"), event["cause"]
    assert repeated_steps(job) <= EVERY  # at most one checkpoint interval


@pytest.mark.drill
def test_stopped_worker_is_caught_by_the_watchdog_with_stacks(cluster, reference):
    # No evaluation: the first one has the start-up window (train.init_timeout_s, it compiles the layers in eval
    # mode), and a loaded machine let step 10's start before the stop landed: the watchdog's floor is the subject.
    job = submit(cluster, "sigstop", "eval.every=0")
    job.wait_for_step(8)
    stopped_at = time.monotonic()
    pid = job.kill_worker(signal.SIGSTOP, node=job.nodes()[-1])  # a rank stuck on storage or in a driver call
    try:
        detected = job.wait_until("hang report", lambda _: list(job.log_dir.glob(f"hang_{job.id}_rank*.txt")), 120)
        job.wait_until("the stopped worker's end", lambda _: not Path(f"/proc/{pid}").exists(), 120)  # Slurm kills it
    finally:
        continue_stopped(pid)
    events = recovered(job, reference)
    assert events[0]["cause"].startswith("hang: rank 0 of job")
    # The waiting rank (rank 0, on the first node) dumped its stacks: it was blocked in a collective of the step.
    report = (job.log_dir / f"hang_{job.id}_rank0.txt").read_text()
    assert "no training step completed" in report and "Thread" in report and "train.py" in report
    assert (job.log_dir / f"fr_trace_{job.id}_rank0.pkl").stat().st_size > 0  # gloo's flight recorder
    assert detected - stopped_at < WATCHDOG_FLOOR_S + 10, detected - stopped_at


@pytest.mark.drill
def test_node_failing_its_health_check_is_drained_and_the_run_moves(cluster, reference):
    # In-job relaunches allowed: the nodes' probe runs the health check (HEALTH_CONF, as the prolog), finds this
    # node failing it and, with no spare in the allocation, requeues instead of relaunching on it.
    health_conf = cluster.base / "opt/slurm/etc/llm/health.conf"
    job = submit(cluster, "badnode", MAX_RELAUNCHES="3", HEALTH_CONF=str(health_conf))
    job.wait_for_step(8)
    bad = job.nodes()[-1]
    marker = cluster.fsx / ".node-health" / bad
    marker.parent.mkdir(exist_ok=True)
    marker.write_text("GPU 3 fell off the bus (Xid 79)\n")  # the stand-in check fails on this node from now on
    try:
        job.kill_worker(signal.SIGKILL, node=bad)  # the rank on it died of that
        [event] = recovered(job, reference)
        assert event["action"] == "requeue" and event["not_relaunched"] == "1 healthy nodes in the allocation, training needs 2"
        assert f"node {bad} left out: stand-in check: GPU 3 fell off the bus (Xid 79)" in job.output()
        node = subprocess.run(["scontrol", "show", "node", bad], capture_output=True, text=True).stdout
        assert "DRAIN" in node and "stand-in check: GPU 3 fell off the bus (Xid 79)" in node, node
        last = job.events("launch")[-1]
        assert bad not in subprocess.run(["scontrol", "show", "hostnames", last["nodes"]], capture_output=True,
                                         text=True).stdout.split()
    finally:
        marker.unlink(missing_ok=True)
        # The operator's release: back into service, and this drain no longer counts towards quarantining
        # the node when a later test fails it again.
        release_node(cluster, bad, "test cleanup")


@pytest.mark.drill
def test_crash_loop_stops_after_the_retry_budget(cluster):
    # The budget counts relaunches inside the job too: a rank that always dies ends the job after two of them.
    job = submit(cluster, "crashloop", MAX_RECOVERIES="2", MAX_RELAUNCHES="3")
    for attempt in range(3):  # a rank that always dies: kill it on every (re)start
        job.wait_until(f"start {attempt}", lambda rs: len([r for r in rs if r.get("event") == "start"]) > attempt)
        job.kill_worker(signal.SIGKILL)
    state, code = job.wait()
    assert state == "FAILED" and code != 0
    assert job.record()["Restarts"] == "0"
    assert "retry budget spent: 2 recoveries of job" in job.output()
    assert [e["action"] for e in job.events("recovery")] == ["relaunch", "relaunch", "stop"]
    assert job.events("recovery")[-1]["budget_spent"] is True


def test_config_error_exits_2_and_is_not_requeued(cluster):
    # One node: every rank refuses the config at its start, whatever the allocation (two would start twice as many).
    job = submit(cluster, "configerror", "train.steps=many", options=("--nodes=1",))
    assert job.wait() == ("FAILED", 2)
    assert job.record()["Restarts"] == "0"
    out = job.output()
    assert "train.steps" in out and "not requeued" in out


def test_scancel_leaves_the_workers_time_to_save_and_does_not_requeue(cluster):
    """SIGTERM to every process of the job (scancel, the time limit): the save at the next step boundary
    finishes within KillWait (torchrun waits as long), the job ends CANCELLED and stays ended."""
    job = submit(cluster, "scancel")
    job.wait_for_step(8)
    subprocess.run(["scancel", job.id], check=True)
    state, _ = job.wait()
    assert state == "CANCELLED" and job.record()["Restarts"] == "0"
    stopped = job.events("stopped")
    assert stopped and stopped[0]["signal"] == "SIGTERM", job.output()[-3000:]
    assert (job.checkpoint_dir / "STATUS").read_text() == "stopped\n"
    assert (job.checkpoint_dir / "latest").read_text() == f"step_{stopped[0]['step']:08d}\n"
