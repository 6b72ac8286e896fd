"""The acceptance run's layout checks: each production layout, shrunk (the recipe's real widths, 2
layers, its layout), judged from the plain numbers its run recorded: initialization, loss, grad
norm, and on GPU peak memory against the dry run, MFU against the plan, compiled against eager.

A function per check; ``layout_checks`` maps DIR/layouts/<name>.json onto them. ``None`` is "not
recorded".
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping, Optional, Sequence

from cluster_checks.verdict import NOT_MEASURED, Check, check, not_measured

INIT_STD_TOLERANCE = 0.05  # sampling error of even a 4,096-value shard is ~1 %: 5 % only fails a wrong sigma
MEMORY_TOLERANCE = 0.10  # acceptance criterion: the real peak at most 10 % above the dry run's prediction
# ... and at most this far below it. The dry run is eager; the job compiles its layers, and Inductor's
# partitioner recomputes cheap pointwise results instead of saving them: on an H100 (benchmarks/results/
# gpu_check_H100) the compiled peaks were 4-17 % under the prediction, the same rank eager 12-15 % above
# the compiled one. Further below, the plan wastes memory it could spend on larger micro-batches.
MEMORY_CONSERVATIVE = 0.25
MFU_MIN_RATIO = 0.8  # a shrunk layout has less data-parallel traffic than production: it should reach the plan
# Compiled vs eager losses on the GPU, bf16: each op rounds at 2^-8 (0.4 %) and Inductor reorders the fp32
# sums; over a few tens of steps the losses drift apart by well under 2 %. A wrong fusion is far larger.
# (On CPU, fp32, tests/training/test_compile.py holds 2e-4.)
COMPILE_RTOL = 0.02

INIT_SOURCE = ("jobs/training/models/llama.py init_weights: matrices ~ N(0, 0.02), residual outputs 0.02 / sqrt(2 x layers), "
               "each drawn from its own (seed, name) generator")
DISTINCT_SOURCE = "tests/training/test_init_weights.py: no two parameters nor two shards are equal"
LOSS_SOURCE = "training from random init: cross-entropy starts near ln(vocab) and falls within tens of steps"
GRAD_SOURCE = "jobs/training/train.py clips by the global grad norm (optim.grad_clip): a non-finite norm is a lost step"
MEMORY_SOURCE = ("jobs/training/dry_run.py prediction at the same layout and world size: at most 10 % above it "
                 "(acceptance criterion), at most 25 % below (compiled layers keep less than the eager dry run)")
MFU_SOURCE = ("MFU as jobs/training/components/metrics.py computes it (tokens/s per GPU x FLOPs/token / dense bf16 peak, "
              "989 TFLOP/s for H100/H200); expected: cluster_config/plan.py estimate_mfu")
COMPILE_SOURCE = "train.compile (torch.compile per decoder layer) must not change the numerics beyond bf16 rounding"


def _finite(values: Sequence[float]) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def init_std(layout: str, stds: Optional[Mapping[str, Sequence[float]]]) -> Check:
    """``stds``: parameter (or shard) name -> (measured std, intended std)."""
    name = f"layout {layout}: init std per parameter"
    expected = f"|std / intended - 1| <= {INIT_STD_TOLERANCE:.0%} for every matrix"
    if not stds:
        return not_measured(name, expected, "init statistics not recorded", INIT_SOURCE)
    deviation = {p: abs(m / i - 1) if i else math.inf for p, (m, i) in stds.items()}
    worst = max(deviation, key=deviation.get)
    measured_std, intended = stds[worst]
    bad = sorted(p for p, d in deviation.items() if not d <= INIT_STD_TOLERANCE)
    return check(name, not bad, f"worst {worst}: {measured_std:.5g} vs {intended:.5g} ({deviation[worst]:.1%} off)",
                 expected, f"{len(bad)} parameter(s) off, e.g. {', '.join(bad[:3])}: a wrong sigma or a shard drawn "
                 "from the wrong generator; first compare with tests/training/test_init_weights.py at this layout",
                 INIT_SOURCE, ratio=(1 + deviation[worst]) if math.isfinite(deviation[worst]) else None,
                 limit=1 + INIT_STD_TOLERANCE)


def init_distinct(layout: str, duplicate_hashes: Optional[int]) -> Check:
    """``duplicate_hashes``: parameters or shards whose content hash equals another's (0 expected)."""
    name = f"layout {layout}: no two parameters/shards equal"
    if duplicate_hashes is None:
        return not_measured(name, "0 duplicate hashes", "parameter hashes not recorded", DISTINCT_SOURCE)
    return check(name, duplicate_hashes == 0, f"{duplicate_hashes} duplicate hash(es)", "0 duplicate hashes",
                 f"{duplicate_hashes} parameters/shards are identical: ranks drew them from the same generator "
                 "state; the model trains with fewer distinct weights than it has. First run "
                 "tests/training/test_init_weights.py with this layout", DISTINCT_SOURCE)


