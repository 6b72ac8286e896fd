"""Goodput: what node failures cost each model of the plan, and what spare nodes buy back.

The model, per model of ``n`` nodes (docs/goodput.md derives it and gives the sources):

  failures     every node fails at ``λ = goodput.failures_per_1000_node_days / 1000`` per day,
               independently, whenever its model holds it (waits included): the model fails at
               ``Λ = λ n`` per day
  one failure  is recovered inside the job when one of the model's ``H`` hot spares is free (and it takes
               snapshots), else on fewer nodes where the model allows it (``models.<m>.min_nodes``), else by
               today's requeue:
               ``L = (1 - q) L_job + q L_without``, ``q = P(no hot spare)`` (1 without hot spares or snapshots),
               ``L_without = L_fewer`` where it goes on with fewer nodes, else ``L_requeue``
  in the job   ``L_job = detection_s + relaunch_s`` (every rank knows; a new job step starts and rendezvouses)
                       ``+ B / E`` (the hot spare loads the lost node's shards, ``B`` bytes, from their buddy
                         copy over the node's EFA bandwidth ``E``; survivors load their own from memory)
                       ``+ σ / 2`` (the steps since the last snapshot, ``σ`` apart: half on average)
  fewer nodes  ``L_fewer = detection_s + relaunch_s + B / E`` (survivors reshard the snapshots among themselves)
                       ``+ σ / 2`` (or, without snapshots, ``τ / 2 + save_s``: the file system's checkpoint)
                       ``+ (1 - n' / n) R x P(no spare)`` (the replacement time at ``n'`` of ``n`` nodes' pace: ``n'``
                         the most nodes below ``n``, at least ``min_nodes``, on which the global batch divides:
                         recovery.fewer_nodes; a spare node free in the queue ends it at once)
                       ``+ G`` (growing back onto the whole allocation; Slurm cannot give a running job a node): with
                         snapshots, ``G = grow_back_requeue_s + relaunch_s + B / E`` (a planned stop that keeps the
                         state in the nodes' memory, the requeue until the job runs again on them, the restart, and
                         the returning node's shards from the nodes holding them); without, ``save_s + recovery_s``
  requeue      ``L_requeue = recovery_s`` (detect, requeue, restart)
                       ``+ τ / 2 + save_s`` (the work since the last committed checkpoint: half
                         an interval on average, plus the save in flight, not yet committed)
                       ``+ R x P(no spare)`` (the wait for ParallelCluster's replacement node)
  hot spares   Slurm cannot add a node to a running job, so a used hot spare comes back only with the
               model's next job, ``T = goodput.hot_spare_refill_h`` later at most (the jobs' time limit).
               Spares are used at ``u = λ (n + H)`` a day (the spares' own failures too); a failure at a
               uniform time ``t`` of a job finds ``Poisson(u t)`` spares used before it, so
               ``q = 1 - (1 / X) Σ_{k=1..H} P(Poisson(X) >= k)``, ``X = u T`` (each term is
               ``∫_0^X P(Poisson(x) <= k - 1) dx``). An upper bound: a requeue also starts a new job with
               every spare back.
  ETTR         productive / wall time ``= 1 - Λ L``; days to finish ``= failure-free days / ETTR``;
               expected failures ``= Λ x days``; lost GPU-hours ``= (days - failure-free days) x 24 x GPUs``
  spares       with ``N`` nodes training, failures arrive at ``λ N`` per day and each failed node is
               replaced ``R`` later, so the nodes down at once are Poisson with mean ``a = λ N R`` (an
               M/G/∞ queue: the mean holds for any distribution of the replacement time). A failure
               finds no spare free when the nodes already down hold all ``S`` spares:
               ``P(no spare) = P(Poisson(a) >= S)``, 1 without spares. The model then waits the whole
               ``R`` (an upper bound: a replacement already under way may end sooner).
  interval τ   the one the model's training config runs: every ``checkpoint.every`` steps, or sooner
               after ``checkpoint.every_minutes``. Young's interval ``sqrt(2 x save_s / Λ)`` (Young
               1974), the classic optimum for a save that stops training, is given beside it.
  p95          the 95th percentile of the days: the failure count's 95th percentile (Poisson with the
               expected count as mean) times ``L`` on top of the failure-free days.

Stragglers (``Stragglers``, ``stragglers(goodput, settings, interval_s=..., margin=..., intervals=..., window=...)``):
a node slow but alive slows its whole model by its own excess ``x`` (a synchronous step waits for the slowest
rank); a model of ``n`` nodes meets ``σ n`` of them a day (``σ = goodput.stragglers_per_1000_node_days / 1000``). One costs ``t x / (1 + x)`` of
progress while it stays for ``t`` of wall time. Unattended, ``t`` runs until a person acts
(``goodput.straggler_unattended_h`` ``U`` after it turned slow; one arriving uniformly in a run of ``D`` stays
``U (1 - U / 2D)`` on average, ``D / 2`` if ``U > D``), and the person's drain and requeue is a restart
(``1 - U / D`` of them are in time). Evicted, ``t`` is the trainer's detection window
(the log intervals the seeded straggler study measured for a node at the margin, its 95th percentile, when the
model's rule is the study's; else ``train.straggler_intervals``, the least it can take; they run slowed:
``t = W (1 + x)`` for a window ``W`` at the normal step time, losing ``W x``), then the eviction. Either restart
costs what an eviction does: a save (requeue and eviction both save first: no rework), the recovery, and the
replacement wait when no spare is free. False evictions cost the same restart each, at the study's rate: none
in its healthy node-days, at most 3 in them (the 95 % bound of none seen) shown as the stress.
(``StragglerStudy``: cluster_config/straggler_study.json, written by ``python -m benchmarks.straggler_study
--figures`` and checked by tests/training/test_straggler_study.py.)

``goodput(row, settings)`` gives one model's ``Goodput`` (inputs and results) from its plan row;
``build_plan(settings).rows[i].goodput`` holds the same for every model (``.stress``: at ``goodput.stress_factor`` x
the failure rate). ``hot_spare_trade(row, settings, H, factor)`` sets ``H`` hot spares against none: the GPU-hours
they keep idle for the whole run against the GPU-hours of failures they save. A simulation of the cluster
compares its measured failures, lost GPU-hours, ETTR and days with these.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Protocol

from cluster_config.settings import Settings


class Run(Protocol):
    """What goodput needs of a model's run (the plan's ModelRow has it)."""

    name: str
    nodes: int
    gpus: int
    cost_per_hour_usd: float
    days: float  # without failures
    checkpoint_every_h: float
    save_s: float
    hot_spares: int
    snapshot_interval_s: float  # 0: no snapshots
    snapshot_bytes_per_node: float  # one node's shards of the training state: what its buddy sends a hot spare
    network_gb_s_per_node: float  # the node's EFA bandwidth, GB/s (0: unknown: no transfer counted)
    fewer_nodes: int  # the nodes it goes on with when no spare is free (0: it waits: models.<m>.min_nodes unset)
    fewer_nodes_possible: int  # the same were it allowed to go on with as few as one node: what the plan weighs

DAY_S = 86400.0
P95 = 0.95

# Slurm as the ParallelCluster release we deploy (render.PCLUSTER_VERSION) ships it (its release notes).
SLURM_OF_PCLUSTER = {"3.16.1": (25, 11, 8)}
EXPEDITED_REQUEUE_SINCE = (25, 11)  # sbatch --requeue=expedite (Slurm 25.11's release notes)
# Slurm runs it only with SlurmctldParameters=enable_expedited_requeue in slurm.conf (sbatch's manual; SchedMD's
# test notes expect a submission asking for it to be refused otherwise), and ParallelCluster refuses SlurmctldParameters in
# Scheduling.SlurmSettings.CustomSlurmSettings (its SLURM_SETTINGS_DENY_LIST; checked by tests/cluster_config).
CONTROLLER_PARAMETERS_SETTABLE = False


def expedited_requeue(pcluster_version: str) -> tuple[bool, str]:
    """Whether a cluster of this ParallelCluster version can requeue the jobs with Slurm's expedited requeue (restart
    at once, as the highest-priority job, on the nodes it held), and why (not)."""
    slurm = SLURM_OF_PCLUSTER.get(pcluster_version)
    if slurm is None:
        return False, f"ParallelCluster {pcluster_version}'s Slurm is not known here (SLURM_OF_PCLUSTER)"
    version = ".".join(map(str, slurm))
    if slurm[:2] < EXPEDITED_REQUEUE_SINCE:
        return False, f"Slurm {version} (ParallelCluster {pcluster_version}) has no expedited requeue"
    if not CONTROLLER_PARAMETERS_SETTABLE:
        return False, (f"Slurm {version} (ParallelCluster {pcluster_version}) has --requeue=expedite, but it needs "
                       "SlurmctldParameters=enable_expedited_requeue, which ParallelCluster's CustomSlurmSettings refuse: "
                       "the jobs keep --requeue and a requeued job waits out Slurm's hold (AuthInfo cred_expire)")
    return True, f"Slurm {version} (ParallelCluster {pcluster_version}): --requeue=expedite"


def young_interval_s(save_s: float, failures_per_day: float) -> float:
    """Young's checkpoint interval, seconds: sqrt(2 x save time / failure rate); inf without failures."""
    if failures_per_day <= 0:
        return math.inf
    return math.sqrt(2 * save_s / (failures_per_day / DAY_S))


