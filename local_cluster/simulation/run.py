"""One simulation run: prod's models on the simulation cluster, failures injected, everything recorded.

    cluster = SimCluster(nodes=80); cluster.up()
    models, settings, scenario = plan_models(Scenario(spares=2))  # shares, step and save times from the plan
    calibration = calibrate(cluster, models, settings, scenario)   # the local restart and replacement
    record = simulate(cluster, models, settings, scenario)         # the run; report.py tabulates it

Each model's job is its own jobs/train_<model>.sh from the jobs bundle the head node installed, run
with jobs/train.sh's ``TRAIN_LAUNCHER`` seam set to the torch-free stand-in trainer
(local_cluster/stand_ins/trainer.py). Slurm, the accounts and QOS, the job script, its recovery
(training.resilience.recovery, ``scontrol requeue``; Slurm's own requeue after a node failure) and the prolog and
epilog health checks are the real ones; clustermgtd is a stand-in too. Time is compressed by
``Scenario.scale`` (simulated seconds per wall second): the plan's step and save times, the replacement
time and the failure and straggler rates are scaled; what the local cluster itself takes (Slurm's requeue hold and
its wait for a dead node's step, a job's start, a node's boot) is not, and shows up in simulated time
multiplied by the scale: the simulation's effective overheads, which ``calibrate`` measures for the
prediction.

Slow nodes (stragglers) arrive beside the failures (faults.py). With ``Scenario.evict`` the stand-in
trainer evicts one as the trainer does (train.straggler_evict); without, it only reports it, and
``straggler_unattended_h`` after the node turned slow a person acts on the TrainingStraggler warning as
its runbook says (docs/monitoring.md): drains the node and requeues the job on it.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from cluster_config.goodput import DAY_S, Goodput, Stragglers, young_interval_s
from cluster_config.model_jobs import write_job_files
from cluster_config.plan import build_plan, spares_alternative
from cluster_config.settings import load_settings
from local_cluster.client import wait_for
from local_cluster.simulation.cluster import (FLAGS, REPO, USABLE, SimCluster, expand_hostlist, machine_cpu_s,
                                             process_usage)
from local_cluster.simulation.faults import (FIRST_NODE_LOST, KINDS, clear_slow, failure_times, slow_down,
                                            slow_markers)
from training.status import read_metrics

TRAINER = REPO / "local_cluster" / "stand_ins" / "trainer.py"
POLL_S = 0.5  # the watcher's look at Slurm, wall seconds
TREE_WIDTH = 7  # Slurm's REVERSE_TREE_WIDTH: a step of this many nodes or more ends over a tree
PARENT_RETRY_S = 5.0  # REVERSE_TREE_PARENT_RETRY: a dead tree root's children try it 5 times, 1 s apart


@dataclass(frozen=True)
class Scenario:
    spares: int = 0
    days: float = 14.0  # simulated
    scale: float = 2520.0  # simulated seconds per wall second: 14 days in 8 minutes
    failures_per_1000_node_days: float | None = None  # None: the settings' goodput assumption
    replacement_min: float | None = None  # a failed node's replacement; None: the settings'
    gpu_share: float = 0.5  # of the failures, GPU failures; the rest lose the whole node
    stragglers_per_1000_node_days: float | None = None  # None: the settings' goodput assumption
    straggler_slowdown: float | None = None  # None: the settings'
    straggler_unattended_h: float | None = None  # None: the settings'
    evict: bool = True  # the trainer evicts a straggler's node (train.straggler_evict); False: a person, later
    seed: int = 1
    env: str = "prod"

    def wall(self, simulated_s: float) -> float:
        return simulated_s / self.scale


@dataclass(frozen=True)
class ModelSim:
    """One model as the simulation runs it: its share and the plan's times (simulated seconds)."""

    name: str
    nodes: int
    gpus: int
    steps: int
    step_s: float
    save_s: float
    every: int  # checkpoint.every, steps: Young's interval for the failure rate
    plan: Goodput  # the plan's goodput row at production parameters
    plan_stragglers: Stragglers  # the plan's straggler row at production parameters (its detection window)