def loss_decreases(layout: str, losses: Optional[Sequence[float]]) -> Check:
    name = f"layout {layout}: loss finite and decreasing"
    expected = "every loss finite; mean of the last quarter < mean of the first"
    if not losses or len(losses) < 2:
        return not_measured(name, expected, "fewer than 2 losses recorded", LOSS_SOURCE)
    if not _finite(losses):
        return check(name, False, f"non-finite loss in {len(losses)} steps", expected,
                     "NaN/inf loss: first rerun with optim.lr halved and look for a bf16 overflow in the layer "
                     "named by the first non-finite grad norm", LOSS_SOURCE)
    quarter = max(1, len(losses) // 4)
    first, last = sum(losses[:quarter]) / quarter, sum(losses[-quarter:]) / quarter
    return check(name, last < first, f"{first:.3f} -> {last:.3f} over {len(losses)} steps", expected,
                 "the loss does not fall: the gradients do not reach the weights or are wrong at this layout "
                 "(sharding, tensor parallel); first compare with the same steps at FSDP only", LOSS_SOURCE,
                 ratio=last / first if first else None, limit=1.0)


def grad_norm_finite(layout: str, grad_norms: Optional[Sequence[float]]) -> Check:
    name = f"layout {layout}: grad norm finite"
    if not grad_norms:
        return not_measured(name, "finite and > 0 every step", "grad norms not recorded", GRAD_SOURCE)
    ok = _finite(grad_norms) and all(g > 0 for g in grad_norms)
    shown = [g for g in grad_norms if isinstance(g, (int, float))]
    return check(name, ok, f"{len(grad_norms)} steps, max {max(shown):.3g}" if shown else "none numeric",
                 "finite and > 0 every step",
                 "a NaN/inf or zero grad norm: a zero means no gradient reached the weights (a detached layer, a "
                 "frozen shard); NaN/inf: see the loss check's first action", GRAD_SOURCE)


def peak_memory(layout: str, peak_gib: Optional[float], predicted_gib: Optional[float], oom: bool = False) -> Check:
    """Peak GPU memory vs the dry run. Compare like with like: torch.cuda.max_memory_allocated (what
    training/components/metrics.py logs) against the dry run's peak less its ``runtime`` category (CUDA context
    and NCCL buffers, outside torch's allocator)."""
    name = f"layout {layout}: peak GPU memory vs dry run"
    band = f"-{MEMORY_CONSERVATIVE:.0%} to +{MEMORY_TOLERANCE:.0%}"
    expected = (f"{band} of {predicted_gib:.1f} GiB predicted" if predicted_gib else f"{band} of the dry run")
    if oom:
        return check(name, False, "out of memory", expected,
                     "the run ran out of GPU memory: the dry run under-predicts this layout; first compare "
                     "torch.cuda.memory_summary() at the failure with the dry run's categories, then lower "
                     "train.micro_batch_size or recompute more layers (train.activation_checkpointing_every)",
                     MEMORY_SOURCE, needs_gpu=True)
    if peak_gib is None or not predicted_gib:
        return not_measured(name, expected, "peak memory or the dry run's prediction not recorded", MEMORY_SOURCE,
                            True)
    ratio = peak_gib / predicted_gib
    effect = ("production layouts sized from it may not fit" if ratio > 1 else
              "the plan leaves memory unused that larger micro-batches or less recomputation could take")
    return check(name, 1 - MEMORY_CONSERVATIVE <= ratio <= 1 + MEMORY_TOLERANCE, f"{peak_gib:.1f} GiB ({ratio - 1:+.0%})",
                 expected, f"the dry run is {abs(ratio - 1):.0%} {'under' if ratio > 1 else 'over'}: {effect}; first "
                 "find the category that differs (torch.cuda.memory_snapshot vs the dry run's categories) and fix "
                 "the model in training/dry_run.py", MEMORY_SOURCE, needs_gpu=True, ratio=ratio,
                 limit=1 + MEMORY_TOLERANCE)


def mfu(layout: str, tokens_per_s_per_gpu: Optional[float], flops_per_token: Optional[float],
        peak_flops: Optional[float], expected_mfu: Optional[float]) -> Check:
    name = f"layout {layout}: MFU vs plan"
    expected = (f">= {MFU_MIN_RATIO:.0%} of the plan's {expected_mfu:.0%}" if expected_mfu
                else f">= {MFU_MIN_RATIO:.0%} of the plan's estimate")
    if not (tokens_per_s_per_gpu and flops_per_token and peak_flops and expected_mfu):
        return not_measured(name, expected, "tokens/s, FLOPs/token, peak FLOP/s or the plan's MFU not recorded",
                            MFU_SOURCE, True)
    measured = tokens_per_s_per_gpu * flops_per_token / peak_flops
    ratio = measured / expected_mfu
    return check(name, ratio >= MFU_MIN_RATIO, f"{measured:.1%} ({tokens_per_s_per_gpu:,.0f} tokens/s per GPU)",
                 expected, f"{ratio:.0%} of the plan: the plan's training days are optimistic by that much; first "
                 "look at data_wait_pct in metrics.jsonl (input-bound: jobs/input_diagnosis.sh), then at the step "
                 "time with and without compile", MFU_SOURCE, needs_gpu=True, ratio=ratio, limit=MFU_MIN_RATIO)


def compile_matches_eager(layout: str, compiled: Optional[Sequence[float]], eager: Optional[Sequence[float]]) -> Check:
    """Losses of the same steps with train.compile on and off."""
    name = f"layout {layout}: compiled vs eager losses"
    expected = f"every step within {COMPILE_RTOL:.0%} relative"
    if not compiled or not eager or len(compiled) != len(eager):
        return not_measured(name, expected, "the compiled and eager runs' losses (same steps) not recorded",
                            COMPILE_SOURCE, True)
    diffs = [abs(c - e) / abs(e) if e else math.inf for c, e in zip(compiled, eager)]
    worst = max(diffs) if _finite(compiled) and _finite(eager) else math.inf
    return check(name, worst <= COMPILE_RTOL, f"max {worst:.2%} over {len(diffs)} steps", expected,
                 "compiled layers compute something else than eager ones: train with train.compile=false until "
                 "fixed, and bisect by compiling one layer type at a time", COMPILE_SOURCE, needs_gpu=True,
                 ratio=worst / COMPILE_RTOL if math.isfinite(worst) else None, limit=1.0)


def layout_run(layout: str, record: Mapping) -> Check:
    name = f"layout {layout}: run completes"
    error = "out of memory" if record.get("oom") else record.get("error") or ""
    return check(name, not error, "completed" if not error else "failed", "no error", error +
                 ": first read the layout run's log (the 'problem:' and Traceback lines)", "jobs/acceptance.sh")


def layout_checks(layout: str, record: Optional[Mapping], gpu: bool = True) -> list[Check]:
    """The checks of one shrunk layout from DIR/layouts/<layout>.json (None: the run wrote nothing). Keys:

    error (str), oom (bool), init_std ({param: [std, intended]}), duplicate_hashes (int), losses, grad_norms
    ([float]), peak_memory_gib, predicted_memory_gib, tokens_per_s_per_gpu, flops_per_token, peak_flops,
    expected_mfu (float), compiled_losses, eager_losses ([float], same steps), recovered (bool),
    reference_losses, resumed_losses ({step: loss}), stall_detected_s, collective_timeout_s (float)."""
    if record is None:
        record = {"error": f"no layouts/{layout}.json: the layout's run did not start or wrote nothing"}
    r = record
    checks = [layout_run(layout, r), init_std(layout, r.get("init_std")),
              init_distinct(layout, r.get("duplicate_hashes")), loss_decreases(layout, r.get("losses")),
              grad_norm_finite(layout, r.get("grad_norms"))]
    if gpu:
        checks += [peak_memory(layout, r.get("peak_memory_gib"), r.get("predicted_memory_gib"), bool(r.get("oom"))),
                   mfu(layout, r.get("tokens_per_s_per_gpu"), r.get("flops_per_token"), r.get("peak_flops"),
                       r.get("expected_mfu")),
                   compile_matches_eager(layout, r.get("compiled_losses"), r.get("eager_losses"))]
    else:
        checks += [Check.no_gpu(f"layout {layout}: peak GPU memory vs dry run",
                                f"-{MEMORY_CONSERVATIVE:.0%} to +{MEMORY_TOLERANCE:.0%}",
                                MEMORY_SOURCE),
                   Check.no_gpu(f"layout {layout}: MFU vs plan", f">= {MFU_MIN_RATIO:.0%} of the plan", MFU_SOURCE),
                   Check.no_gpu(f"layout {layout}: compiled vs eager losses", f"within {COMPILE_RTOL:.0%}",
                                COMPILE_SOURCE)]
    # A run that failed explains every number it did not record ("no GPU" stays as it is).
    if r.get("error") or r.get("oom"):
        cause = "out of memory" if r.get("oom") else r["error"]
        checks = [replace(c, why=f"{c.why} (the run failed: {cause})")
                  if c.status == NOT_MEASURED and (gpu or not c.needs_gpu) else c for c in checks]
    return checks