# Above this mean the quantile's exact sum would take about as many terms as the mean (a hang for a
# mean of billions); the normal approximation is within a count of it there.
EXACT_QUANTILE_MEAN = 1000


def _poisson_pmf(mean: float, k: int) -> float:
    """P(Poisson(mean) = k), in logs: exp(-mean) and mean**k alone underflow or overflow for large means."""
    return math.exp(-mean + k * math.log(mean) - math.lgamma(k + 1))


def p_no_spare(mean_down: float, spares: int) -> float:
    """P(Poisson(mean_down) >= spares): a failure finds every spare held by nodes already down."""
    if mean_down <= 0:
        return 0.0 if spares else 1.0
    below = sum(_poisson_pmf(mean_down, k) for k in range(spares))
    return max(0.0, 1.0 - below)


def p_no_hot_spare(uses_per_day: float, spares: int, refill_days: float) -> float:
    """A failure finds all ``spares`` hot spares of its model used: spares are used at ``uses_per_day`` and
    come back every ``refill_days`` (a new job); the failure falls uniformly in that time."""
    if spares == 0:
        return 1.0
    used = uses_per_day * refill_days  # X
    if used <= 0:
        return 0.0
    return max(0.0, 1.0 - sum(p_no_spare(used, k) for k in range(1, spares + 1)) / used)


