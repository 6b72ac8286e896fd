"""Spare nodes and a node that fails twice, on the real local Slurm cluster.

dev's model2 has a 1-node share (its QOS: GrpTRES=node=1); the test gives it two nodes to run on (node1 is
excluded), so one is a spare. Its node fails the health check (the stand-in's marker) while training: the
epilog drains it and writes the history line, and the requeued job restarts at once on the spare, its QOS
never in the way. The failed node comes back (as ParallelCluster's replacement would), still bad; when the
other node fails too, the job moves back onto it, fails its prolog a second time, and the node is
quarantined: state FAIL with the history file in its reason, no DRAIN (what clustermgtd would replace).
An operator's release returns both nodes, and the run completes.

The health hook the head node installed at the cluster's last boot is swapped for this checkout's for the
test's duration when they differ (and put back after), as `local_cluster/cluster.sh reboot` would install it.
"""

from __future__ import annotations

import filecmp
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from local_cluster import demo_data
from local_cluster.client import wait_for
from local_cluster.training_job import TrainingJob, release_node

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.any_cluster, pytest.mark.drill]
REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "node_scripts" / "slurm_health_hook.sh"
NODES = ("node2", "node3")  # model2's share (1) + 1 spare
# Long enough to be training still at both faults (each comes a few steps after the test sees a step: by step
# 25 or so), short enough that the finish after the release is a few seconds, not minutes, of a CPU.
RUN = ("train.steps=60", "checkpoint.every=10", "log.interval=1", "train.watchdog_floor_s=8")


def slurm(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, check=True).stdout


def node_state(node: str) -> tuple[str, str]:
    """(State, Reason) as scontrol shows them."""
    out = slurm("scontrol", "-o", "show", "node", node)
    state = out.split("State=", 1)[1].split()[0]
    reason = out.split("Reason=", 1)[1].rsplit(" [", 1)[0] if "Reason=" in out else ""
    return state, reason


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    demo_data.build(slurm_cluster.fsx / "data/tokenized/sample")
    deadline = time.monotonic() + 60  # a job that just ended may still hold a node a few seconds
    while (busy := {n: s for n in NODES if (s := slurm("sinfo", "-h", "-n", n, "-p", "gpu", "-o", "%T").strip()) != "idle"}):
        if time.monotonic() > deadline:
            pytest.skip(f"{busy}: the test needs {', '.join(NODES)} idle")
        time.sleep(1)
    etc = slurm_cluster.base / "opt" / "slurm" / "etc"
    installed = [etc / "llm" / "slurm_health_hook.sh", *(etc / "scripts" / f"{h}.d" / "80_llm_node_health" for h in ("prolog", "epilog"))]
    saved = {path: path.read_bytes() for path in installed if path.exists() and not filecmp.cmp(path, HOOK, shallow=False)}
    for path in saved:
        shutil.copy2(HOOK, path)
    (slurm_cluster.fsx / "logs" / "node-health").mkdir(parents=True, exist_ok=True)  # directory_setup.sh makes it
    yield slurm_cluster
    for path, content in saved.items():
        path.write_bytes(content)


def history(cluster) -> list[list[str]]:
    path = cluster.fsx / "logs" / "node-health" / "history.tsv"
    return [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []


def test_a_requeued_job_restarts_on_the_spare_and_a_node_failing_twice_is_quarantined(cluster):
    markers = cluster.fsx / ".node-health"
    markers.mkdir(exist_ok=True)
    job = TrainingJob(cluster, "spare", model="model2")
    lines_before = len(history(cluster))
    try:
        # HEALTH_CONF: the check the prolog runs, which jobs/train.sh's node probe runs too before relaunching in
        # the job (on AWS at its default path): the failing node is not relaunched on, the job requeues.
        job.submit(*RUN, options=("--nodes=1", "--exclude=node1"),
                   HEALTH_CONF=str(cluster.base / "opt/slurm/etc/llm/health.conf"))
        job.wait_for_step(5)
        [bad] = job.nodes()
        [spare] = [n for n in NODES if n != bad]
        (markers / bad).write_text("GPU 3 fell off the bus (Xid 79)\n")
        failed_at = time.monotonic()
        job.kill_worker(signal.SIGKILL, node=bad)
        seen: dict[str, float] = {}  # squeue's "state reason" -> first seen, seconds after the kill
        while not (launches := job.events("launch"))[1:]:
            seen.setdefault(slurm("squeue", "-h", "-j", job.id, "-o", "%T %r").strip(), time.monotonic() - failed_at)
            assert time.monotonic() - failed_at < 120, (seen, job.output()[-3000:])
            time.sleep(0.2)
        restarted_s = time.monotonic() - failed_at
        print(f"failure on {bad} -> restart on {launches[1]['nodes']} after {restarted_s:.1f} s")
        for state, when in sorted(seen.items(), key=lambda item: item[1]):
            print(f"  {when:5.1f} s  {state}")
        assert launches[1]["nodes"] == spare
        # At once: Slurm's hold on a requeued job (cred_expire, 10 s here) and scheduling, not a replacement node.
        assert restarted_s < 40, seen
        state, reason = node_state(bad)
        assert "DRAIN" in state and reason.endswith("stand-in check: GPU 3 fell off the bus (Xid 79)")
        drain = history(cluster)[lines_before:]
        assert [(line[1], line[3]) for line in drain] == [(bad, "drain")] and drain[0][2] == "-"  # no instance id here

        # ParallelCluster's replacement rejoins idle, here the same node, still failing its check; the spare fails too.
        slurm("scontrol", "update", f"nodename={bad}", "state=resume")
        job.wait_for_step(1, after=len(job.records()))  # training goes on, on the spare
        (markers / spare).write_text("EFA device efa0 missing\n")
        job.kill_worker(signal.SIGKILL, node=spare)

        def quarantined():
            return "FAIL" in node_state(bad)[0] and node_state(bad)
        deadline = time.monotonic() + 120
        while not (seen := quarantined()):
            assert time.monotonic() < deadline, (node_state(bad), job.output()[-3000:])
            time.sleep(0.5)
        state, reason = seen
        print(f"{bad}: State={state} Reason={reason}")
        assert "DRAIN" not in state  # clustermgtd replaces DRAINED static nodes; it leaves FAIL alone
        assert reason.startswith("quarantined, failure 2 since its last release (history /fsx/logs/node-health/history.tsv)")
        events = [(line[1], line[3]) for line in history(cluster)[lines_before:]]
        assert events == [(bad, "drain"), (spare, "drain"), (bad, "quarantine")]
        # The job that met the quarantine on its start is requeued (COMPLETING a moment), and neither node takes it.
        wait_for("the job pending", lambda: slurm("squeue", "-h", "-j", job.id, "-o", "%T").strip() == "PENDING", 60, 0.5)

        for node in (bad, spare):
            (markers / node).unlink()
            release_node(cluster, node, "test: inspected")
        assert job.wait(timeout=600) == ("COMPLETED", 0), job.output()[-3000:]
        assert [line[3] for line in history(cluster)[lines_before:]][-2:] == ["release", "release"]
    finally:
        subprocess.run(["scancel", job.id], check=False)
        for node in NODES:
            (markers / node).unlink(missing_ok=True)
            if node_state(node)[1]:
                release_node(cluster, node, "test cleanup")
        shutil.rmtree(job.host_root, ignore_errors=True)