@dataclass
class Calibration:
    """What the local cluster takes, wall seconds, measured with every model training: per model and
    kind of failure, from the failure to the first step after the restart (detection immediate, a node
    free), and per failure, from the failure to the replaced node idle again (the stand-in for
    clustermgtd: found, waited for, booted)."""

    recovery_wall: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> kind -> seconds
    replacement_wall: list[float] = field(default_factory=list)
    nodes: dict[str, int] = field(default_factory=dict)

    def recovery(self, model: str, kind: str | None = None, gpu_share: float = 0.5) -> float:
        """The model's restart after a failure of ``kind`` (None: the scenario's mix, a lost node being the
        first one in 1 of the model's nodes). A kind not measured for the model takes the mean of the
        models alike: Slurm (22.05 to 24.x) collects the end of a step of 7 nodes or more over a tree,
        where a dead node holds its parent for 60 s (REVERSE_TREE_CHILDREN_TIMEOUT) before the job can
        end and requeue; the first node is the tree's root, whose loss holds no one (its children try it
        5 times a second apart, REVERSE_TREE_PARENT_RETRY), so it costs what a loss without a tree does."""
        nodes = self.nodes.get(model, 1)
        if kind is None:
            lost = (self.recovery(model, FIRST_NODE_LOST) + (nodes - 1) * self.recovery(model, "node lost")) / nodes
            return gpu_share * self.recovery(model, "GPU failed") + (1 - gpu_share) * lost
        measured = self.recovery_wall.get(model, {})
        if kind in measured:
            return measured[kind]
        tree = nodes >= TREE_WIDTH
        if kind == FIRST_NODE_LOST:
            if not tree:
                return self.recovery(model, "node lost")
            without_tree = self._mean(kind) or self._mean("node lost", tree=False)
            return without_tree + (0.0 if self._mean(kind) else PARENT_RETRY_S)
        return self._mean(kind, tree) or self._mean(kind)

    def _mean(self, kind: str, tree: bool | None = None) -> float:
        values = [v[kind] for m, v in self.recovery_wall.items()
                  if kind in v and (tree is None or (self.nodes[m] >= TREE_WIDTH) == tree)]
        return sum(values) / len(values) if values else 0.0

    @property
    def replacement(self) -> float:
        return sum(self.replacement_wall) / len(self.replacement_wall)


@dataclass
class RunRecord:
    """What a run leaves for the report: the models, times (wall, epoch s) and the files' records."""

    scenario: Scenario
    models: list[ModelSim]
    t0: float = 0.0
    end: float = 0.0
    failures: list[dict] = field(default_factory=list)  # injected: time, node, kind, model, job
    stragglers: list[dict] = field(default_factory=list)  # slowed: time, node, model, job; out of service: gone
    replacements: list[dict] = field(default_factory=list)  # clustermgtd stand-in's lines
    timeline: list[dict] = field(default_factory=list)  # the watcher's samples
    metrics: dict[str, list[dict]] = field(default_factory=dict)  # each model's metrics.jsonl
    final: dict[str, dict] = field(default_factory=dict)  # per model at the end: latest, job state
    usage: dict = field(default_factory=dict)  # daemons' memory and CPU
    quarantined: list[str] = field(default_factory=list)  # nodes the health hook set FAIL (not replaced)
    wall_s: float = 0.0