def poisson_quantile(mean: float, q: float) -> int | float:
    """The smallest k with P(Poisson(mean) <= k) >= q (inf for an infinite mean)."""
    if not math.isfinite(mean):
        return math.inf
    if mean <= 0:
        return 0
    if mean > EXACT_QUANTILE_MEAN:  # continuity-corrected: P(X <= k) ~ Phi((k + 0.5 - mean) / sqrt(mean))
        return math.ceil(mean + NormalDist().inv_cdf(q) * math.sqrt(mean) - 0.5)
    k, cdf = 0, _poisson_pmf(mean, 0)
    while cdf < q:
        k += 1
        cdf += _poisson_pmf(mean, k)
    return k


@dataclass(frozen=True)
class Goodput:
    """One model's failures and what they cost. Inputs first; the results are derived from them."""

    name: str
    nodes: int
    gpus: int
    cost_per_hour_usd: float
    failure_free_days: float  # the plan's days at its MFU, nothing failing
    failures_per_day: float  # Λ = λ x nodes
    checkpoint_interval_s: float  # τ, as the model's training config saves
    save_s: float  # one checkpoint at the checkpoint file system's throughput
    recovery_s: float  # detect, requeue, restart
    replacement_s: float  # R: ParallelCluster replacing a failed node
    p_no_spare: float  # a failure finds no spare node free
    # Recovery inside the job; without snapshots or hot spares every failure takes the requeue path.
    snapshot_interval_s: float = 0.0  # σ: checkpoint.snapshot_every steps; 0: no snapshots
    hot_spares: int = 0  # H: the model's (models.<m>.hot_spares)
    detection_s: float = 0.0
    relaunch_s: float = 0.0
    grow_back_requeue_s: float = 0.0  # the grow-back's stop (a snapshot held in memory) and requeue, until it runs again
    transfer_s: float = 0.0  # the lost node's shards from their buddy copy, over EFA
    p_no_hot_spare: float = 1.0  # q: a failure finds every hot spare used (1 without snapshots)
    fewer_nodes: int = 0  # n': the nodes it goes on with when no spare is free (0: it waits for a replacement)

    @property
    def young_interval_s(self) -> float:
        return young_interval_s(self.save_s, self.failures_per_day)

    @property
    def rework_s(self) -> float:
        """Work lost to a failure: half an interval, plus the save in flight (not yet committed)."""
        return self.checkpoint_interval_s / 2 + self.save_s

    @property
    def replacement_wait_s(self) -> float:
        """With no spare free, the wait for the replaced node beyond the model's own recovery: the
        replacement starts as the failure is found and runs while the job is requeued (the 80-node
        simulation showed the two overlap: docs/goodput.md)."""
        return max(0.0, self.replacement_s - self.recovery_s) * self.p_no_spare

    @property
    def requeue_lost_s(self) -> float:
        """A failure recovered by today's path: the job requeued, restarted from the last checkpoint."""
        return self.recovery_s + self.rework_s + self.replacement_wait_s

    @property
    def in_job_lost_s(self) -> float:
        """A failure recovered inside the job onto a hot spare, from the snapshots."""
        return self.detection_s + self.relaunch_s + self.transfer_s + self.snapshot_interval_s / 2

    @property
    def grow_back_s(self) -> float:
        """Back from fewer nodes to all of them: a planned stop that keeps the state in memory, the requeue onto the
        nodes holding it, the restart and the returning node's shards over EFA; without snapshots, a planned stop that
        saves to the file system and the requeue's restart from it."""
        if self.snapshot_interval_s:
            return self.grow_back_requeue_s + self.relaunch_s + self.transfer_s
        return self.save_s + self.recovery_s

    @property
    def fewer_lost_s(self) -> float:
        """A failure with no spare free, recovered by going on with ``fewer_nodes`` until the replacement is up."""
        redo = self.snapshot_interval_s / 2 if self.snapshot_interval_s else self.rework_s
        slower = (1 - self.fewer_nodes / self.nodes) * self.replacement_s * self.p_no_spare
        return self.detection_s + self.relaunch_s + self.transfer_s + redo + slower + self.grow_back_s

    @property
    def without_spare_lost_s(self) -> float:
        return self.fewer_lost_s if self.fewer_nodes else self.requeue_lost_s

    @property
    def lost_per_failure_s(self) -> float:
        q = self.p_no_hot_spare
        return self.without_spare_lost_s if q >= 1 else (1 - q) * self.in_job_lost_s + q * self.without_spare_lost_s

    @property
    def ettr(self) -> float:
        """Effective training time ratio: productive time / wall time (0: failures outpace progress)."""
        return max(0.0, 1.0 - self.failures_per_day * self.lost_per_failure_s / DAY_S)

    @property
    def days(self) -> float:
        return self.failure_free_days / self.ettr if self.ettr else math.inf

    @property
    def expected_failures(self) -> float:
        return self.failures_per_day * self.days

    @property
    def days_p95(self) -> float:
        return self.failure_free_days + poisson_quantile(self.expected_failures, P95) * self.lost_per_failure_s / DAY_S

    @property
    def lost_node_hours(self) -> float:
        return (self.days - self.failure_free_days) * 24 * self.nodes

    @property
    def lost_gpu_hours(self) -> float:
        return (self.days - self.failure_free_days) * 24 * self.gpus

    @property
    def lost_usd(self) -> float:
        return (self.days - self.failure_free_days) * 24 * self.cost_per_hour_usd


