"""Deterministic kernels for runs that must repeat bit for bit (``train.deterministic``).

Set once at start-up, before the first matmul: cuBLAS reads its workspace setting when it creates
its first handle, and torch refuses a CUDA matmul under deterministic algorithms without it.
"""

from __future__ import annotations

import os

import torch

# cuBLAS is deterministic only with a fixed workspace per stream (NVIDIA's cuBLAS docs, "Results
# reproducibility"); torch names these two values. ":4096:8" is the larger: 8 buffers of 4 MiB.
CUBLAS_WORKSPACE = ":4096:8"


def set_determinism(on: bool) -> None:
    """``on``: every kernel deterministic, or an error naming the op that has no deterministic version.

    Not ``warn_only``: with it torch still picks cuDNN attention (no deterministic backward) and runs
    flash and memory-efficient attention's non-deterministic backward. ``on=False`` changes nothing
    (torch's defaults: the fast kernels)."""
    if not on:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False  # benchmarking picks the fastest algorithm per run, not the same one
