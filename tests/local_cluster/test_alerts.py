"""Alerts end to end on the local cluster: real faults, the repository's own rules (monitoring/rules/*.yml)
in the cluster's Prometheus, its Alertmanager, and the webhook that stands in for SNS (local_cluster/monitoring.sh).

Each drill injects a fault, waits for its alert, removes the fault and waits for the alert to clear. The
seconds from fault to alert and from fix to clear go to .local_cluster/log/alert_timings.json and are
printed at the end. Alerts whose rule waits minutes (`for`) while their fault would hold up the other
drills are followed to Prometheus' pending state (their expression holds on the real cluster; the webhook
then gets them `for` later); LOCAL_ALERTS_FULL=1 follows every one to the webhook (about 16 minutes).

The drills run side by side where they do not interfere (three nodes, two cores):
  model1 on node1+2   killed at every start (TrainingCrashLooping); left to recover; then its whole
                      trainer stopped with SIGSTOP (TrainingStalled) and let go
  model2 on node3     killed twice with MAX_RECOVERIES=1 (TrainingFailed); submitted again
  cluster             node3 drained (NodeDrained, and NodesDownAboveSpares: dev keeps no spare node),
                      slurmdbd stopped (AccountingDown), /fsx/data filled (FileSystemAlmostFull: a
                      tmpfs over the head node's view of it), XID 79 on a node1 GPU (GPUFatalXid)
  last, alone         the head node's node exporter stopped (HeadNodeUnhealthy), which takes every
                      training metric with it
The models write where the exporter reads (/fsx/logs/<model>, /fsx/checkpoints/<model>); what was there
is put back after each model's drills, and the cluster is left as it was found.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from local_cluster import demo_data
from local_cluster.alert_drills import (BASE, DETECT_S, FSX, MODEL_NODES, Killer, ModelJob, cleared, gone,
                                        move_model_aside, notified, pending, prometheus_alerts, rule_waits,
                                        signal_all, slurm_activity, wait_for)

pytestmark = pytest.mark.slurm

TIMINGS = BASE / "log/alert_timings.json"
FULL = os.environ.get("LOCAL_ALERTS_FULL") == "1"
STALL_FLOOR_S = 30  # dev's alerts.stall_floor_s
FOR_S = rule_waits()
WAIT_S = 1500 if FULL else 600  # the longest any drill may take, waits included
TIMEOUT = pytest.mark.timeout(WAIT_S + 300)


@dataclass
class Timing:
    alert: str
    labels: dict[str, str]
    fault: str
    fix: str
    for_s: float
    followed_to: str  # "webhook", or "pending" in Prometheus
    fired_s: float | None = None  # fault -> firing notification (or -> pending in Prometheus)
    resolved_s: float | None = None  # fix -> resolved notification (or -> gone from Prometheus)


@dataclass
class Drill:
    """One fault and the alerts it must raise; ``run`` injects, waits, fixes, waits."""
    fault: str
    fix: str
    alerts: dict[str, dict[str, str]]  # alert -> labels it must carry
    to_webhook: bool
    timings: list[Timing] = field(default_factory=list)

    def run(self, inject, remove) -> list[Timing]:
        start = time.time()
        inject()
        try:
            fired = {name: self._fired(name, labels, start) for name, labels in self.alerts.items()}
        finally:
            fixed = time.time()
            remove()
        for name, labels in self.alerts.items():
            timing = Timing(name, labels, self.fault, self.fix, FOR_S[name], "webhook" if self.to_webhook else "pending",
                            fired_s=fired[name][0] - start)
            timing.resolved_s = self._resolved(name, labels, fixed, fired[name][1]) - fixed
            self.timings.append(timing)
        return self.timings

    def _fired(self, name: str, labels: dict[str, str], since: float) -> tuple[float, str | None]:
        if self.to_webhook:
            alert = notified(name, labels, "firing", since, FOR_S[name] + DETECT_S)
            return alert["received"], alert["startsAt"]
        return pending(name, labels, DETECT_S), None

    def _resolved(self, name: str, labels: dict[str, str], since: float, starts_at: str | None) -> float:
        if self.to_webhook:
            return notified(name, labels, "resolved", since, DETECT_S, starts_at)["received"]
        return cleared(name, labels, DETECT_S)


# --- the drills ----------------------------------------------------------------------------------
def crash_loop_then_stall(cluster, saved: Path, results: dict[str, Future]) -> None:
    job = ModelJob(cluster, "model1")
    try:
        job.submit("train.steps=3000", MAX_RECOVERIES="20")
        labels = {"model": "model1"}
        with Killer(job) as killer:
            first = killer.wait_kills(1, 120)
            firing = notified("TrainingCrashLooping", labels, "firing", first, 3 * DETECT_S + FOR_S["TrainingCrashLooping"])
        stopped = time.time()  # the next start trains
        resolved = notified("TrainingCrashLooping", labels, "resolved", stopped, 2 * DETECT_S, firing["startsAt"])
        starts = sum(1 for r in job.records() if r.get("event") == "launch")
        results["TrainingCrashLooping"].set_result([Timing(
            "TrainingCrashLooping", labels, f"model1's workers killed at each of its first {starts} starts",
            "workers left alone: the next requeue trains", FOR_S["TrainingCrashLooping"], "webhook",
            firing["received"] - first, resolved["received"] - stopped)])
    except BaseException as exc:
        results["TrainingCrashLooping"].set_exception(exc)
        results["TrainingStalled"].set_exception(RuntimeError(f"not run: the crash loop drill failed first: {exc}"))
        job.finish(saved)
        return
    try:
        wait_for("model1 training after its recovery", lambda: True if job.steps_since(stopped) >= 5 else None, 120, 0.5)
        tree = job.trainer()
        assert tree, f"no trainer processes of job {job.id}"
        drill = Drill("model1's trainer stopped (SIGSTOP to torchrun and every worker, watchdog included)",
                      "SIGCONT", {"TrainingStalled": labels}, to_webhook=True)

        results["TrainingStalled"].set_result(drill.run(lambda: signal_all(tree, signal.SIGSTOP),
                                                        lambda: signal_all(tree, signal.SIGCONT)))
    except BaseException as exc:
        results["TrainingStalled"].set_exception(exc)
    finally:
        job.finish(saved)


def retry_budget_spent(cluster, saved: Path, results: dict[str, Future]) -> None:
    job = ModelJob(cluster, "model2")
    try:
        job.submit("train.steps=3000", MAX_RECOVERIES="1")
        labels = {"model": "model2", "reason": "retry budget spent"}
        with Killer(job) as killer:
            spent = killer.wait_kills(2, 240)  # the first start, then the one requeue the budget allows
            wait_for(f"model2's job {job.id} to fail", lambda: True if job.state() == "FAILED" else None, 120)
        firing = notified("TrainingFailed", labels, "firing", spent, FOR_S["TrainingFailed"] + DETECT_S)
        fixed = time.time()
        job.submit("train.steps=3000")
        resolved = notified("TrainingFailed", labels, "resolved", fixed, DETECT_S, firing["startsAt"])
        results["TrainingFailed"].set_result([Timing(
            "TrainingFailed", labels, "model2 with MAX_RECOVERIES=1 killed at its start and at its requeue",
            "submitted again", FOR_S["TrainingFailed"], "webhook", firing["received"] - spent,
            resolved["received"] - fixed)])
    except BaseException as exc:
        results["TrainingFailed"].set_exception(exc)
    finally:
        job.finish(saved)


def gpu_xid(results: dict[str, Future]) -> None:
    marker = FSX / ".node-health/node1.xid"
    drill = Drill("XID 79 (fallen off the bus) on node1's GPU 3, through the DCGM stand-in", "fault file removed",
                  {"GPUFatalXid": {"Hostname": "node1", "gpu": "3"}}, to_webhook=True)
    try:
        results["GPUFatalXid"].set_result(drill.run(lambda: marker.write_text("3 79\n"),
                                                    lambda: marker.unlink(missing_ok=True)))
    except BaseException as exc:
        results["GPUFatalXid"].set_exception(exc)


def node_drained(results: dict[str, Future]) -> None:
    drill = Drill("scontrol update nodename=node3 state=drain", "state=resume",
                  {"NodeDrained": {"node": "node3"}, "NodesDownAboveSpares": {}}, to_webhook=FULL)

    def scontrol(*args: str) -> None:
        subprocess.run(["scontrol", "update", "nodename=node3", *args], check=True)
    try:
        timings = drill.run(lambda: scontrol("state=drain", "reason=alert drill"), lambda: scontrol("state=resume"))
        for name in drill.alerts:
            results[name].set_result([t for t in timings if t.alert == name])
    except BaseException as exc:
        for name in drill.alerts:
            results[name].set_exception(exc)


def accounting_down(results: dict[str, Future]) -> None:
    pid_file = BASE / "run/slurmdbd.pid"
    drill = Drill("slurmdbd stopped", "slurmdbd started again (as cluster.sh up starts it)",
                  {"AccountingDown": {}}, to_webhook=FULL)

    def stop():
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
        wait_for("slurmdbd to stop", lambda: True if gone(pid) else None, 30, 0.1)

    def start():
        subprocess.run(["slurmdbd"], env={**os.environ, "SLURM_CONF": str(BASE / "etc/slurm.conf")}, check=True)
    try:
        results["AccountingDown"].set_result(drill.run(stop, start))
    except BaseException as exc:
        results["AccountingDown"].set_exception(exc)


def file_system_full(results: dict[str, Future]) -> None:
    """A 16 MiB tmpfs, filled to 97 %, over the head node's /fsx/data (the exporter's statvfs); the nodes
    keep their own mounts, made at boot in their private mount namespaces."""
    data = FSX / "data"
    drill = Drill("/fsx/data 97 % full (a 16 MiB tmpfs over the head node's view)", "unmounted",
                  {"FileSystemAlmostFull": {"filesystem": str(data)}}, to_webhook=FULL)

    def fill():
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "alert-drill", str(data)], check=True)
        (data / "fill").write_bytes(b"\0" * (16 * 1024 * 1024 - 512 * 1024))
    try:
        results["FileSystemAlmostFull"].set_result(
            drill.run(fill, lambda: subprocess.run(["umount", str(data)], check=True)))
    except BaseException as exc:
        results["FileSystemAlmostFull"].set_exception(exc)


def head_node_unhealthy(cluster, results: dict[str, Future]) -> None:
    pid_file = BASE / "run/node-exporter-head.pid"
    drill = Drill("the head node's node exporter stopped", "cluster.sh up (starts what is missing)",
                  {"HeadNodeUnhealthy": {"problem": "its node exporter does not answer the scrape"}}, to_webhook=FULL)

    def stop():
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
    try:
        results["HeadNodeUnhealthy"].set_result(drill.run(stop, cluster.up))
    except BaseException as exc:
        results["HeadNodeUnhealthy"].set_exception(exc)


ALERTS = ("TrainingCrashLooping", "TrainingStalled", "TrainingFailed", "GPUFatalXid", "NodeDrained",
          "NodesDownAboveSpares", "AccountingDown", "FileSystemAlmostFull", "HeadNodeUnhealthy")


def run_all(cluster, saved: Path, results: dict[str, Future]) -> None:
    def start(fn, *args) -> threading.Thread:
        thread = threading.Thread(target=fn, args=(*args, results), daemon=True)
        thread.start()
        return thread

    cluster_drills = (gpu_xid, node_drained, accounting_down, file_system_full)
    training = [start(crash_loop_then_stall, cluster, saved / "model1"),
                start(retry_budget_spent, cluster, saved / "model2")]
    # Quick here (pending is enough); followed to the webhook they hold node3 and slurmdbd for minutes,
    # so then they wait for the training drills.
    if FULL:
        for thread in training:
            thread.join()
    others = [start(fn) for fn in cluster_drills]
    for thread in [*training, *others]:
        thread.join()
    start(head_node_unhealthy, cluster).join()


@pytest.fixture(scope="module")
def drills(slurm_cluster, request):
    prometheus_alerts()  # the monitoring is up
    # The drills need every node; what an earlier test left gets two minutes to end.
    wait_for("cluster to itself: no job, no reservation", lambda: None if slurm_activity() else True, 120)
    demo_data.build(FSX / "data/tokenized-sample")
    saved = Path(tempfile.mkdtemp(prefix="alert-drills-", dir=BASE))  # beside fsx/: rename works
    for model in MODEL_NODES:
        move_model_aside(model, saved / model)
    results = {name: Future() for name in ALERTS}
    conductor = threading.Thread(target=run_all, args=(slurm_cluster, saved, results), daemon=True)
    start = time.monotonic()
    conductor.start()
    yield results
    conductor.join(timeout=WAIT_S)
    leave_as_found(slurm_cluster)
    try:  # emptied by each model's drills as they put its files back
        for model in MODEL_NODES:
            (saved / model).rmdir()
        saved.rmdir()
    except OSError:
        print(f"warning: the models' earlier files are still in {saved}: put them back by hand")
    timings = [asdict(t) for name in ALERTS if results[name].done() and not results[name].exception()
               for t in results[name].result()]
    TIMINGS.write_text(json.dumps({"seconds": round(time.monotonic() - start), "full": FULL, "alerts": timings},
                                  indent=1) + "\n")
    lines = [f"alert drills, {time.monotonic() - start:.0f} s ({TIMINGS}): seconds from the fault to the alert "
             "(webhook: its notification; pending: Prometheus holds it, the webhook gets it `for` later) "
             "and from the fix to its resolution",
             f"  {'alert':22} {'for':>5} {'alert':>6} {'cleared':>8}  {'seen at':8} fault"]
    lines += [f"  {t['alert']:22} {t['for_s']:5.0f} {t['fired_s']:6.1f} {t['resolved_s']:8.1f}  "
              f"{t['followed_to']:8} {t['fault']}" for t in timings]
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print("\n" + "\n".join(lines))


def leave_as_found(cluster) -> None:
    """Whatever a failed drill left: no fault file, node3 in service, /fsx/data unmounted, every daemon up."""
    (FSX / ".node-health/node1.xid").unlink(missing_ok=True)
    subprocess.run(["scontrol", "update", "nodename=node3", "state=resume"], capture_output=True, check=False)
    while subprocess.run(["mountpoint", "-q", str(FSX / "data")]).returncode == 0:
        subprocess.run(["umount", "-l", str(FSX / "data")], check=True)
    if not cluster.is_up():
        cluster.up()


def result(drills, name: str) -> list[Timing]:
    return drills[name].result(timeout=WAIT_S)


@TIMEOUT
def test_crash_looping_job_alerts_and_clears_once_it_trains_again(drills):
    [timing] = result(drills, "TrainingCrashLooping")
    assert timing.fired_s >= FOR_S["TrainingCrashLooping"]


@TIMEOUT
def test_stalled_job_alerts_and_clears_when_it_goes_on(drills):
    [timing] = result(drills, "TrainingStalled")
    assert timing.fired_s >= STALL_FLOOR_S + FOR_S["TrainingStalled"]


@TIMEOUT
def test_spent_retry_budget_alerts_and_clears_on_resubmission(drills):
    [timing] = result(drills, "TrainingFailed")
    assert timing.fired_s >= FOR_S["TrainingFailed"]


@TIMEOUT
def test_fatal_gpu_xid_alerts_at_once(drills):
    [timing] = result(drills, "GPUFatalXid")
    assert timing.fired_s < DETECT_S


@TIMEOUT
@pytest.mark.parametrize("alert", ["NodeDrained", "NodesDownAboveSpares"])
def test_drained_node_alerts(drills, alert):
    assert result(drills, alert)


@TIMEOUT
def test_accounting_down_alerts(drills):
    assert result(drills, "AccountingDown")


@TIMEOUT
def test_full_file_system_alerts(drills):
    assert result(drills, "FileSystemAlmostFull")


@TIMEOUT
def test_head_node_without_metrics_alerts(drills):
    assert result(drills, "HeadNodeUnhealthy")