def mean_nodes_down(settings: Settings) -> float:
    """Nodes down at once on average: failures of every model's nodes x the replacement time."""
    assume = settings.goodput
    training = sum(model.nodes for model in settings.models)
    return assume.failures_per_1000_node_days / 1000 * training * assume.node_replacement_min / 1440


def goodput(row: Run, settings: Settings, *, hot_spares: int | None = None, failure_factor: float = 1.0,
            fewer_nodes: int | None = None) -> Goodput:
    """``row``'s model (a plan row: nodes, failure-free days, checkpoint and snapshot intervals, save time,
    snapshot bytes per node and the EFA bandwidth) under ``settings.goodput``, ``settings.gpu_queue.spare_nodes``
    and its ``hot_spares`` and ``fewer_nodes`` (default: its entry's), every failure rate ``failure_factor``
    times the settings'."""
    assume = settings.goodput
    rate = assume.failures_per_1000_node_days / 1000 * failure_factor  # λ, per node and day
    spares = row.hot_spares if hot_spares is None else hot_spares
    snapshots = row.snapshot_interval_s > 0
    down = mean_nodes_down(settings) * failure_factor
    return Goodput(
        name=row.name, nodes=row.nodes, gpus=row.gpus, cost_per_hour_usd=row.cost_per_hour_usd,
        failure_free_days=row.days,
        failures_per_day=rate * row.nodes,
        checkpoint_interval_s=row.checkpoint_every_h * 3600, save_s=row.save_s, recovery_s=assume.recovery_s,
        replacement_s=assume.node_replacement_min * 60,
        p_no_spare=p_no_spare(down, settings.gpu_queue.spare_nodes),
        snapshot_interval_s=row.snapshot_interval_s, hot_spares=spares, detection_s=assume.detection_s,
        relaunch_s=assume.relaunch_s, grow_back_requeue_s=assume.grow_back_requeue_s,
        transfer_s=row.snapshot_bytes_per_node / (row.network_gb_s_per_node * 1e9) if row.network_gb_s_per_node else 0.0,
        p_no_hot_spare=(p_no_hot_spare(rate * (row.nodes + spares), spares, assume.hot_spare_refill_h / 24)
                        if snapshots else 1.0),
        fewer_nodes=row.fewer_nodes if fewer_nodes is None else fewer_nodes,
    )