def plan_models(scenario: Scenario, nodes: int | None = None) -> tuple[list[ModelSim], object, Scenario]:
    """The models with ``scenario.spares`` spares: the settings' shares (re-sized by the plan's
    ``spares_alternative`` when the spares differ), step and save times, Young's interval for the
    failure rate. ``nodes`` smaller than the plan's (a quick look on a small cluster) shrinks every
    share in proportion and keeps the plan's times. Returns the models, the settings and the scenario
    with the settings' failure rate and replacement time where it left them out."""
    settings = load_settings(scenario.env)
    if scenario.spares != settings.gpu_queue.spare_nodes:
        settings = spares_alternative(settings, scenario.spares)
    assume = settings.goodput
    scenario = replace(scenario, failures_per_1000_node_days=_given(scenario.failures_per_1000_node_days,
                                                                   assume.failures_per_1000_node_days),
                       replacement_min=_given(scenario.replacement_min, assume.node_replacement_min),
                       stragglers_per_1000_node_days=_given(scenario.stragglers_per_1000_node_days,
                                                            assume.stragglers_per_1000_node_days),
                       straggler_slowdown=_given(scenario.straggler_slowdown, assume.straggler_slowdown),
                       straggler_unattended_h=_given(scenario.straggler_unattended_h, assume.straggler_unattended_h))
    rate = scenario.failures_per_1000_node_days
    plan = build_plan(settings)
    shares = [row.nodes for row in plan.rows]
    if nodes is not None and nodes < settings.gpu_queue.max_count:
        shares = _shrunk(shares, nodes - scenario.spares)
    steps = {model.name: model.steps for model in settings.models}
    models = []
    for row, share in zip(plan.rows, shares):
        every = max(1, round(young_interval_s(row.save_s, rate / 1000 * share) / row.step_s))
        models.append(ModelSim(row.name, share, share * settings.gpu_queue.gpus_per_instance, steps[row.name],
                               row.step_s, row.save_s, every, row.goodput, row.stragglers))
    return models, settings, scenario


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


