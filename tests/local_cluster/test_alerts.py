"""Alerts end to end on the local cluster: real faults, the repository's own rules (monitoring/rules/*.yml)
in the cluster's Prometheus, its Alertmanager, and the webhook that stands in for SNS (local_cluster/monitoring.sh).

Each drill injects a fault, waits for its alert, removes the fault and waits for the alert to clear. The
seconds from fault to alert and from fix to clear go to .local_cluster/log/alert_timings.json and are
printed at the end. Alerts whose rule waits minutes (`for`) while their fault would hold up the other
drills are followed to Prometheus' pending state (their expression holds on the real cluster; the webhook
then gets them `for` later); LOCAL_ALERTS_FULL=1 follows them to the webhook (about 17 minutes). Three
are followed to pending always: ModelBehindPlan and TrainingPendingTooLong wait 30 minutes, and a spike
lasts only until the median of the last 20 metric lines has caught up with it (LossSpike waits 5).

The drills run side by side where they do not interfere (three nodes, two cores); each model's in turn:
  model1 on node1+2   killed at every start (TrainingCrashLooping); left to recover, each rank held to
                      a quarter of a CPU from its first step (the next drills need its steps and saves,
                      not its speed); then its whole trainer stopped with SIGSTOP (TrainingStalled) and
                      let go; its checkpoint folder full as its nodes see it (CheckpointStale) and freed;
                      its rank on node2 held to 10 % of a CPU, the other at full speed again
                      (TrainingStraggler, naming node2) and let go; resubmitted with the
                      steps that take 30 % of dev's one-day deadline and slowed tenfold (ModelBehindPlan)
  model2 on node3     killed twice with MAX_RECOVERIES=1 (TrainingFailed); submitted again; resumed with
                      a learning rate that overflows (LossNotFinite), restarted from scratch; resumed
                      with one that jumps the loss (LossSpike), cancelled; submitted while an ops job
                      holds its node (TrainingPendingTooLong), the ops job cancelled
  cluster             node3 drained (NodeDrained, and NodesDownAboveSpares: dev keeps no spare node),
                      slurmdbd stopped (AccountingDown), /fsx/data filled (FileSystemAlmostFull: a
                      tmpfs over the head node's view of it), XID 79 on a node1 GPU (GPUFatalXid), a
                      node2 GPU at 91 C (GPUTemperatureHigh; both through the DCGM stand-in)
  last, alone         the head node's node exporter stopped (HeadNodeUnhealthy), which takes every
                      training metric with it
The models write where the exporter reads (/fsx/logs/<model>, /fsx/checkpoints/<model>); what was there
is put back after each model's drills, and the cluster is left as it was found.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import pytest

from local_cluster import demo_data
from local_cluster.alert_drills import (BASE, DETECT_S, FSX, MODEL_NODES, Killer, ModelJob, Throttle, cleared,
                                        fill_checkpoints, free_checkpoints, gone, move_model_aside, notified,
                                        pending, prometheus_alerts, rule_waits, signal_all, slurm_activity,
                                        wait_for)
from local_cluster.client import hostnames
from local_cluster.cpu_limit import CpuLimit
from local_cluster.training_job import worker_pids

pytestmark = [pytest.mark.slurm, pytest.mark.drill]

TIMINGS = BASE / "log/alert_timings.json"
FULL = os.environ.get("LOCAL_ALERTS_FULL") == "1"
STALL_FLOOR_S = 30  # dev's alerts.stall_floor_s
FOR_S = rule_waits()
WAIT_S = 1500 if FULL else 900  # the longest any drill may take, waits included
CHECKPOINT_EVERY = 5  # model1's checkpoint.every (dev's: 20): CheckpointStale holds after two intervals and one more
METRICS_CPU = 0.25  # of a CPU for each of model1's ranks while a drill needs its metrics, not its speed
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
    onset_s: float = 0  # how long after the fault its alert's expression may first hold (a job's start)
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
            alert = notified(name, labels, "firing", since, self.onset_s + FOR_S[name] + DETECT_S)
            return alert["received"], alert["startsAt"]
        return pending(name, labels, self.onset_s + DETECT_S), None

    def _resolved(self, name: str, labels: dict[str, str], since: float, starts_at: str | None) -> float:
        if self.to_webhook:
            return notified(name, labels, "resolved", since, DETECT_S, starts_at)["received"]
        return cleared(name, labels, DETECT_S)


# --- the drills ---------------------------------------------------------------------------------
# Each model's drills run in turn on its job (model1 on node1+2, model2 on node3), each returning its
# timings; a drill that fails leaves the model's later drills not run.
def in_turn(results: dict[str, Future], drills) -> None:
    for i, (alert, drill) in enumerate(drills):
        try:
            results[alert].set_result(drill())
        except BaseException as exc:
            results[alert].set_exception(exc)
            for later, _ in drills[i + 1:]:
                results[later].set_exception(RuntimeError(f"not run: the {alert} drill failed first: {exc}"))
            return


def model1_drills(cluster, saved: Path, results: dict[str, Future]) -> None:
    job = ModelJob(cluster, "model1")
    quotas: list[CpuLimit] = []
    try:
        in_turn(results, [("TrainingCrashLooping", lambda: crash_loop(job, quotas)),
                          ("TrainingStalled", lambda: stall(job)),
                          ("CheckpointStale", lambda: checkpoints_stop_landing(job)),
                          ("TrainingStraggler", lambda: straggling(job, quotas)),
                          ("ModelBehindPlan", lambda: crawling(job))])
    finally:
        lift(quotas)
        job.finish(saved)


def model2_drills(cluster, saved: Path, results: dict[str, Future]) -> None:
    job = ModelJob(cluster, "model2")
    try:
        in_turn(results, [("TrainingFailed", lambda: retry_budget_spent(job)),
                          ("LossNotFinite", lambda: diverged(job)),
                          ("LossSpike", lambda: loss_spike(job)),
                          ("TrainingPendingTooLong", lambda: held_by_another_job(job))])
    finally:
        job.finish(saved)


def crash_loop(job: ModelJob, quotas: list[CpuLimit]) -> list[Timing]:
    job.submit("train.steps=3000", f"checkpoint.every={CHECKPOINT_EVERY}", MAX_RECOVERIES="20")
    labels = {"model": "model1"}
    with Killer(job) as killer:
        first = killer.wait_kills(1, 120)
        firing = notified("TrainingCrashLooping", labels, "firing", first, 3 * DETECT_S + FOR_S["TrainingCrashLooping"])
    stopped = time.time()  # the next start trains
    wait_for("model1's first step after the crash loop", lambda: True if job.steps_since(stopped) >= 1 else None,
             120, 0.5)
    quotas += hold_to(job, METRICS_CPU)  # the step has made the alert's expression false; what follows needs no speed
    resolved = notified("TrainingCrashLooping", labels, "resolved", stopped, 2 * DETECT_S, firing["startsAt"])
    starts = sum(1 for r in job.records() if r.get("event") == "launch")
    return [Timing("TrainingCrashLooping", labels, f"model1's workers killed at each of its first {starts} starts",
                   "workers left alone: the next requeue trains", FOR_S["TrainingCrashLooping"], "webhook",
                   firing["received"] - first, resolved["received"] - stopped)]


def stall(job: ModelJob) -> list[Timing]:
    since = time.time()
    wait_for("model1 training after its recovery", lambda: True if job.steps_since(since) >= 5 else None, 120, 0.5)
    tree = job.trainer()
    assert tree, f"no trainer processes of job {job.id}"
    drill = Drill("model1's trainer stopped (SIGSTOP to torchrun and every worker, watchdog included)",
                  "SIGCONT", {"TrainingStalled": {"model": "model1"}}, to_webhook=True)
    return drill.run(lambda: signal_all(tree, signal.SIGSTOP), lambda: signal_all(tree, signal.SIGCONT))


def hold_to(job: ModelJob, fraction: float) -> list[CpuLimit]:
    """Each node's ranks of the job held to ``fraction`` of a CPU, a cgroup each: alike, neither the slower.
    None where there is no cgroup: CpuLimit's SIGSTOP duty cycle would undo the stall drill's SIGSTOP."""
    quotas = [CpuLimit(worker_pids(job.id, node=node), fraction).start() for node in hostnames(MODEL_NODES[job.model])]
    if not all(quota.how.startswith("cgroup") for quota in quotas):
        lift(quotas)
    return quotas


def lift(quotas: list[CpuLimit]) -> None:
    while quotas:
        quotas.pop().stop()


def checkpoints_stop_landing(job: ModelJob) -> list[Timing]:
    """The trainer skips a periodic save that does not fit (and goes on training): `latest` grows old. The
    rule counts checkpoint intervals in the job's own step time: held to METRICS_CPU since the crash loop,
    it is the same step time throughout."""
    since = time.time()
    wait_for("model1 training after the stall", lambda: True if job.steps_since(since) >= 5 else None, 120, 0.5)
    drill = Drill("model1's checkpoint folder full as its nodes see it (a full 1 MiB tmpfs over it on node1 "
                  "and node2): every periodic save skipped, training goes on", "unmounted: the next save lands",
                  {"CheckpointStale": {"model": "model1"}}, to_webhook=True,
                  onset_s=3 * job.step_seconds() * CHECKPOINT_EVERY)  # two intervals, and one more
    return drill.run(lambda: fill_checkpoints("model1"), lambda: free_checkpoints("model1"))


def straggling(job: ModelJob, quotas: list[CpuLimit]) -> list[Timing]:
    """One rank far slower than the other, interval after interval: dev's recipe on CPUs reports a straggler
    (400 % over its peer for 3 log intervals: cluster_config/dev.yaml) without evicting it
    (train.straggler_evict), and the alert names its model, rank and node. The other rank at full speed:
    the gap is 10 x, not the 2.5 x a rank held to 10 % would have over one held to 25 %."""
    labels = {"model": "model1", "node": "node2"}
    lift(quotas)
    since = time.time()
    wait_for("model1 training after the checkpoint drill", lambda: True if job.steps_since(since) >= 5 else None,
             120, 0.5)
    cleared("TrainingStraggler", labels, DETECT_S)  # nothing reported before the fault: the alert is the fault's
    pids = worker_pids(job.id, node="node2")
    assert pids, f"no worker of model1's job {job.id} on node2"
    limit = CpuLimit(pids, 0.1)
    drill = Drill("model1's rank on node2 held to 10 % of a CPU (a cgroup CPU quota, local_cluster/cpu_limit.py): "
                  "slower than its peer by far, reported as a straggler", "the limit lifted",
                  {"TrainingStraggler": labels}, to_webhook=FULL,
                  # reported after train.straggler_intervals (3) log intervals of one step, each ~10 x as long
                  onset_s=3 * 10 * job.step_seconds())
    return drill.run(limit.__enter__, lambda: limit.__exit__(None, None, None))


def crawling(job: ModelJob) -> list[Timing]:
    """dev's deadline is a day from the model's first launch; the run is resubmitted with the steps that
    take 30 % of that at its own step time, then slowed about tenfold."""
    steps = int(0.3 * 86400 / job.step_seconds())
    job.cancel()
    since = time.time()
    job.submit(f"train.steps={steps}")
    wait_for(f"model1 training {steps} steps", lambda: True if job.steps_since(since) >= 10 else None, 180, 0.5)
    throttle = Throttle(job.trainer(), duty=0.1)
    drill = Drill(f"model1 ({steps} steps, 30 % of its deadline at full speed) running 0.1 s of every second "
                  "(SIGSTOP/SIGCONT to its trainer): its ETA passes the deadline", "full speed again",
                  {"ModelBehindPlan": {"model": "model1"}}, to_webhook=False)
    return drill.run(throttle.start, throttle.stop)


def retry_budget_spent(job: ModelJob) -> list[Timing]:
    job.submit("train.steps=3000", MAX_RECOVERIES="1")
    labels = {"model": "model2", "reason": "retry budget spent"}
    with Killer(job) as killer:
        spent = killer.wait_kills(2, 240)  # the first start, then the one requeue the budget allows
        wait_for(f"model2's job {job.id} to fail", lambda: True if job.state() == "FAILED" else None, 120)
    firing = notified("TrainingFailed", labels, "firing", spent, FOR_S["TrainingFailed"] + DETECT_S)
    fixed = time.time()
    job.submit("train.steps=3000")
    resolved = notified("TrainingFailed", labels, "resolved", fixed, DETECT_S, firing["startsAt"])
    return [Timing("TrainingFailed", labels, "model2 with MAX_RECOVERIES=1 killed at its start and at its requeue",
                   "submitted again", FOR_S["TrainingFailed"], "webhook", firing["received"] - spent,
                   resolved["received"] - fixed)]


def diverged(job: ModelJob) -> list[Timing]:
    """A learning rate far too high: the weights overflow within a few steps and every loss after is NaN."""
    job.cancel()

    def fix():
        job.cancel()
        # Every checkpoint since the fault holds NaN weights: the operator removes them; the folder (model2's) stays.
        for entry in (FSX / "checkpoints/model2").iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        job.submit("train.steps=3000")
    drill = Drill("model2 resumed with optim.lr=1000 and no warm-up: NaN within a few steps",
                  "cancelled, its checkpoints removed, submitted again with its own learning rate",
                  {"LossNotFinite": {"model": "model2"}}, to_webhook=True, onset_s=DETECT_S)
    return drill.run(lambda: job.submit("train.steps=3000", "optim.lr=1000", "optim.min_lr=0", "optim.warmup_steps=0"),
                     fix)


def loss_spike(job: ModelJob) -> list[Timing]:
    """The loss jumps far above the median of the losses logged before (a learning rate raised on resume).
    The median catches up within ten metric lines, so the lines come every 25 steps (about a minute)."""
    since = time.time()
    wait_for("model2's loss baseline (25 steps after its restart)",
             lambda: True if job.steps_since(since) >= 25 else None, 180, 0.5)
    cleared("LossSpike", {"model": "model2"}, DETECT_S)  # the restart from scratch is above the old baseline
    job.cancel()
    drill = Drill("model2 resumed with optim.lr=3 (1,000 x its own): the loss jumps 10-500 x",
                  "cancelled (an operator goes back to the checkpoint before the spike)",
                  {"LossSpike": {"model": "model2"}}, to_webhook=False, onset_s=DETECT_S)
    return drill.run(lambda: job.submit("train.steps=3000", "optim.lr=3", "optim.warmup_steps=0", "log.interval=25"),
                     job.cancel)


def held_by_another_job(job: ModelJob) -> list[Timing]:
    """The model's node held by another account's job: the model's job pends (Resources), none runs."""
    blocker = subprocess.run(["sbatch", "--parsable", "--account=ops", "--qos=ops", "--nodelist=node3", "--exclusive",
                              "--job-name=alert-drill-blocker", "--output=/dev/null", "--wrap", "sleep 900"],
                             capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        wait_for(f"ops job {blocker} running on node3",
                 lambda: True if job.cluster.jobs(blocker)[0].get("JobState") == "RUNNING" else None, 60, 0.5)
        drill = Drill("model2 submitted while an ops job holds its node (node3)", "the ops job cancelled",
                      {"TrainingPendingTooLong": {"model": "model2"}}, to_webhook=False)
        return drill.run(lambda: job.submit("train.steps=3000"), lambda: subprocess.run(["scancel", blocker], check=True))
    finally:
        subprocess.run(["scancel", blocker], check=False)


def gpu_fault(alert: str, node: str, gpu: str, line: str, what: str, to_webhook: bool,
              results: dict[str, Future]) -> None:
    """A fault ``line`` for the node's DCGM stand-in (its fault file), removed as the fix."""
    marker = FSX / f".node-health/{node}.xid"
    drill = Drill(f"{what} on {node}'s GPU {gpu}, through the DCGM stand-in", "fault file removed",
                  {alert: {"Hostname": node, "gpu": gpu}}, to_webhook=to_webhook)
    try:
        results[alert].set_result(drill.run(lambda: marker.write_text(line + "\n"),
                                            lambda: marker.unlink(missing_ok=True)))
    except BaseException as exc:
        results[alert].set_exception(exc)


gpu_xid = partial(gpu_fault, "GPUFatalXid", "node1", "3", "3 79", "XID 79 (fallen off the bus)", True)
gpu_hot = partial(gpu_fault, "GPUTemperatureHigh", "node2", "2", "2 temp 91", "91 C", FULL)


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


ALERTS = ("TrainingCrashLooping", "TrainingStalled", "CheckpointStale", "TrainingStraggler", "ModelBehindPlan",
          "TrainingFailed", "LossNotFinite", "LossSpike", "TrainingPendingTooLong", "GPUFatalXid", "GPUTemperatureHigh",
          "NodeDrained", "NodesDownAboveSpares", "AccountingDown", "FileSystemAlmostFull", "HeadNodeUnhealthy")


def run_all(cluster, saved: Path, results: dict[str, Future]) -> None:
    def start(fn, *args) -> threading.Thread:
        thread = threading.Thread(target=fn, args=(*args, results), daemon=True)
        thread.start()
        return thread

    cluster_drills = (gpu_xid, gpu_hot, node_drained, accounting_down, file_system_full)
    training = [start(model1_drills, cluster, saved / "model1"), start(model2_drills, cluster, saved / "model2")]
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
    demo_data.build(FSX / "data/tokenized/sample")
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
    """Whatever a failed drill left: no fault files, no blocking job, node3 in service, /fsx/data and model1's
    checkpoints unmounted, every daemon up."""
    for node in ("node1", "node2"):
        (FSX / f".node-health/{node}.xid").unlink(missing_ok=True)
    subprocess.run(["scancel", "--name=alert-drill-blocker"], check=False)
    free_checkpoints("model1")
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
def test_checkpoints_that_stop_landing_alert_and_clear_with_the_next_save(drills):
    [timing] = result(drills, "CheckpointStale")
    assert timing.fired_s >= FOR_S["CheckpointStale"]


@TIMEOUT
def test_a_straggling_rank_is_alerted_naming_its_node_and_clears_when_it_catches_up(drills):
    # Absent before the fault (the drill waits for that), carrying node="node2" after it, cleared after the fix.
    assert result(drills, "TrainingStraggler")


@TIMEOUT
def test_a_model_slowed_past_its_deadline_is_seen_behind_plan(drills):
    assert result(drills, "ModelBehindPlan")


@TIMEOUT
def test_spent_retry_budget_alerts_and_clears_on_resubmission(drills):
    [timing] = result(drills, "TrainingFailed")
    assert timing.fired_s >= FOR_S["TrainingFailed"]


@TIMEOUT
def test_a_diverged_loss_alerts_at_once_and_clears_when_training_restarts(drills):
    [timing] = result(drills, "LossNotFinite")
    assert timing.fired_s < 2 * DETECT_S  # the job's start, a few steps, then no `for`


@TIMEOUT
def test_a_loss_spike_is_seen(drills):
    assert result(drills, "LossSpike")


@TIMEOUT
def test_a_job_held_pending_is_seen(drills):
    assert result(drills, "TrainingPendingTooLong")


@TIMEOUT
def test_fatal_gpu_xid_alerts_at_once(drills):
    [timing] = result(drills, "GPUFatalXid")
    assert timing.fired_s < DETECT_S


@TIMEOUT
def test_a_hot_gpu_is_seen(drills):
    assert result(drills, "GPUTemperatureHigh")


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