@dataclass(frozen=True)
class HotSpareTrade:
    """What ``spares`` hot spares buy one model at one failure rate: GPU-hours they keep idle (held for the
    whole run) against the GPU-hours of failures they save, compared with none."""

    spares: int
    failure_factor: float
    without: Goodput
    with_spares: Goodput

    @property
    def idle_gpu_hours(self) -> float:
        return self.spares * (self.with_spares.gpus / self.with_spares.nodes) * self.with_spares.days * 24

    @property
    def saved_gpu_hours(self) -> float:
        return self.without.lost_gpu_hours - self.with_spares.lost_gpu_hours

    @property
    def pays(self) -> bool:
        return self.saved_gpu_hours > self.idle_gpu_hours


def hot_spare_trade(row: Run, settings: Settings, spares: int, failure_factor: float = 1.0) -> HotSpareTrade:
    return HotSpareTrade(spares, failure_factor, goodput(row, settings, hot_spares=0, failure_factor=failure_factor),
                         goodput(row, settings, hot_spares=spares, failure_factor=failure_factor))


@dataclass(frozen=True)
class Stragglers:
    """One model's slow nodes and what they cost, unattended and evicted by the trainer."""

    name: str
    gpus: int
    days: float  # the model's days with its failures (Goodput.days): the time stragglers can arrive in
    per_day: float  # σ x nodes
    slowdown: float  # x: a slow node's step-time excess
    unattended_s: float  # without eviction: from the node turning slow until a person drains it and requeues
    detect_s: float  # with eviction: the detection's intervals x log.interval x step time (its steps, unslowed)
    evict_s: float  # a restart that saved first: the save, the recovery, the replacement wait when no spare is free
    detect_intervals: float = 0.0  # the log intervals detect_s is made of
    measured: bool = False  # detect_intervals from the study (the model's rule is the study's), else its window
    false_per_day: float = 0.0  # false evictions a day, the study's rate over the model's nodes
    false_bound_per_day: float = 0.0  # the same at the study's 95 % bound

    @property
    def expected(self) -> float:
        return self.per_day * self.days

    def _lost_s(self, slow_s: float) -> float:
        """Progress lost while a node ``slowdown`` slower holds the model back for ``slow_s`` of wall time."""
        return slow_s * self.slowdown / (1 + self.slowdown)

    @property
    def detect_wall_s(self) -> float:
        """The detection window as it passes: its steps run at the slow node's pace."""
        return self.detect_s * (1 + self.slowdown)

    @property
    def unattended_slow_s(self) -> float:
        """Mean time one stays unattended: until the person acts, or the run ends (it arrives uniformly)."""
        run_s, wait_s = self.days * DAY_S, self.unattended_s
        return wait_s * (1 - wait_s / (2 * run_s)) if wait_s < run_s else run_s / 2  # equal at U = D

    @property
    def acted_on(self) -> float:
        """The share the person acts on before the run ends: each a restart."""
        run_s = self.days * DAY_S
        return max(0.0, 1 - self.unattended_s / run_s) if run_s else 0.0

    @property
    def lost_h_unattended(self) -> float:
        return self.expected * (self._lost_s(self.unattended_slow_s) + self.acted_on * self.evict_s) / 3600

    @property
    def lost_h_evicted(self) -> float:
        false = self.false_per_day * self.days * self.evict_s
        return (self.expected * (self._lost_s(self.detect_wall_s) + self.evict_s) + false) / 3600

    @property
    def lost_h_false_bound(self) -> float:
        """Hours the false evictions at the study's 95 % bound would cost (each a restart)."""
        return self.false_bound_per_day * self.days * self.evict_s / 3600


