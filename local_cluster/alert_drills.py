"""Faults that raise alerts on the local cluster, and what its alerting saw (Prometheus' alerts, the webhook's
notifications): for tests/local_cluster/test_alerts.py and ``make demo``.

    .venv/bin/python -m local_cluster.alert_drills      (from the repository root, cluster up)

runs the demo: model1 killed at every start until TrainingCrashLooping fires, then left to recover; at
the same time model2's whole trainer stopped (SIGSTOP) until TrainingStalled fires, then let go. It
prints the webhook's lines (.local_cluster/log/alerts.log) as they arrive and exits 0 once both alerts
fired and cleared. What the models' folders held before is put back at the end.

The models run where the exporter reads (/fsx/logs/<model>, /fsx/checkpoints/<model>), pinned to
their nodes (model1 node1+2, model2 node3) so that a requeue never waits for the other model.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import yaml
from cli import ArgumentParser

from . import client, demo_data
from .client import REPO, LocalCluster, give_to, hostnames
from .training_job import worker_pids

BASE = REPO / ".local_cluster"
FSX = BASE / "fsx"
ALERTS_JSONL = BASE / "log/alerts.jsonl"
ALERTS_LOG = BASE / "log/alerts.log"
PROMETHEUS = "http://127.0.0.1:19090"
MODEL_NODES = {"model1": "node[1-2]", "model2": "node3"}
# Exporter round + scrape + evaluation + Alertmanager's group_wait, 5 + 5 + 5 + 2 s, on a busy machine.
DETECT_S = 60


def rule_waits() -> dict[str, float]:
    """alert -> seconds of its rule's `for`, from the repository's rules."""
    units = {"s": 1, "m": 60, "h": 3600}
    waits = {}
    for path in sorted((REPO / "monitoring/rules").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    waits[rule["alert"]] = sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", rule.get("for", "0s")))
    return waits


# --- what Prometheus and the webhook saw -------------------------------------------------------------
def prometheus_alerts() -> list[dict]:
    with urllib.request.urlopen(f"{PROMETHEUS}/api/v1/alerts", timeout=5) as response:
        return json.load(response)["data"]["alerts"]


def notifications() -> list[dict]:
    """Every alert the webhook received: labels, status, startsAt, ..., and ``received`` (epoch seconds)."""
    if not ALERTS_JSONL.exists():
        return []
    found = []
    for line in ALERTS_JSONL.read_text().splitlines():
        record = json.loads(line)
        found += [{**alert, "received": record["received"]} for alert in record.get("alerts", [])]
    return found


def matches(alert: dict, name: str, labels: dict[str, str]) -> bool:
    have = alert.get("labels", {})
    return have.get("alertname") == name and all(have.get(k) == v for k, v in labels.items())


def epoch(rfc3339: str) -> float:
    """Prometheus' timestamps (nanoseconds, Z) as epoch seconds."""
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", rfc3339).replace("Z", "+00:00")).timestamp()


def diagnostics() -> str:
    """The webhook's last lines, Prometheus' alerts and Slurm's queue, for a failure message."""
    log = ALERTS_LOG.read_text().splitlines()[-15:] if ALERTS_LOG.exists() else ["(no alerts.log)"]
    try:
        active = [f"{a['labels']} {a['state']} since {a['activeAt']}" for a in prometheus_alerts()]
    except OSError as exc:
        active = [f"Prometheus does not answer: {exc}"]
    return (f"\n--- last webhook lines ({ALERTS_LOG}):\n" + "\n".join(log) +
            f"\n--- Prometheus {PROMETHEUS}/api/v1/alerts:\n" + "\n".join(active or ["(none)"]) +
            f"\n--- Slurm:\n{slurm_activity() or '(no job, no reservation)'}")


def slurm_activity() -> str:
    """Slurm's jobs and reservations, one a line ("" when there are none)."""
    jobs = subprocess.run(["squeue", "-h", "-o", "job %i %j %T %R"], capture_output=True, text=True).stdout
    reservations = subprocess.run(["scontrol", "-o", "show", "reservation"], capture_output=True, text=True).stdout
    return "\n".join(line for line in (jobs + reservations).splitlines() if line.strip() and "No reservations" not in line)


