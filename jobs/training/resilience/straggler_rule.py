"""The straggler rule, without torch: the trainer's Detector (training/resilience/stragglers.py), the goodput
simulation's stand-in trainer (local_cluster/stand_ins/trainer.py) and the seeded study
(benchmarks/straggler_study) all follow it.

Each log interval every rank gives four figures and the interval's length (``Figures``); the rule judges nodes,
not ranks:

1. **One figure per node and cause.** A node's figure is the median of its ranks': one rank's hiccup (a
   long writer thread, a preempted probe) does not move it, a whole slow node does. Its excess is over the
   median of the other nodes' figures:

   - ``gpu``: the compute probe (a fixed matmul on the rank's device), its ratio minus one;
   - ``host``: the host probe (a fixed piece of Python on the rank's own thread: the GIL and the cores the
     trainer competes for), its ratio minus one. Step times cannot tell either: the collectives inside
     each step make every rank wait for the slowest, so all ranks' steps last the same;
   - ``storage``: the interval's time blocked on the next batch (a starved loader, a slow file-system
     client), the difference as a share of the interval;
   - ``network``: the time the other ranks waited for this node at the interval's gather (they arrived
     earlier), as a share of the interval: time lost in its communication when its probes and data are
     healthy.

   One rank alone (a single throttling GPU, one starved loader) is judged too, against the other ranks of its
   node, on more evidence (``NodeRule``). On a single node (nothing to compare a node with) each rank is judged
   against the others with the node's count.
2. **k of the last w intervals.** A node is over in an interval when a cause's excess is above the margin
   less ``NOISE_ALLOWANCE`` (the noise of a node's median figure: a node exactly at the margin is counted
   in nearly every interval, a healthy node in none). A node over for one cause in ``intervals`` of the
   last ``window`` intervals is a straggler for that cause: reported once, until it drops below again.
   Counting in a window, not a run of one arg-max, keeps an intermittently slow node counted, and keeps a
   whole slow node from starting over when the slowest of its ranks changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CAUSES = ("gpu", "host", "storage", "network")

# A node's figure is the median of its (8) ranks': with the per-rank noise fitted to the H200 probe
# (local_cluster/stand_ins/probe_noise.py: 1.8 % lognormal spread, 0.25 % of samples 5-12 % over) it varies by
# 0.8 % (one standard deviation); 3 points is beyond 3.5 of them, and a node at the margin is counted unless
# its median comes out 3 % under its slowdown. Checked by the study (tests/training/test_straggler_study.py).
NOISE_ALLOWANCE = 0.03


@dataclass
class Figures:
    """One interval's figures, one entry per rank."""

    probe_s: list[float]  # the compute probe
    host_s: list[float]  # the host probe
    data_wait_s: list[float]  # blocked on the next batch during the interval
    arrival_s: list[float]  # when the rank reached the interval's gather (any common clock)
    interval_s: float  # the interval's wall time (the shares' denominator)


@dataclass(frozen=True)
class Finding:
    """A node's worst cause in one interval."""

    node: str
    rank: int  # the node's first rank (scope node) or the rank: the one that reports it
    cause: str
    excess: float  # gpu/host: over the other nodes' median, minus 1; storage/network: a share of the interval
    counted: int  # intervals over for this cause in the window, this one included
    window: int  # the intervals it was counted in
    scope: str = "node"  # "node": the node's median figure; "rank": this rank alone


