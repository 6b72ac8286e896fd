"""Does training wait for data? A pure decision from measured numbers, kept apart from measuring.

Three verdicts, each with the one setting to change:

- loader-bound: training waits for the next batch (data-wait share above ``WAIT_LIMIT``).
  If the loader alone cannot produce batches as fast as the model consumes them and workers
  scale, raise ``data.num_workers``; if they do not scale, the cost is in reading or decoding:
  preprocess offline or look at the file system. If the loader alone is fast enough, training's
  own workers are too few or starved of CPU.
- copy-bound: the host-to-device copy of a batch takes a large share (``COPY_LIMIT``) of the
  step's compute time: pin memory, or move fewer bytes (GPUDirect Storage, narrower tokens).
- compute-bound: neither; the input pipeline keeps up and nothing in it needs changing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

WAIT_LIMIT = 0.05  # data wait above 5% of step time is time a faster pipeline would give back
COPY_LIMIT = 0.10  # a copy taking 10% of compute time is worth removing
SCALING_EFFICIENCY = 0.5  # workers "scale" if N workers give at least half of N x one-process rate
HEADROOM = 1.2  # size workers for 20% more than the model consumes

LOADER, COPY, COMPUTE = "loader-bound", "copy-bound", "compute-bound"


@dataclass(frozen=True)
class PipelineNumbers:
    loader_batches_per_s_0: float  # loader alone, num_workers=0 (in the training process)
    loader_batches_per_s_n: float  # loader alone, num_workers=workers_measured
    workers_measured: int
    workers_in_training: int  # data.num_workers of the training config
    cpus_per_rank: int  # CPUs available to one training rank's loader workers
    step_time_s: float  # one optimizer step, data wait included
    batches_per_step: int  # micro-batches per optimizer step (gradient accumulation)
    data_wait_share: float  # share of step time spent waiting for the next batch, 0..1
    copy_pageable_s: Optional[float] = None  # host-to-device copy of one batch; None: no GPU
    copy_pinned_s: Optional[float] = None
    pinned_in_training: bool = False


@dataclass(frozen=True)
class Verdict:
    kind: str  # LOADER, COPY or COMPUTE
    reason: str  # the numbers behind it, in a sentence
    change: str  # the setting to change, or "nothing"


def compute_s_per_batch(n: PipelineNumbers) -> float:
    """Time the model spends on one micro-batch when it is not waiting for data."""
    return n.step_time_s * (1 - n.data_wait_share) / n.batches_per_step


def decide(n: PipelineNumbers) -> Verdict:
    compute_s = compute_s_per_batch(n)
    needed = 1 / compute_s  # batches per second the model consumes
    wait = f"training waits for data {n.data_wait_share:.1%} of the time (limit {WAIT_LIMIT:.0%})"
    if n.data_wait_share > WAIT_LIMIT:
        return _loader_bound(n, needed, wait)
    copy_s = n.copy_pinned_s if n.pinned_in_training else n.copy_pageable_s
    if copy_s is not None and copy_s > COPY_LIMIT * compute_s:
        share = f"copying a batch to the GPU takes {copy_s * 1e3:.2f} ms, {copy_s / compute_s:.0%} of the " \
                f"{compute_s * 1e3:.1f} ms of compute per batch"
        if not n.pinned_in_training and n.copy_pinned_s is not None and n.copy_pinned_s < 0.8 * copy_s:
            return Verdict(COPY, f"{share}; pinned memory copies it in {n.copy_pinned_s * 1e3:.2f} ms",
                           "pin_memory=True in the loader (TokenLoader(..., pin_memory=True))")
        return Verdict(COPY, f"{share}, already from pinned memory",
                       "move fewer bytes per batch: copy the shards' uint16 tokens and widen them on the GPU, "
                       "or read with GPUDirect Storage where the nodes support it (compare the gdsio figures)")
    rate = n.loader_batches_per_s_n
    return Verdict(COMPUTE, f"{wait.replace('waits', 'waited')}: within the limit; the loader alone delivers "
                            f"{rate:.1f} batches/s with {n.workers_measured} workers, the model consumes "
                            f"{needed:.1f} batches/s",
                   "nothing in the input pipeline; speed up the step itself (batch size, parallelism, kernels)")


def _loader_bound(n: PipelineNumbers, needed: float, wait: str) -> Verdict:
    rate_0, rate_n, workers = n.loader_batches_per_s_0, n.loader_batches_per_s_n, n.workers_measured
    budget = max(n.cpus_per_rank - 1, 1)  # leave one CPU for the training process itself
    alone = f"the loader alone delivers {rate_n:.1f} batches/s with {workers} workers " \
            f"({rate_0:.1f} with none); the model consumes {needed:.1f} batches/s"
    if rate_n >= needed:
        if n.workers_in_training < workers:
            return Verdict(LOADER, f"{wait}; {alone}, but training runs {n.workers_in_training} workers",
                           f"data.num_workers={workers}")
        if n.workers_in_training > budget:
            return Verdict(LOADER, f"{wait}; {alone}, but training's {n.workers_in_training} workers exceed the "
                                   f"{n.cpus_per_rank} CPUs per rank and compete with the training process",
                           f"data.num_workers={budget}")
        return Verdict(LOADER, f"{wait}; {alone}: fast enough alone, so batches arrive late, not slowly",
                       "prefetch deeper: TokenLoader(prefetch_factor=...) above its default of 4")
    per_worker = rate_n / workers if workers else 0.0
    scales = workers > 0 and rate_n >= SCALING_EFFICIENCY * workers * rate_0
    if scales and workers < budget:
        target = min(budget, math.ceil(needed * HEADROOM / per_worker))
        if target > workers:
            enough = target * per_worker >= needed
            return Verdict(LOADER, f"{wait}; {alone}; workers scale ({per_worker:.1f} batches/s each)",
                           f"data.num_workers={target}" + ("" if enough else
                                                           f" (all {budget} spare CPUs; still short: also "
                                                           "preprocess offline)"))
    why = (f"workers do not scale ({rate_n / rate_0:.1f}x with {workers})" if not scales and rate_0 > 0
           else f"no CPUs left for more workers ({n.cpus_per_rank} per rank)")
    return Verdict(LOADER, f"{wait}; {alone}; {why}",
                   "make each batch cheaper to produce: preprocess offline (tokenize and pack once, larger "
                   "shards), and check the file system's read rate with jobs/fsx_perf.sh")