def wait_for(what: str, probe, timeout: float, interval: float = 1.0):
    """client.wait_for, with the webhook's, Prometheus' and Slurm's view in the TimeoutError."""
    return client.wait_for(what, probe, timeout, interval, detail=diagnostics)


def notified(name: str, labels: dict[str, str], status: str, since: float, timeout: float,
             starts_at: str | None = None) -> dict:
    """The first notification of alert ``name`` with ``labels`` in ``status`` ("firing", "resolved") the
    webhook received after ``since`` (for a resolution: of the alert that started at ``starts_at``)."""
    def probe():
        return next((a for a in notifications() if matches(a, name, labels) and a["status"] == status
                     and a["received"] >= since and starts_at in (None, a.get("startsAt"))), None)
    return wait_for(f"{status} notification of {name} {labels}", probe, timeout)


def pending(name: str, labels: dict[str, str], timeout: float) -> float:
    """When Prometheus found the alert's expression true (activeAt), once it lists it pending or firing."""
    def probe():
        return next((epoch(a["activeAt"]) for a in prometheus_alerts() if matches(a, name, labels)), None)
    return wait_for(f"pending {name} {labels} in Prometheus", probe, timeout)


def cleared(name: str, labels: dict[str, str], timeout: float) -> float:
    """When Prometheus no longer lists the alert."""
    def probe():
        return None if any(matches(a, name, labels) for a in prometheus_alerts()) else time.time()
    return wait_for(f"{name} {labels} cleared in Prometheus", probe, timeout)


# --- the models' jobs and their faults ---------------------------------------------------------------
class ModelJob:
    """One of dev's models, submitted with its own job script (CPUs only) on its pinned nodes."""

    def __init__(self, cluster: LocalCluster, model: str):
        self.cluster, self.model, self.id = cluster, model, ""
        self.submitted: list[str] = []

    def submit(self, *overrides: str, **env: str) -> str:
        self.id = self.cluster.sbatch(f"jobs/train_{self.model}.sh", "log.interval=1", *overrides,
                                      env={"OMP_NUM_THREADS": "1", **env}, user=self.model,  # as on the cluster
                                      options=["--gpus-per-node=0", f"--nodelist={MODEL_NODES[self.model]}"])
        self.submitted.append(self.id)
        return self.id

    def records(self) -> list[dict]:
        path = FSX / f"logs/{self.model}/metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines if line.endswith("}")]

    def steps_since(self, when: float) -> int:
        return sum(1 for r in self.records() if "loss" in r and r.get("time", 0) >= when)

    def state(self) -> str:
        return self.cluster.jobs(self.id)[0].get("JobState", "")

    def cancel(self) -> None:
        """scancel its job (the trainer saves and stops, as on a time limit) and wait for it to end."""
        subprocess.run(["scancel", self.id], check=False)
        self.cluster.wait(self.id, timeout=120)

    def step_seconds(self) -> float:
        """Median step time of its last ten logged steps."""
        times = [r["step_time_s"] for r in self.records() if "step_time_s" in r][-10:]
        if not times:
            raise RuntimeError(f"{self.model} has logged no step time yet")
        return statistics.median(times)

    def trainer(self) -> list[int]:
        """Every process of the trainer, torchrun and its descendants on every node, parents first."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(stat.parent.name))
        workers = set(worker_pids(self.id))
        tree = sorted({ppid for ppid, kids in children.items() if workers & set(kids)})  # the torchruns
        for pid in tree:  # grows as it goes: breadth first
            tree += children.get(pid, [])
        return tree

    def finish(self, saved: Path) -> None:
        """Cancel its jobs, wait for them to end, and put back what the model's folders held before."""
        subprocess.run(["scancel", *self.submitted], check=False)
        for job in self.submitted:
            try:
                self.cluster.wait(job, timeout=120)
            except RuntimeError as exc:  # slurmctld forgets a job MinJobAge (300 s) after it ended
                if "Invalid job id" not in str(exc):
                    raise
        restore_model(self.model, saved)


