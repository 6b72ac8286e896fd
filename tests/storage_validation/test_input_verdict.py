"""The input-pipeline verdict: which of loader, copy or compute limits training, and what to change."""

from dataclasses import replace

import pytest

from cluster_checks.input_verdict import (COMPUTE, COPY, LOADER, PipelineNumbers, compute_s_per_batch, decide)

# A step of 2 micro-batches taking 0.2 s with 1% data wait: 0.099 s of compute per batch,
# so the model consumes 10 batches/s. The loader alone makes 4/s without workers, 30/s with 4.
HEALTHY = PipelineNumbers(loader_batches_per_s_0=4.0, loader_batches_per_s_n=30.0, workers_measured=4,
                          workers_in_training=4, cpus_per_rank=12, step_time_s=0.2, batches_per_step=2,
                          data_wait_share=0.01)


def test_compute_time_excludes_the_data_wait():
    assert compute_s_per_batch(replace(HEALTHY, data_wait_share=0.5)) == pytest.approx(0.05)


def test_no_wait_and_no_gpu_is_compute_bound():
    verdict = decide(HEALTHY)
    assert verdict.kind == COMPUTE
    assert "30.0 batches/s with 4 workers" in verdict.reason and "consumes 10.1 batches/s" in verdict.reason
    assert verdict.change.startswith("nothing in the input pipeline")


def test_waiting_with_a_slow_loader_whose_workers_scale_raises_num_workers():
    # Needs 0.2*(1-0.5)/2 = 0.05 s per batch -> 20 batches/s; 2 workers give 8/s (4 each, scaling).
    numbers = replace(HEALTHY, loader_batches_per_s_0=4.5, loader_batches_per_s_n=8.0, workers_measured=2,
                      workers_in_training=2, data_wait_share=0.5)
    verdict = decide(numbers)
    assert verdict.kind == LOADER
    assert verdict.change == "data.num_workers=6"  # ceil(20 * 1.2 / 4)
    assert "training waits for data 50.0% of the time" in verdict.reason
    assert "workers scale (4.0 batches/s each)" in verdict.reason


def test_worker_count_is_capped_by_the_cpus_and_says_when_that_is_not_enough():
    numbers = replace(HEALTHY, loader_batches_per_s_0=1.0, loader_batches_per_s_n=2.0, workers_measured=2,
                      workers_in_training=2, cpus_per_rank=4, data_wait_share=0.5)
    verdict = decide(numbers)
    assert verdict.change.startswith("data.num_workers=3 (all 3 spare CPUs; still short")


def test_workers_that_do_not_scale_point_to_offline_preprocessing_and_storage():
    numbers = replace(HEALTHY, loader_batches_per_s_0=5.0, loader_batches_per_s_n=6.0, workers_measured=4,
                      data_wait_share=0.3)
    verdict = decide(numbers)
    assert verdict.kind == LOADER
    assert "workers do not scale (1.2x with 4)" in verdict.reason
    assert "preprocess offline" in verdict.change and "jobs/fsx_perf.sh" in verdict.change


def test_fast_loader_but_training_uses_fewer_workers():
    verdict = decide(replace(HEALTHY, workers_in_training=1, data_wait_share=0.2))
    assert (verdict.kind, verdict.change) == (LOADER, "data.num_workers=4")
    assert "but training runs 1 workers" in verdict.reason


def test_fast_loader_but_training_oversubscribes_the_cpus():
    verdict = decide(replace(HEALTHY, workers_in_training=16, workers_measured=4, cpus_per_rank=8,
                             data_wait_share=0.2))
    assert (verdict.kind, verdict.change) == (LOADER, "data.num_workers=7")


def test_fast_loader_right_workers_still_waiting_prefetches_deeper():
    verdict = decide(replace(HEALTHY, data_wait_share=0.2))
    assert verdict.kind == LOADER and "prefetch_factor" in verdict.change


def test_slow_pageable_copy_without_pinning_says_pin_memory():
    # 0.1 s compute per batch; a 20 ms pageable copy is 20%, pinned would take 5 ms.
    verdict = decide(replace(HEALTHY, copy_pageable_s=0.020, copy_pinned_s=0.005, pinned_in_training=False))
    assert verdict.kind == COPY
    assert verdict.change.startswith("pin_memory=True")
    assert "20.00 ms, 20% of the" in verdict.reason


def test_slow_copy_already_pinned_says_move_fewer_bytes():
    verdict = decide(replace(HEALTHY, copy_pageable_s=0.030, copy_pinned_s=0.020, pinned_in_training=True))
    assert verdict.kind == COPY
    assert "already from pinned memory" in verdict.reason and "GPUDirect Storage" in verdict.change


def test_fast_copy_is_not_a_bottleneck():
    verdict = decide(replace(HEALTHY, copy_pageable_s=0.002, copy_pinned_s=0.001, pinned_in_training=True))
    assert verdict.kind == COMPUTE


def test_data_wait_wins_over_copy():
    verdict = decide(replace(HEALTHY, data_wait_share=0.4, copy_pageable_s=0.05, copy_pinned_s=0.01))
    assert verdict.kind == LOADER