def _shrunk(shares: list[int], total: int) -> list[int]:
    if total < len(shares):
        raise ValueError(f"{total} nodes for {len(shares)} models: use more nodes or fewer spares")
    scaled = [max(1, share * total // sum(shares)) for share in shares]
    while sum(scaled) < total:
        scaled[scaled.index(min(scaled))] += 1
    while sum(scaled) > total:
        scaled[scaled.index(max(scaled))] -= 1
    return scaled


# --- preparing the cluster ------------------------------------------------------------------------
def set_accounts(cluster: SimCluster, models: list[ModelSim]) -> None:
    """Each model's account and QOS at its share, by the head node's own slurm_accounts.sh."""
    listing = cluster.base / "run" / "simulation.models"
    listing.write_text("".join(f"{m.name} {m.nodes}\n" for m in models))
    script = cluster.jobs_home / "accounts" / "slurm_accounts.sh"
    cluster.slurm("bash", str(script), "--admin", "root", str(listing), timeout=300)


def prepare_jobs(cluster: SimCluster, settings, models: list[ModelSim]) -> Path:
    """A copy of the installed bundle with these settings' model jobs; fresh checkpoint and log folders.
    Jobs an interrupted run left are cancelled first: slurmctld keeps its queue across ``cluster.sh
    down`` and ``up``, and an old job would hold a model's QOS (and write into its fresh folders). Its nodes
    still out of service are set DOWN, for the stand-in clustermgtd to replace before the jobs start."""
    cancel_all(cluster)
    release(cluster, [n for n, (state, _) in cluster.node_states().items() if state not in USABLE],
            "left by an interrupted run")
    root = cluster.base / "simulation"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(cluster.jobs_home / "bundle" / "jobs", root / "jobs")
    write_job_files(settings, root / "jobs")
    for model in models:
        shutil.rmtree(cluster.fsx / "checkpoints" / model.name, ignore_errors=True)
        shutil.rmtree(cluster.fsx / "logs" / model.name, ignore_errors=True)
        (cluster.fsx / "logs" / model.name).mkdir(parents=True)  # Slurm does not create --output's folder
    shutil.rmtree(cluster.fsx / ".node-health", ignore_errors=True)  # the health check's fault markers
    shutil.rmtree(slow_markers(cluster), ignore_errors=True)  # the slow nodes' (a fresh cluster has none)
    history = cluster.fsx / "logs" / "node-health"  # the health hook's failure history: a fresh cluster's
    for path in history.glob("*") if history.is_dir() else ():
        path.unlink()
    return root


def submit(cluster: SimCluster, root: Path, model: ModelSim, scenario: Scenario) -> str:
    env = {**cluster.env, "TRAIN_LAUNCHER": f"python {TRAINER}", "JOBS_VENV": str(cluster.jobs_home / "venv"),
           "PYTHONPATH": "", "SIM_TIME_SCALE": repr(scenario.scale), "SIM_STEP_S": repr(model.step_s),
           "SIM_SAVE_S": repr(model.save_s), "SIM_SLOW_MARKERS": str(slow_markers(cluster)),
           # the retry budget's window (24 h) is simulated time too
           "RECOVERY_WINDOW_HOURS": repr(24 / scenario.scale)}
    # --no-kill=off: a lost node ends the job and Slurm requeues it, as the job script's own relaunch would with
    # no hot spare to take its place (prod holds none); the stand-in trainer's ranks do not see a peer die.
    command = ["sbatch", "--parsable", "--gpus-per-node=0", "--no-kill=off", f"--nodes={model.nodes}", f"jobs/train_{model.name}.sh",
               f"train.steps={model.steps}", f"checkpoint.every={model.every}", "checkpoint.every_minutes=0",
               f"train.straggler_evict={str(scenario.evict).lower()}"]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")
    return result.stdout.strip().split(";")[0]


def metrics_of(cluster: SimCluster, model: str) -> list[dict]:
    return read_metrics(cluster.fsx / "logs" / model / "metrics.jsonl")


def starts_after(records: list[dict], t: float) -> list[dict]:
    return [r for r in records if r.get("event") == "start" and r["time"] > t]


class Clustermgtd:
    """The stand-in for clustermgtd (local_cluster/stand_ins/clustermgtd.py) as a process beside the run."""

    def __init__(self, cluster: SimCluster, scenario: Scenario, name: str):
        self.log = cluster.base / "run" / f"{name}.jsonl"  # one line per replacement
        self.log.unlink(missing_ok=True)
        env = {**cluster.env, "PYTHONPATH": f"{REPO}:{REPO / 'jobs'}"}
        with open(self.log.with_suffix(".err"), "w") as errors:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "local_cluster.stand_ins.clustermgtd",
                 "--replacement-s", repr(scenario.wall(scenario.replacement_min * 60)), "--interval", "0.25",
                 "--markers", str(cluster.fsx / ".node-health"), "--log", str(self.log)],
                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=errors)

    def lines(self) -> list[dict]:
        return read_metrics(self.log)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=120)  # a reboot under way finishes first
        except subprocess.TimeoutExpired:
            self.process.kill()


def job_nodes(cluster: SimCluster) -> dict[str, tuple[str, str, bool]]:
    """node -> (model, job id, whether it is the job's first node) for every running job. The first node
    runs the batch script and rank 0, and roots the tree over which Slurm collects the step's end."""
    found = {}
    for job in cluster.jobs():
        if job["state"] in ("RUNNING", "COMPLETING") and job["nodelist"]:
            nodes = expand_hostlist(job["nodelist"])
            for node in nodes:
                found[node] = (job["name"], job["id"], node == nodes[0])
    return found