class Killer:
    """Kills every training worker of a job as soon as it appears: a rank that dies at every start."""

    def __init__(self, job: ModelJob):
        self.job, self.kills, self._stop = job, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Killer":
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        seen = set()
        while not self._stop.is_set():
            for pid in set(worker_pids(self.job.id)) - seen:
                seen.add(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.kills.append(time.time())
                except ProcessLookupError:
                    pass
            time.sleep(0.25)  # a scan of /proc is ~10 ms of CPU; a worker takes seconds to its first step

    def wait_kills(self, count: int, timeout: float) -> float:
        """When the ``count``-th worker was killed."""
        return wait_for(f"{count} kills of {self.job.model}'s workers (job {self.job.id})",
                        lambda: self.kills[count - 1] if len(self.kills) >= count else None, timeout, 0.2)


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class Throttle:
    """Lets processes run ``duty`` of every second (SIGSTOP, then SIGCONT): a node that crawls, as one
    whose GPUs slow their clocks does, without stopping."""

    def __init__(self, pids: list[int], duty: float = 0.1):
        self.pids, self.duty, self._stop = pids, duty, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        signal_all(self.pids, signal.SIGCONT)

    def _run(self) -> None:
        while not self._stop.is_set():
            signal_all(self.pids, signal.SIGSTOP)
            if self._stop.wait(1 - self.duty):
                break
            signal_all(self.pids, signal.SIGCONT)
            self._stop.wait(self.duty)


def in_node(node: str, script: str) -> None:
    """Run a shell ``script`` in ``node``'s mount namespace, where its slurmd and jobs see /fsx."""
    pid = (BASE / f"run/slurmd-{node}.pid").read_text().strip()
    subprocess.run(["nsenter", f"--mount=/proc/{pid}/ns/mnt", "--", "sh", "-c", script], check=True)


def fill_checkpoints(model: str) -> None:
    """The model's checkpoint folder full, as its nodes see it: a 1 MiB tmpfs over it, filled."""
    folder = f"/fsx/checkpoints/{model}"
    for node in hostnames(MODEL_NODES[model]):
        in_node(node, f"mount -t tmpfs -o size=1m alert-drill {folder} && "
                      f"(head -c 2097152 /dev/zero > {folder}/fill 2>/dev/null; true)")


def free_checkpoints(model: str) -> None:
    folder = f"/fsx/checkpoints/{model}"
    for node in hostnames(MODEL_NODES[model]):
        in_node(node, f"while mountpoint -q {folder}; do umount -l {folder}; done")


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def move_model_aside(model: str, saved: Path) -> None:
    """The model's metrics.jsonl and checkpoints go to ``saved``: its next job starts as a model never run."""
    saved.mkdir(parents=True)
    for source in (FSX / f"logs/{model}/metrics.jsonl", FSX / f"checkpoints/{model}"):
        if source.exists():
            source.rename(saved / source.name)
    make_model_folders(model)


def restore_model(model: str, saved: Path) -> None:
    subprocess.run(["rm", "-rf", str(FSX / f"logs/{model}/metrics.jsonl"), str(FSX / f"checkpoints/{model}")],
                   check=True)
    for name, target in (("metrics.jsonl", FSX / f"logs/{model}/metrics.jsonl"), (model, FSX / f"checkpoints/{model}")):
        if (saved / name).exists():
            (saved / name).rename(target)
    make_model_folders(model)


def make_model_folders(model: str) -> None:
    """The model's folders as the node setup makes them (its user's, 2755), where missing: its job cannot make
    them in the file systems' roots, and Slurm does not create --output's folder."""
    for folder in (FSX / f"checkpoints/{model}", FSX / f"logs/{model}"):
        if not folder.exists():
            folder.mkdir(parents=True)
            give_to(model, folder)
            folder.chmod(0o2755)


# --- the demo ----------------------------------------------------------------------------------------
def follow_log(stop: threading.Event) -> None:
    """Print the webhook's lines as they arrive."""
    offset = ALERTS_LOG.stat().st_size if ALERTS_LOG.exists() else 0
    while not stop.wait(0.5):
        if ALERTS_LOG.exists() and ALERTS_LOG.stat().st_size > offset:
            with open(ALERTS_LOG) as f:
                f.seek(offset)
                text = f.read()
            offset += len(text.encode())
            print("".join(f"  webhook: {line}\n" for line in text.splitlines()), end="", flush=True)


def crash_loop(cluster: LocalCluster, saved: Path) -> None:
    job = ModelJob(cluster, "model1")
    labels = {"model": "model1"}
    try:
        job.submit("train.steps=3000", MAX_RECOVERIES="20")
        print(f"model1 job {job.id} (MAX_RECOVERIES=20): its workers are killed at every start", flush=True)
        with Killer(job) as killer:
            first = killer.wait_kills(1, 120)
            firing = notified("TrainingCrashLooping", labels, "firing", first, 4 * DETECT_S)
        fixed = time.time()
        print(f"model1: TrainingCrashLooping {firing['received'] - first:.0f} s after the first kill; "
              "its workers are left alone now", flush=True)
        resolved = notified("TrainingCrashLooping", labels, "resolved", fixed, 2 * DETECT_S, firing["startsAt"])
        print(f"model1: trains again, the alert cleared {resolved['received'] - fixed:.0f} s later", flush=True)
    finally:
        job.finish(saved)


def stall(cluster: LocalCluster, saved: Path) -> None:
    job = ModelJob(cluster, "model2")
    labels = {"model": "model2"}
    try:
        since = time.time()
        job.submit("train.steps=3000")
        wait_for(f"model2 job {job.id}'s first steps", lambda: True if job.steps_since(since) >= 5 else None, 180, 0.5)
        tree = job.trainer()
        stopped = time.time()
        signal_all(tree, signal.SIGSTOP)
        print(f"model2 job {job.id}: torchrun and its workers stopped (SIGSTOP, {len(tree)} processes: the "
              "trainer's own watchdog too)", flush=True)
        try:
            firing = notified("TrainingStalled", labels, "firing", stopped, 3 * DETECT_S)
        finally:
            fixed = time.time()
            signal_all(tree, signal.SIGCONT)
        print(f"model2: TrainingStalled {firing['received'] - stopped:.0f} s after the stop; SIGCONT", flush=True)
        resolved = notified("TrainingStalled", labels, "resolved", fixed, 2 * DETECT_S, firing["startsAt"])
        print(f"model2: goes on, the alert cleared {resolved['received'] - fixed:.0f} s later", flush=True)
    finally:
        job.finish(saved)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m local_cluster.alert_drills", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    cluster = LocalCluster()
    try:
        prometheus_alerts()
    except OSError as exc:
        print(f"error: Prometheus does not answer at {PROMETHEUS} ({exc}) — start the cluster with "
              "local_cluster/cluster.sh up", file=sys.stderr)
        return 2
    try:  # the drills pin the models to their nodes: another job there would hold them up
        wait_for("cluster to itself: no job, no reservation", lambda: None if slurm_activity() else True, 120)
    except TimeoutError as exc:
        print(f"problem: {exc}", file=sys.stderr)
        return 1
    demo_data.build(FSX / "data/tokenized/sample")
    failures: list[BaseException] = []
    stop = threading.Event()
    follower = threading.Thread(target=follow_log, args=(stop,), daemon=True)
    follower.start()
    with tempfile.TemporaryDirectory(prefix="alert-drills-", dir=BASE) as saved:  # beside fsx/: rename works
        drills = {"model1": crash_loop, "model2": stall}

        def run(model: str) -> None:
            try:
                drills[model](cluster, Path(saved) / model)
            except BaseException as exc:  # reported below, once the other drill has ended too
                failures.append(exc)

        for model in drills:
            move_model_aside(model, Path(saved) / model)
        threads = [threading.Thread(target=run, args=(model,)) for model in drills]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    time.sleep(1)
    stop.set()
    follower.join()
    print(f"Prometheus' alerts: curl -s {PROMETHEUS}/api/v1/alerts; every notification: {ALERTS_JSONL}")
    for exc in failures:
        print(f"problem: {exc}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
