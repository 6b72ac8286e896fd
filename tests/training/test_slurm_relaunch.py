"""Recovery inside the running job, on the real local Slurm cluster: a node's workers killed, a node lost.

jobs/train.sh starts the training step again in the same allocation (same job id, no requeue: sacct shows one
job with several steps) on the nodes still healthy, and the run resumes from the latest FSx checkpoint; every
loss it logs, the repeated steps' too, equals an uninterrupted run's, bit for bit. Each test prints the seconds
from the fault to the next completed step and their parts (`pytest -s` shows them):

  detection   the fault -> the training step's end (srun returns)
  probe       -> the decision: the allocation's nodes asked whether they are fit (train.sh: healthy_nodes)
  relaunch    -> the new step's launch event
  start-up    -> the trainer's start: interpreter, imports, rendezvous, the checkpoint read from FSx
  first step  -> the first step of the relaunched run logged
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from local_cluster import demo_data
from local_cluster.client import cluster_name, hostnames, job_folders
from local_cluster.training_job import TINY, TrainingJob, TrainingJobs

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.any_cluster, pytest.mark.drill]

STEPS, EVERY = 18, 3  # a checkpoint every 3 steps: the relaunch redoes at most 2 (the snapshots will redo fewer)
# A learning rate flat after the warm-up (min_lr = lr): the losses of a run do not depend on its length, so the
# reference's GROW_STEPS are every shorter run's too.
RUN = (f"train.steps={STEPS}", f"checkpoint.every={EVERY}", "log.interval=1", "optim.warmup_steps=3",
       "optim.min_lr=3.0e-3", "train.watchdog_floor_s=8")
GROW_STEPS = 40  # the run on one node lasts beyond the look for idle nodes (every 2 s) and the workers' start
FAULT_AFTER = 7  # a step past the step-6 checkpoint
# Snapshots in memory at every step (training/checkpoints/snapshot.py) and no checkpoint on the file system
# before the last step: the relaunch can only resume from memory.
SNAPSHOTS = ("checkpoint.snapshot_every=1", "checkpoint.every=100")


def wait_for_snapshot(job: TrainingJob, step: int, timeout: float = 120) -> None:
    """Until a snapshot of ``step`` or later is whole on every training node (the trainer's ``snapshot`` event:
    each node's memory is its own, out of this host's sight)."""
    deadline = time.monotonic() + timeout
    while not any(e["step"] >= step for e in job.events("snapshot")):
        if time.monotonic() > deadline:
            pytest.fail(f"no whole snapshot of step {step} or later within {timeout} s:\n{job.output()[-3000:]}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def jobs(slurm_cluster):
    demo_data.build(slurm_cluster.fsx / "data/tokenized/sample")
    submitted = TrainingJobs(slurm_cluster)
    yield submitted
    submitted.cancel_all()


@pytest.fixture(scope="module")
def reference(jobs) -> dict[int, tuple[float, int]]:
    """An uninterrupted run on two nodes: step -> (loss, CRC of the samples)."""
    job = jobs.submit("relaunch-reference", *RUN, f"train.steps={GROW_STEPS}")
    assert job.wait() == ("COMPLETED", 0), job.output()[-4000:]
    assert sorted(job.losses()) == list(range(1, GROW_STEPS + 1))
    return job.losses()


def relaunched_in_the_same_job(job: TrainingJob, reference, killed_at: float) -> dict:
    """The job completed in its own allocation after one in-job relaunch, every logged loss the reference's;
    the launch the relaunch made."""
    assert job.wait() == ("COMPLETED", 0), job.output()[-4000:]
    assert job.record()["Restarts"] == "0"  # no requeue
    sacct = [line.split("|") for line in subprocess.run(["sacct", "-j", job.id, "-D", "-n", "-P", "-o", "JobID,State"],
                                                        capture_output=True, text=True, check=True).stdout.splitlines()]
    # One job, never requeued; a node taken out of it (--no-kill) closes a record RESIZING and opens the next.
    runs = [state for job_id, state in sacct if job_id == job.id]
    assert runs[-1] == "COMPLETED" and set(runs[:-1]) <= {"RESIZING"}, sacct  # (a cancelled step: "CANCELLED by <uid>")
    assert len({job_id for job_id, _ in sacct if job_id.split(".")[-1].isdigit()}) >= 2, sacct  # several steps
    launches = job.events("launch")
    assert {e["restart_count"] for e in launches} == {0} and [e.get("relaunch", 0) for e in launches] == [0, 1]
    [recovery] = job.events("recovery")
    assert recovery["action"] == "relaunch" and recovery["relaunch"] == 1 and recovery["job"] == job.id, recovery
    assert "relaunching in the same job (relaunch 1 of 3)" in job.output()
    # Every loss line, those of the steps redone after the resume included, equals the uninterrupted run's.
    logged = [(r["step"], (r["loss"], r["samples_crc"])) for r in job.records() if "loss" in r]
    assert sorted({step for step, _ in logged}) == list(range(1, STEPS + 1))
    assert [(step, value) for step, value in logged if value != reference[step]] == []
    assert len(logged) - STEPS <= EVERY  # redone: at most one checkpoint interval
    print_recovery(job, recovery, launches[1], killed_at)
    return launches[1]


def resumed_from(job: TrainingJob, launch: dict) -> dict:
    """Where the relaunched run's state came from (the trainer's start event), its byte count and seconds left out."""
    start = next(r for r in job.records() if r.get("event") == "start" and r["time"] > launch["time"])
    assert start["step"] >= FAULT_AFTER, start
    return {k: v for k, v in start["resumed_from"].items() if k not in ("step", "bytes_moved", "seconds")}


def print_recovery(job: TrainingJob, recovery: dict, launch: dict, killed_at: float) -> None:
    records = job.records()
    start = next(r for r in records if r.get("event") == "start" and r["time"] > launch["time"])
    step = next(r for r in records if "loss" in r and r["time"] > start["time"])
    marks = [("detection", recovery["step_ended"]), ("probe", recovery["time"]), ("relaunch", launch["time"]),
             ("start-up", start["time"]), (f"first step ({step['step']})", step["time"])]
    parts, previous = [], killed_at
    for name, at in marks:
        parts.append(f"{name} {at - previous:.1f} s")
        previous = at
    print(f"\njob {job.id}: fault -> next completed step {step['time'] - killed_at:.1f} s ({', '.join(parts)})")


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_node_whose_workers_are_killed_trains_again_in_the_same_job(jobs, reference):
    job = jobs.submit("relaunch-kill", *RUN, *SNAPSHOTS)
    job.wait_for_step(FAULT_AFTER)
    wait_for_snapshot(job, FAULT_AFTER)
    node = job.nodes()[-1]
    pids = job.worker_pids(node)
    assert pids
    killed_at = time.time()
    kill(pids)  # every training process of the node: what an Xid error or an OOM kill does to its ranks
    launch = relaunched_in_the_same_job(job, reference, killed_at)
    assert hostnames(launch["nodes"]) == job.nodes()  # both nodes still fit: the same two
    # From the nodes' memory: each rank's own snapshot, on its own node.
    assert resumed_from(job, launch) == {"source": "snapshot", "own_node": 2, "other_node": 0, "saved_world": 2}


def test_a_lost_node_is_replaced_by_the_spare_in_the_same_job(jobs, reference):
    """Three nodes, TRAIN_NODES=2: the third is a hot spare. The second training node is lost as an instance is
    (every process in it killed, its slurmd among them; not the first node, which runs the batch script)."""
    cluster = jobs.cluster
    job = TrainingJob(cluster, "relaunch-spare")
    jobs.submitted.append(job)
    job.host_root.mkdir(parents=True, exist_ok=True)
    # model1's QOS holds its jobs to its 2-node share (a spare inside the allocation needs the share to include
    # it): the 3-node allocation runs under the ops account, as root.
    job.id = cluster.sbatch("jobs/train_model1.sh", *TINY, *RUN, *SNAPSHOTS,
                            env={**job_folders(cluster.fsx, job.root), "OMP_NUM_THREADS": "1", "TRAIN_NODES": "2"},
                            options=["--nodes=3", "--gpus-per-node=0", "--account=ops", "--qos=ops"])
    job.wait_for_step(FAULT_AFTER)
    wait_for_snapshot(job, FAULT_AFTER)
    first, lost, spare = job.nodes()
    assert hostnames(job.events("launch")[0]["nodes"]) == [first, lost]
    netns = f"lc{cluster_name()}-{lost}"  # local_cluster/cluster.sh's netns_of
    try:
        killed_at = time.time()
        kill([int(pid) for pid in subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True,
                                                 check=True).stdout.split()])
        launch = relaunched_in_the_same_job(job, reference, killed_at)
        assert hostnames(launch["nodes"]) == [first, spare]
        assert f"node {lost} left out" in job.output()
        # The survivor's rank from its own memory, the spare's from the copy the survivor keeps of the lost node's.
        assert resumed_from(job, launch) == {"source": "snapshot", "own_node": 1, "other_node": 1, "saved_world": 2}
    finally:
        # Back into service for the tests after this one, as ParallelCluster's replacement would be.
        subprocess.run([str(cluster.repo / "local_cluster/cluster.sh"), "reboot", lost], capture_output=True, timeout=600)


def test_a_lost_node_with_no_spare_goes_on_with_fewer_nodes_then_grows_back_from_memory(jobs, reference):
    """Two nodes, no spare, MIN_TRAIN_NODES=1: the second node lost (as above), the job goes on at once on the
    first, its state resharded from that node's memory (its own snapshot and its copy of the lost node's), the
    global batch kept by two micro-batches a step; once the partition has a node idle for the whole allocation
    again, the workers stop keeping their state in memory (no save to FSx), the job requeues itself onto two nodes
    with the snapshot's node among them, its folder kept by the epilog, and the returning node's rank fetches its
    state over the network. Every loss is the uninterrupted run's. Prints the grow-back's parts."""
    job = jobs.submit("relaunch-fewer", *RUN, *SNAPSHOTS, f"train.steps={GROW_STEPS}", MIN_TRAIN_NODES="1",
                      GROW_CHECK_S="2")
    job.wait_for_step(FAULT_AFTER)
    wait_for_snapshot(job, FAULT_AFTER)
    first, lost = job.nodes()
    rebooted = False
    try:
        killed_at = time.time()
        kill([int(pid) for pid in subprocess.run(["ip", "netns", "pids", f"lc{cluster_name()}-{lost}"],
                                                 capture_output=True, text=True, check=True).stdout.split()])
        deadline = time.monotonic() + 180
        while not [e for e in job.events("recovery") if e.get("fewer_than")]:  # (a probe may still find it up once)
            assert time.monotonic() < deadline, job.output()[-4000:]
            time.sleep(0.5)
        # ParallelCluster's replacement: back in the partition, idle (once: the requeued job may be running there)
        subprocess.run([str(jobs.cluster.repo / "local_cluster/cluster.sh"), "reboot", lost], capture_output=True,
                       timeout=600)
        rebooted = True
        assert job.wait() == ("COMPLETED", 0), job.output()[-4000:]
    finally:
        if not rebooted:
            subprocess.run([str(jobs.cluster.repo / "local_cluster/cluster.sh"), "reboot", lost], capture_output=True,
                           timeout=600)
    records = job.records()
    [fewer] = [e for e in job.events("recovery") if e.get("fewer_than")]
    # The watcher may log its planned stop again while slow-starting workers still ignore the signal; one requeue
    # follows however often (Restarts below).
    grows = [e for e in job.events("recovery") if e["action"] == "grow"]
    assert grows and all(g == {**grows[0], "time": g["time"]} for g in grows), grows
    assert fewer["action"] == "relaunch" and fewer["train_nodes"] == 1 and fewer["fewer_than"] == 2, fewer
    assert "no spare node free: going on with 1 of the 2 nodes in the same job" in job.output()
    assert grows[0]["planned"] and grows[0]["full"] == 2, grows
    starts = [r for r in records if r.get("event") == "start"]
    shrunk = next(s for s in starts if s["time"] > fewer["time"])
    assert shrunk["world_size"] == 1 and shrunk["resumed_from"]["source"] == "snapshot", shrunk
    assert shrunk["resumed_from"]["saved_world"] == 2 and shrunk["resumed_from"]["own_node"] == 1
    # The planned stop kept the state in memory and wrote no checkpoint; the requeued run on both nodes loaded it:
    # the first node's rank from its own memory, the returning node's over the network from the first.
    # (On a loaded machine the shrunk run's relaunch inside the job may itself be stopped for the grow-back before its
    # first step: two stops, each keeping the state in memory; the requeued run loads the later one's.)
    assert job.record()["Restarts"] == "1"  # the grow-back's requeue, planned
    launch = next(e for e in job.events("launch") if e["restart_count"] == 1)
    stops = [e for e in job.events("stopped") if e["time"] < launch["time"]]
    assert stops and all(e.get("kept_in_memory") for e in stops), stops
    stopped = stops[-1]
    assert [d.name for d in job.checkpoint_dir.glob("step_*")] == [f"step_{GROW_STEPS:08d}"]  # the final one only
    # The requeued run's first start (a loaded machine may relaunch it once more inside the job: a later start
    # resumes from a later snapshot, and its losses are checked below with the rest).
    regrown = next(s for s in starts if s["time"] > launch["time"])
    assert first in hostnames(launch["nodes"]) and regrown["world_size"] == 2, (launch, regrown)
    grown = {k: v for k, v in regrown["resumed_from"].items() if k not in ("bytes_moved", "seconds")}
    assert grown == {"source": "snapshot", "step": stopped["step"], "own_node": 1, "other_node": 1, "saved_world": 1}
    assert regrown["resumed_from"]["bytes_moved"] > 0
    logged = [(r["step"], (r["loss"], r["samples_crc"])) for r in records if "loss" in r]
    assert sorted({step for step, _ in logged}) == list(range(1, GROW_STEPS + 1))
    assert len(logged) - GROW_STEPS <= EVERY  # redone: the steps since the newest whole snapshot when the node was lost
    # Every step on two nodes, those after the grow-back included, is the uninterrupted run's, bit for bit. A step on
    # one node logs its one rank's samples (both micro-batches) and a loss averaged in another order: equal to 1e-6.
    on_one = {r["step"] for r in records if "loss" in r and shrunk["time"] < r["time"] <= stopped["time"]}
    assert on_one and [(step, value) for step, value in logged if step not in on_one and value != reference[step]] == []
    assert all(value[0] == pytest.approx(reference[step][0], rel=1e-6) for step, value in logged if step in on_one)
    # The grow-back's parts: from the later of the planned stop and the shrunk run's first step (its workers answer
    # the signal from then on) to the stop with the state in memory; the requeue until the job runs again; the
    # relaunch (processes, imports, rendezvous) and the load; the first step.
    shrunk_step = next(r for r in records if "loss" in r and r["time"] > shrunk["time"])
    step = next(r for r in records if "loss" in r and r["time"] > regrown["time"])
    begin, load = max(grows[0]["time"], shrunk_step["time"]), regrown["resumed_from"]["seconds"]
    parts = {"stop + snapshot": stopped["time"] - begin, "requeue": launch["time"] - stopped["time"],
             "relaunch": regrown["time"] - launch["time"] - load, "load": load, "first step": step["time"] - regrown["time"]}
    print(f"\njob {job.id}: lost node -> next completed step on fewer nodes "
          f"{next(r for r in records if 'loss' in r and r['time'] > fewer['time'])['time'] - killed_at:.1f} s; "
          f"planned stop -> next completed step {step['time'] - begin:.1f} s "
          f"({', '.join(f'{name} {value:.1f} s' for name, value in parts.items())})")


@pytest.mark.xfail(run=False, reason=(
    "known gap: the guard step's srun runs on the batch node; slurmctld cancels a step whose srun it cannot reach, "
    "and in the last two runs it cancelled the guard 4 s after the loss, 80 s before Slurm took the node out of the "
    "job, which then stayed RUNNING with nothing to run it (docs/training.md, 'The node running the batch script')"))
def test_the_lost_batch_node_requeues_the_job(jobs, reference):
    """The node running the batch script is lost: --no-kill keeps the job RUNNING without it, so jobs/train.sh's guard
    step on the other node requeues it once Slurm has taken the node out; the run resumes, as it would without
    --no-kill."""
    job = jobs.submit("relaunch-batch-node", *RUN)
    job.wait_for_step(FAULT_AFTER)
    batch_node = job.nodes()[0]
    try:
        kill([int(pid) for pid in subprocess.run(["ip", "netns", "pids", f"lc{cluster_name()}-{batch_node}"],
                                                 capture_output=True, text=True, check=True).stdout.split()])
        assert job.wait() == ("COMPLETED", 0), job.output()[-4000:]
        assert job.record()["Restarts"] == "1"
        [recovery] = job.events("recovery")
        assert recovery["action"] == "requeue" and recovery["cause"] == f"the batch node {batch_node} was lost", recovery
        assert f"the node running the batch script, {batch_node}, was lost: requeueing job {job.id}" in job.output()
        logged = [(r["step"], (r["loss"], r["samples_crc"])) for r in job.records() if "loss" in r]
        assert [(step, value) for step, value in logged if value != reference[step]] == []
        assert batch_node not in hostnames(job.events("launch")[-1]["nodes"])
    finally:
        subprocess.run([str(jobs.cluster.repo / "local_cluster/cluster.sh"), "reboot", batch_node], capture_output=True,
                       timeout=600)