# --- calibration ------------------------------------------------------------------------------------
def calibrate(cluster: SimCluster, models: list[ModelSim], settings, scenario: Scenario, rounds: int = 2,
              stagger_s: float = 3.0) -> Calibration:
    """Measure each model's restart and a node's replacement as the run will see them: every model
    training, one failure per model per round, ``stagger_s`` apart; then cancel. Rounds 1 and 2: a GPU
    failure and the loss of a node other than the first, alternating between models (two rounds: both for
    every model), each on a node not failed before; round 3: the loss of the job's first node."""
    set_accounts(cluster, models)
    root = prepare_jobs(cluster, settings, models)
    manager = Clustermgtd(cluster, scenario, "calibration")
    calibration = Calibration(nodes={m.name: m.nodes for m in models})
    used: set[str] = set()
    try:
        cluster.wait_all_usable()
        for model in models:
            submit(cluster, root, model, scenario)
        wait_for("every model's first step",
                 lambda: all(starts_after(metrics_of(cluster, m.name), 0) for m in models), 600, interval=0.5)
        for round_ in range(rounds):
            failed: dict[str, tuple[float, str, str]] = {}
            for i, model in enumerate(models):
                time.sleep(stagger_s)
                nodes = {n: first for n, (name, _, first) in job_nodes(cluster).items() if name == model.name}
                kind = ("GPU failed", "node lost", FIRST_NODE_LOST)[(i + round_) % 2 if round_ < 2 else 2]
                if kind == FIRST_NODE_LOST:
                    node = next(n for n, first in nodes.items() if first)
                else:
                    node = max([n for n in nodes if n not in used and not nodes[n]] or nodes,
                               key=lambda n: int(n.removeprefix("node")))
                used.add(node)
                failed[model.name] = (time.time(), node, kind)
                KINDS[kind](cluster, node)
            for model in models:
                failed_at, node, kind = failed[model.name]
                start = wait_for(f"{model.name}'s restart",
                                 lambda: starts_after(metrics_of(cluster, model.name), failed_at), 300, 0.2)[0]
                calibration.recovery_wall.setdefault(model.name, {})[kind] = (start["time"] + scenario.wall(model.step_s)
                                                                             - failed_at)
                back = wait_for(f"{node}'s replacement", lambda: [r for r in manager.lines() if r["node"] == node
                                                                  and r["found"] >= failed_at and r.get("back")], 300, 0.2)[0]
                calibration.replacement_wall.append(back["back"] - failed_at)
    finally:
        finish(cluster, manager)
    return calibration


def cancel_all(cluster: SimCluster) -> None:
    """Every job of the cluster cancelled and gone from the queue."""
    for job in cluster.jobs():
        cluster.slurm("scancel", job["id"], check=False)
    wait_for("the jobs' end", lambda: not cluster.jobs(), 120, interval=0.5)


def release(cluster: SimCluster, nodes: list[str], reason: str) -> None:
    """Nodes set DOWN, which the stand-in clustermgtd replaces (as it does any DOWN static node)."""
    for node in nodes:
        cluster.slurm("scontrol", "update", f"nodename={node}", "state=down", f"reason={reason}", check=False)


def finish(cluster: SimCluster, manager: Clustermgtd) -> list[str]:
    """Cancel every job; once the failed nodes are replaced too, stop the stand-in for clustermgtd.
    Nodes the health hook quarantined (FAIL: clustermgtd leaves them) are released for replacement,
    as an operator would; their names are returned."""
    try:
        cancel_all(cluster)
        shutil.rmtree(slow_markers(cluster), ignore_errors=True)  # no longer slow: the run is over
        quarantined = [n for n, (state, _) in cluster.node_states().items() if state.rstrip(FLAGS) == "fail"]
        release(cluster, quarantined, "released for replacement after the simulation")
        cluster.wait_all_usable()
        return quarantined
    finally:
        manager.stop()