STUDY = Path(__file__).with_name("straggler_study.json")


@dataclass(frozen=True)
class StragglerStudy:
    """What the seeded straggler study measured (benchmarks/straggler_study), for the rule it ran."""

    margin: float
    intervals: int
    window: int
    detect_intervals: float  # a whole node at the margin: the 95th percentile of the interval it was named at
    node_days: float  # healthy node-days simulated
    false_evictions: int  # healthy nodes named in them

    def applies(self, margin: float, intervals: int, window: int) -> bool:
        return (margin, intervals, window) == (self.margin, self.intervals, self.window)

    @property
    def false_per_node_day(self) -> float:
        return self.false_evictions / self.node_days

    @property
    def false_bound_per_node_day(self) -> float:
        """The 95 % upper bound: the Poisson rate under which seeing this few has 5 % chance (3 for none)."""
        return _poisson_upper(self.false_evictions) / self.node_days


def _poisson_upper(seen: int, confidence: float = 0.95) -> float:
    low, high = 0.0, 10.0 + 10 * seen
    for _ in range(100):  # P(Poisson(rate) <= seen) = 1 - confidence, by bisection
        rate = (low + high) / 2
        low, high = (rate, high) if sum(_poisson_pmf(rate, k) for k in range(seen + 1)) > 1 - confidence else (low, rate)
    return (low + high) / 2


def straggler_study(path: Path = STUDY) -> StragglerStudy:
    data = json.loads(path.read_text())
    setup, healthy = data["setup"], data["healthy"]
    return StragglerStudy(margin=setup["margin"], intervals=setup["intervals"], window=setup["window"],
                          detect_intervals=data["detection_intervals"]["at_margin"]["p95"],
                          node_days=healthy["node_days"], false_evictions=healthy["false_evictions"])


def stragglers(good: Goodput, settings: Settings, *, interval_s: float, margin: float, intervals: int,
               window: int, study: StragglerStudy | None = None) -> Stragglers:
    """``good``'s model (its plan goodput) meeting slow nodes at ``settings.goodput``'s rate, its rule
    (``margin``, ``intervals`` of ``window`` log intervals of ``interval_s``) judged by the study's figures."""
    assume, study = settings.goodput, study or straggler_study()
    measured = study.applies(margin, intervals, window)
    detect = study.detect_intervals if measured else intervals
    return Stragglers(
        name=good.name, gpus=good.gpus, days=good.days,
        per_day=assume.stragglers_per_1000_node_days / 1000 * good.nodes, slowdown=assume.straggler_slowdown,
        unattended_s=assume.straggler_unattended_h * 3600, detect_s=detect * interval_s,
        evict_s=good.save_s + good.recovery_s + good.replacement_wait_s, detect_intervals=detect, measured=measured,
        false_per_day=study.false_per_node_day * good.nodes if measured else 0.0,
        false_bound_per_day=study.false_bound_per_node_day * good.nodes if measured else 0.0)