def _median(ranked: list[float]) -> float:
    n = len(ranked)
    return ranked[n // 2] if n % 2 else (ranked[n // 2 - 1] + ranked[n // 2]) / 2


def _medians_of_the_others(values: list[float]) -> list[float]:
    """For each value, the median of all the others (one sort, not one per value)."""
    n = len(values)
    if n < 2:
        return list(values)
    order = sorted(range(n), key=values.__getitem__)
    ranked = [values[i] for i in order]
    out = [0.0] * n
    m = n - 1  # the others' count; the k-th smallest of them is ranked[k + (k >= position)]
    lo, hi = (m - 1) // 2, m // 2
    for position, i in enumerate(order):
        out[i] = (ranked[lo + (lo >= position)] + ranked[hi + (hi >= position)]) / 2
    return out


def node_excess(figures: Figures, groups: list[list[int]]) -> dict[str, list[float]]:
    """Per cause, each group's (node's) excess over the median of the other groups'."""
    def per_group(values: list[float]) -> list[float]:
        return [_median(sorted([values[r] for r in ranks])) for ranks in groups]

    out: dict[str, list[float]] = {}
    for cause, values in (("gpu", figures.probe_s), ("host", figures.host_s)):
        node = per_group(values)
        out[cause] = [v / m - 1 if m > 0 else 0.0 for v, m in zip(node, _medians_of_the_others(node))]
    span = max(figures.interval_s, 1e-9)
    waits = per_group(figures.data_wait_s)
    out["storage"] = [(v - m) / span for v, m in zip(waits, _medians_of_the_others(waits))]
    # Lateness: how much later than the other nodes this node's ranks arrived (the others' collective wait).
    arrival = per_group(figures.arrival_s)
    out["network"] = [(v - m) / span for v, m in zip(arrival, _medians_of_the_others(arrival))]
    return out


def rank_excess(figures: Figures, nodes: list[list[int]], node_of: list[int]) -> dict[str, list[float]]:
    """Per cause, each rank's excess over the median of the other ranks of its node (what the whole node
    shares, a checkpoint being written, a slow node, cancels: the node's own count sees that). The median is
    taken without the node's largest figure: exact for the ranks above the median, the only ones that can be over."""
    span = max(figures.interval_s, 1e-9)
    out = {}
    for cause, values, ratio in (("gpu", figures.probe_s, True), ("host", figures.host_s, True),
                                 ("storage", figures.data_wait_s, False), ("network", figures.arrival_s, False)):
        ref = [_median(sorted([values[r] for r in ranks])[:-1] or [values[ranks[0]]]) for ranks in nodes]
        refs = [ref[n] for n in node_of]
        out[cause] = ([v / m - 1 if m > 0 else 0.0 for v, m in zip(values, refs)] if ratio
                      else [(v - m) / span for v, m in zip(values, refs)])
    return out


@dataclass
class Verdict:
    """What one interval's figures make of the nodes."""

    slowest: Finding | None  # the node and cause furthest over the others this interval
    new: list[Finding] = field(default_factory=list)  # stragglers from this interval on (reported once each)
    standing: list[Finding] = field(default_factory=list)  # every node and cause at k of w now, new ones too


class _Level:
    """One way of grouping the ranks (by node, or each rank alone), with its own count in its own window."""

    def __init__(self, groups: list[list[int]], names: list[str], scope: str, intervals: int, window: int, measure):
        self.groups, self.names, self.scope, self.measure = groups, names, scope, measure
        self.intervals, self.window, self.keep = intervals, window, (1 << window) - 1
        self.history: dict[tuple[str, int], int] = {}  # (cause, group): the window's overs as bits; absent: none
        self.reported: set[tuple[str, int]] = set()  # reported and not yet back under

    def finding(self, g: int, cause: str, value: float, counted: int) -> Finding:
        return Finding(self.names[g], self.groups[g][0], cause, value, counted, self.window, self.scope)

    def update(self, excess: dict[str, list[float]], threshold: float, verdict: Verdict) -> None:
        history = self.history
        for cause in CAUSES:
            values = excess[cause]
            over = {g for g, v in enumerate(values) if v > threshold}
            for g in over | {g for c, g in history if c == cause}:
                key = (cause, g)
                bits = ((history.get(key, 0) << 1) | (g in over)) & self.keep
                if bits:
                    history[key] = bits
                else:
                    history.pop(key, None)
                if bits.bit_count() >= self.intervals:
                    found = self.finding(g, cause, values[g], bits.bit_count())
                    verdict.standing.append(found)
                    if key not in self.reported:
                        self.reported.add(key)
                        verdict.new.append(found)
                else:
                    self.reported.discard(key)


@dataclass
class NodeRule:
    """Judges nodes interval by interval (pure: one interval's figures in, findings out).

    A node's median figure is counted in ``intervals`` of the last ``window``. One rank alone (a single GPU
    throttling, one loader starved), against the other ranks of its node, is a straggler too, on more evidence:
    ``window + 2`` of the last ``2 x window``, more than a hiccup of ``window`` intervals on one rank (a long
    writer thread) with a noisy interval beside it gives."""

    hosts: list[str]  # per rank
    margin: float
    intervals: int  # k: intervals over the margin ...
    window: int  # ... of the last w

    def __post_init__(self) -> None:
        if not 0 < self.intervals <= self.window:
            raise ValueError(f"intervals {self.intervals} must be within 1..window ({self.window})")
        names = list(dict.fromkeys(self.hosts))
        nodes = [[r for r, h in enumerate(self.hosts) if h == n] for n in names]
        ranks = [[r] for r in range(len(self.hosts))]

        node_of = [names.index(h) for h in self.hosts]

        def by_rank(figures: Figures) -> dict[str, list[float]]:
            return rank_excess(figures, nodes, node_of)

        def by_node(figures: Figures) -> dict[str, list[float]]:
            return node_excess(figures, nodes)

        if len(nodes) > 1:
            self.levels = [_Level(nodes, names, "node", self.intervals, self.window, by_node),
                           _Level(ranks, list(self.hosts), "rank", self.window + 2, 2 * self.window, by_rank)]
        else:  # one node: its ranks against each other, with the node's count
            self.levels = [_Level(ranks, list(self.hosts), "rank", self.intervals, self.window, by_rank)]
        self.threshold = self.margin - NOISE_ALLOWANCE if self.margin > 2 * NOISE_ALLOWANCE else self.margin / 2

    def update(self, figures: Figures) -> Verdict:
        """One interval's figures in: the slowest node's worst cause, the stragglers it makes, those standing."""
        verdict = Verdict(slowest=None)
        for level in self.levels:
            excess = level.measure(figures)
            level.update(excess, self.threshold, verdict)
            if verdict.slowest is None:  # the first level's (nodes'; ranks' on one node)
                value, g, cause = max((max(values), values.index(max(values)), cause)
                                      for cause, values in excess.items())
                counted = level.history.get((cause, g), 0).bit_count()
                verdict.slowest = level.finding(g, cause, value, counted)
        # One node's ranks named both as a node and one by one: the node's finding stands for them.
        nodes = {f.node for f in verdict.standing if f.scope == "node"}
        for found in (verdict.new, verdict.standing):
            found[:] = sorted((f for f in found if f.scope == "node" or f.node not in nodes), key=lambda f: -f.excess)
        return verdict


def worth_evicting(finding: Finding, *, remaining_s: float, cost_s: float) -> bool:
    """Evict when it costs less than keeping the node: an eviction costs ``cost_s`` of the run's wall time (save,
    requeue, restart and, with no spare node free, the wait for a replacement; 0 when a spare is free), keeping
    it costs its excess of every remaining second (a synchronous step waits for the slowest node)."""
    return cost_s <= 0 or finding.excess * remaining_s > cost_s


def describe(finding: Finding, *, margin: float) -> str:
    """The line that names a straggler: in the warning, the event's reason, the node's drain reason (the epilog
    keeps 160 characters: this and "; saved step S, evicting the node" fit)."""
    if finding.cause in ("gpu", "host"):
        how = f"{100 * finding.excess:.0f} % slower than"
    else:
        how = f"+{100 * finding.excess:.0f} % of the interval over"
    return (f"straggler: rank {finding.rank} on {finding.node} {finding.cause} {how} the other {finding.scope}s in "
            f"{finding.counted} of {finding.window} intervals (margin {margin:g})")