# --- the run ----------------------------------------------------------------------------------------
def simulate(cluster: SimCluster, models: list[ModelSim], settings, scenario: Scenario, log=print) -> RunRecord:
    record = RunRecord(scenario, models)
    started = time.monotonic()
    set_accounts(cluster, models)
    root = prepare_jobs(cluster, settings, models)
    manager = Clustermgtd(cluster, scenario, "replacements")
    rng = random.Random(scenario.seed)
    slow_rng = random.Random(f"stragglers {scenario.seed}")  # a stream of its own: the seed's failures stay
    try:
        cluster.wait_all_usable()
        jobs = {m.name: submit(cluster, root, m, scenario) for m in models}
        wait_for("every model's first step",
                 lambda: all(starts_after(metrics_of(cluster, m.name), 0) for m in models), 600, interval=0.5)
        record.t0 = time.time()
        record.end = record.t0 + scenario.wall(scenario.days * DAY_S)
        rate = scenario.failures_per_1000_node_days
        schedule = [record.t0 + scenario.wall(t) for t in failure_times(rate, cluster.nodes, scenario.days, rng)]
        slow_schedule = [record.t0 + scenario.wall(t) for t in failure_times(scenario.stragglers_per_1000_node_days,
                                                                             cluster.nodes, scenario.days, slow_rng)]
        log(f"simulation: {len(models)} models on {cluster.nodes} nodes, {scenario.spares} spare(s), "
            f"{scenario.days:g} days in {scenario.wall(scenario.days * DAY_S):.0f} s, {len(schedule)} failure(s) and "
            f"{len(slow_schedule)} slow node(s) drawn, stragglers {'evicted' if scenario.evict else 'unattended'}")
        pids = cluster.daemon_pids()
        usage_start = {name: process_usage(p) for name, p in pids.items()}
        machine_start = machine_cpu_s()
        rss_samples: dict[str, list[float]] = {name: [] for name in [*pids, "node processes"]}
        while (now := time.time()) < record.end:
            sample = watch(cluster, models, now)
            record.timeline.append(sample)
            while schedule and schedule[0] <= time.time():
                schedule.pop(0)
                inject(cluster, rng, scenario, record, log)
            while slow_schedule and slow_schedule[0] <= time.time():
                slow_schedule.pop(0)
                slow(cluster, slow_rng, scenario, record, log)
            attend(cluster, scenario, record, log)
            if len(record.timeline) % 20 == 1:  # every 10 s
                for name, p in cluster.daemon_pids().items():
                    rss_samples[name].append(process_usage(p)[0])
                everything = [pid for node in cluster.node_names() for pid in cluster.node_pids(node)]
                rss_samples["node processes"].append(process_usage(everything)[0])
            time.sleep(max(0.0, min(POLL_S, record.end - time.time())))
        pids_end = cluster.daemon_pids()
        usage_end = {name: process_usage(p) for name, p in pids_end.items()}
        record.usage = {name: {"count": len(pids_end[name]), "rss_mib": max(rss_samples[name], default=0.0),
                               "cpu_s": usage_end[name][1] - usage_start[name][1]} for name in pids_end}
        # what runs in the nodes: slurmd, job steps, batch scripts, the stand-in trainers
        record.usage["node processes"] = {"rss_mib": max(rss_samples["node processes"], default=0.0)}
        record.usage["wall_s"] = record.end - record.t0
        record.usage["machine_cpu_s"] = machine_cpu_s() - machine_start  # everything: jobs, both clusters
        record.usage["cpus"] = os.cpu_count()
        record.final = final_state(cluster, models, jobs)
    finally:
        record.quarantined = finish(cluster, manager)
    record.replacements = manager.lines()
    record.metrics = {m.name: metrics_of(cluster, m.name) for m in models}
    record.wall_s = time.monotonic() - started
    return record


def watch(cluster: SimCluster, models: list[ModelSim], now: float) -> dict:
    """One look at Slurm: each model's running nodes and pending reason, and the idle nodes."""
    states = cluster.node_states()
    sample = {"time": now, "idle": sum(1 for s, _ in states.values() if s == "idle"), "models": {}}
    for job in cluster.jobs():
        entry = sample["models"].setdefault(job["account"], {"running": 0, "pending": ""})
        if job["state"] == "RUNNING":
            entry["running"] += int(job["nodes"])
        elif job["state"] == "PENDING":
            entry["pending"] = job["reason"]
    return sample


