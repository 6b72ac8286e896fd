"""Per-rank timing and the slow-but-alive rank: which rank holds the others back, by how much, for how long.

Every log interval each rank contributes three numbers to one small all-gather (the stop-vote group,
gloo: a few bytes per rank):

- ``probe_s``: a fixed matrix-multiply workload, the same on every rank, timed on the rank's own device
  (no communication): a GPU that throttles, a host with a noisy neighbour, a CPU stolen from the
  process take longer. Step times cannot tell this: the collectives inside each step make every rank
  wait for the slowest, so all ranks' steps last the same;
- ``data_wait_s``: the interval's time blocked on the next batch (a slow file-system client, a starved
  loader on one node);
- ``arrival``: when the rank reached the gather; the collective wait of a rank is how much earlier it
  arrived than the last one.

The slowest rank is the one with the longest probe; its excess is its probe over the median of the
other ranks' (with two ranks, the other one's). A rank
whose excess stays above ``train.straggler_margin`` for ``train.straggler_intervals`` intervals in a
row is a straggler: a ``straggler`` event in metrics.jsonl and a warning naming rank, node and excess,
once per episode (reported, not acted on).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from training.parallel.distributed import Dist
from training.resilience.straggler_rule import Streak

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


@dataclass
class Report:
    """One interval across the ranks."""

    slowest_rank: int
    slowest_host: str
    excess: float  # the slowest rank's probe over the median of the others', minus 1
    data_wait_max_s: float
    data_wait_max_rank: int
    collective_wait_s: list[float]  # per rank: how much earlier it arrived than the last
    intervals_over: int  # consecutive intervals the same rank has been over the margin
    new_straggler: bool  # this interval makes it a straggler (reported once per episode)

    def fields(self) -> dict:
        """The numbers that go into the interval's metrics line."""
        return {"slowest_rank": self.slowest_rank, "slowest_excess_pct": 100 * self.excess,
                "data_wait_max_s": self.data_wait_max_s, "collective_wait_max_s": max(self.collective_wait_s)}


class Detector:
    """Follows the slowest rank across intervals (pure: the figures of every rank in, a report out)."""

    def __init__(self, hosts: list[str], *, margin: float, intervals: int):
        self.hosts, self.streak = hosts, Streak(margin, intervals)

    def update(self, probes: list[float], data_waits: list[float], arrivals: list[float]) -> Report:
        slowest, excess, new = self.streak.update(probes)
        waiter = max(range(len(data_waits)), key=data_waits.__getitem__)
        last = max(arrivals)
        return Report(slowest_rank=slowest, slowest_host=self.hosts[slowest], excess=excess,
                      data_wait_max_s=data_waits[waiter], data_wait_max_rank=waiter,
                      collective_wait_s=[last - a for a in arrivals], intervals_over=self.streak.over, new_straggler=new)


class RankTiming:
    """Each interval's per-rank figures, gathered; every rank gets the same report."""

    def __init__(self, d: Dist, hosts: list[str], *, margin: float, intervals: int):
        self.d = d
        self.detector = Detector(hosts, margin=margin, intervals=intervals)

    def interval(self, data_wait_s: float) -> Report:
        """Called by every rank at the same step (the log interval)."""
        mine = torch.tensor([probe(self.d.device), data_wait_s, 0.0], dtype=torch.float64)
        mine[2] = time.time()  # last: arriving here is what the collective wait measures
        rows = [torch.zeros(3, dtype=torch.float64) for _ in range(self.d.world_size)]
        dist.all_gather(rows, mine, group=self.d.control_group)
        return self.detector.update([r[0].item() for r in rows], [r[1].item() for r in rows],
                                    [r[2].item() for r in rows])


def evicts(setting: bool | None, *, on_gpu: bool) -> bool:
    """train.straggler_evict, unset: on GPU only (the margin is a GPU's measured noise; CPU ranks sharing
    cores with other work fall far behind with nothing wrong)."""
    return on_gpu if setting is None else setting
