"""Per-rank timing and the slow-but-alive node: which node holds the others back, why, by how much, for how long.

Every log interval each rank contributes five numbers to one small all-gather (the stop-vote group, gloo: a
few bytes per rank):

- ``probe_s``: a fixed matrix-multiply workload, the same on every rank, timed on the rank's own device
  (no communication): a GPU that throttles takes longer. Step times cannot tell this: the collectives
  inside each step make every rank wait for the slowest, so all ranks' steps last the same;
- ``host_s``: a fixed piece of Python timed on the rank's own thread: a host with a noisy neighbour, a CPU
  throttled, the GIL held by another thread of the process take longer;
- ``data_wait_s``: the interval's time blocked on the next batch (a slow file-system client, a starved
  loader on one node);
- ``arrival``: when the rank reached the gather; the collective wait of a rank is how much earlier it
  arrived than the last one;
- ``interval_s``: the interval's wall time on this rank.

The rule (training/resilience/straggler_rule.py) reduces them to one figure per node and cause (gpu, host,
storage, network) and names a node over ``train.straggler_margin`` in ``train.straggler_intervals`` of the
last ``train.straggler_window`` intervals: a ``straggler`` event in metrics.jsonl and a warning naming node,
rank, cause and excess, once per episode. Whether it is evicted (train.straggler_evict) weighs what keeping it
costs until the run's end against ``train.straggler_evict_cost_s``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from training.parallel.distributed import Dist
from training.resilience.straggler_rule import Figures, Finding, NodeRule, describe, worth_evicting  # noqa: F401 (the trainer's)

# Square matmul; GPU in bf16 (~0.2 ms each on an H100), CPU in fp32 (~1 ms each at 384). On CPUs the workload
# must outlast the scheduler's slices: at 256 (2.5 ms in all) a rank held to 10 % of a CPU by a CFS quota ran
# its probe unthrottled in about half the intervals (3 ms, the quota enforced at the tick), and a preempted
# healthy rank looked 300 % slow; at 384 (8 ms) the held rank took 42-90 ms in every one of 40 probes.
PROBE_SIZE = {"cuda": 4096, "cpu": 384}
PROBE_REPEATS = 8
_PROBE_INPUT: dict[torch.device, torch.Tensor] = {}


def probe(device: torch.device) -> float:
    """Seconds for the fixed workload on this rank's device (the device's queue drained first)."""
    if device not in _PROBE_INPUT:  # made once: the same numbers every time, no host work per probe
        n = PROBE_SIZE[device.type]
        generator = torch.Generator(device="cpu").manual_seed(0)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        _PROBE_INPUT[device] = torch.randn(n, n, generator=generator).to(device=device, dtype=dtype)
    a = _PROBE_INPUT[device]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(PROBE_REPEATS):
        a = (a @ a).clamp_(-1, 1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


# Plain Python on one core, three times (~2 ms each; 4-5 ms on this project's 2 shared test cores), the fastest
# taken: a preempted repeat is dropped (a healthy rank on shared cores was 100 % over its peer in 14 % of single
# 5 ms timings, beyond 300 % in 1 %), while a host that stays slow (a noisy neighbour, a throttled CPU, the GIL
# held by another thread) slows all three.
HOST_PROBE_LOOPS, HOST_PROBE_REPEATS = 35_000, 3


def host_probe() -> float:
    """Seconds for a fixed piece of Python on this rank's thread (its core and the GIL, nothing else)."""
    best = float("inf")
    for _ in range(HOST_PROBE_REPEATS):
        start = time.perf_counter()
        total = 0
        for i in range(HOST_PROBE_LOOPS):
            total += i * i
        best = min(best, time.perf_counter() - start)
    return best


@dataclass
class Report:
    """One interval across the ranks."""

    slowest: Finding  # the node and cause furthest over the others this interval
    data_wait_max_s: float
    data_wait_max_rank: int
    collective_wait_s: list[float]  # per rank: how much earlier it arrived than the last
    interval_s: float  # the median rank's interval: the same figure on every rank
    new: list[Finding]  # stragglers from this interval on (reported once per episode)
    standing: list[Finding]  # every node and cause at straggler_intervals of the window now

    def fields(self) -> dict:
        """The numbers that go into the interval's metrics line."""
        return {"slowest_rank": self.slowest.rank, "slowest_node": self.slowest.node,
                "slowest_cause": self.slowest.cause, "slowest_excess_pct": 100 * self.slowest.excess,
                "data_wait_max_s": self.data_wait_max_s, "collective_wait_max_s": max(self.collective_wait_s)}


class Detector:
    """The rule over the ranks' figures (pure: the figures of every rank in, a report out)."""

    def __init__(self, hosts: list[str], *, margin: float, intervals: int, window: int):
        self.rule = NodeRule(hosts, margin=margin, intervals=intervals, window=window)

    def update(self, probes: list[float], data_waits: list[float], arrivals: list[float],
               host: list[float] | None = None, intervals: list[float] | None = None) -> Report:
        span = statistics.median(intervals) if intervals else 1.0
        verdict = self.rule.update(Figures(probes, host or [1.0] * len(probes), data_waits, arrivals, span))
        waiter = max(range(len(data_waits)), key=data_waits.__getitem__)
        last = max(arrivals)
        return Report(slowest=verdict.slowest, data_wait_max_s=data_waits[waiter], data_wait_max_rank=waiter,
                      collective_wait_s=[last - a for a in arrivals], interval_s=span, new=verdict.new,
                      standing=verdict.standing)


class RankTiming:
    """Each interval's per-rank figures, gathered; every rank gets the same report."""

    def __init__(self, d: Dist, hosts: list[str], *, margin: float, intervals: int, window: int):
        self.d = d
        self.detector = Detector(hosts, margin=margin, intervals=intervals, window=window)

    def interval(self, data_wait_s: float, interval_s: float) -> Report:
        """Called by every rank at the same step (the log interval)."""
        mine = torch.tensor([probe(self.d.device), host_probe(), data_wait_s, interval_s, 0.0], dtype=torch.float64)
        mine[4] = time.time()  # last: arriving here is what the collective wait measures
        rows = [torch.zeros(5, dtype=torch.float64) for _ in range(self.d.world_size)]
        dist.all_gather(rows, mine, group=self.d.control_group)
        probes, host, waits, spans, arrivals = (list(column) for column in zip(*(r.tolist() for r in rows)))
        return self.detector.update(probes, waits, arrivals, host=host, intervals=spans)


def evicts(setting: bool | None, *, on_gpu: bool) -> bool:
    """train.straggler_evict, unset: on GPU only (the margin is a GPU's measured noise; CPU ranks sharing
    cores with other work fall far behind with nothing wrong)."""
    return on_gpu if setting is None else setting