def inject(cluster: SimCluster, rng: random.Random, scenario: Scenario, record: RunRecord, log) -> None:
    """One failure: a node picked at random; one out of service already is skipped (see faults.py)."""
    node = f"node{rng.randint(1, cluster.nodes)}"
    kind = "GPU failed" if rng.random() < scenario.gpu_share else "node lost"
    state = cluster.node_states().get(node, ("?", ""))[0]
    at = time.time()
    if state not in USABLE:  # out of service already (down, drained, being replaced, quarantined)
        record.failures.append({"time": at, "node": node, "kind": kind, "skipped": state})
        return
    model, job, first = job_nodes(cluster).get(node, ("", "", False))
    kind = FIRST_NODE_LOST if kind == "node lost" and first else kind
    KINDS[kind](cluster, node)
    record.failures.append({"time": at, "node": node, "kind": kind, "model": model, "job": job, "state": state})
    log(f"  day {(at - record.t0) * scenario.scale / DAY_S:5.2f}: {kind} on {node} ({model or 'idle'})")


def slow(cluster: SimCluster, rng: random.Random, scenario: Scenario, record: RunRecord, log) -> None:
    """One node turns slow: picked at random, as a failure is; one out of service already is skipped."""
    node = f"node{rng.randint(1, cluster.nodes)}"
    state = cluster.node_states().get(node, ("?", ""))[0]
    at = time.time()
    if state not in USABLE:
        record.stragglers.append({"time": at, "node": node, "skipped": state})
        return
    model, job, _ = job_nodes(cluster).get(node, ("", "", False))
    slow_down(cluster, node, scenario.straggler_slowdown)
    record.stragglers.append({"time": at, "node": node, "model": model, "job": job, "state": state})
    log(f"  day {(at - record.t0) * scenario.scale / DAY_S:5.2f}: {node} {scenario.straggler_slowdown:.0%} slow "
        f"({model or 'idle'})")


def attend(cluster: SimCluster, scenario: Scenario, record: RunRecord, log) -> None:
    """The slow nodes: one out of service (evicted and drained, failed, taken out by a person) loses its
    marker, its replacement being a new instance. Without eviction, a person acts ``straggler_unattended_h``
    after the node turned slow, as TrainingStraggler's runbook says: drains it and requeues its job."""
    active = [s for s in record.stragglers if "skipped" not in s and "gone" not in s]
    if not active:
        return
    states = cluster.node_states()
    for straggler in active:
        node = straggler["node"]
        state, reason = states.get(node, ("?", ""))
        if state not in USABLE:
            clear_slow(cluster, node)
            straggler.update(gone=time.time(), state_after=state, reason_after=reason)
        elif (not scenario.evict and "operator" not in straggler
              and time.time() >= straggler["time"] + scenario.wall(scenario.straggler_unattended_h * 3600)):
            model, job, _ = job_nodes(cluster).get(node, ("", "", False))
            cluster.slurm("scontrol", "update", f"nodename={node}", "state=drain",
                          f"reason=straggler: {model or 'no job'} slow since day "
                          f"{(straggler['time'] - record.t0) * scenario.scale / DAY_S:.2f} (TrainingStraggler runbook)")
            if job:
                cluster.slurm("scontrol", "requeue", job, check=False)
            straggler.update(operator=time.time(), operator_model=model, operator_job=job)
            log(f"  day {(time.time() - record.t0) * scenario.scale / DAY_S:5.2f}: {node} drained by a person"
                + (f", {model}'s job {job} requeued" if job else ""))


def final_state(cluster: SimCluster, models: list[ModelSim], jobs: dict[str, str]) -> dict[str, dict]:
    """Per model at the end of the simulated time: its checkpoint, STATUS and job."""
    queue = {job["name"]: job for job in cluster.jobs()}
    final = {}
    for model in models:
        folder = cluster.fsx / "checkpoints" / model.name
        latest = (folder / "latest").read_text().strip() if (folder / "latest").exists() else ""
        status = (folder / "STATUS").read_text().strip() if (folder / "STATUS").exists() else ""
        job = queue.get(model.name, {})
        final[model.name] = {"latest_step": int(latest.removeprefix("step_")) if latest else 0, "status": status,
                             "job": jobs[model.name], "job_state": job.get("state", "gone"),
                             "reason": job.get("reason", "")}
    return final
