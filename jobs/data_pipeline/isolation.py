"""Iterate the exact training loader with no model; print delivered tokens/s and fetch latency.

    python -m data_pipeline.isolation DATASET --seq-len 2048 --batch-size 8 [--num-workers 4]

Tells whether the input pipeline can feed training: compare ``tokens_per_s`` with the model's
tokens/s per rank. Fetch latency is the time the loop waits for each batch (what training would
see as data wait); the first batch (worker start-up) is reported apart.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from cli import ArgumentParser, fail

from .loader import DatasetError, TokenLoader


def measure(loader: TokenLoader, batches: int) -> dict:
    it = iter(loader)
    t0 = time.perf_counter()
    next(it)
    first = time.perf_counter() - t0
    waits, tokens, ignored = [], 0, 0
    start = time.perf_counter()
    for _ in range(batches):
        t = time.perf_counter()
        batch = next(it)
        waits.append(time.perf_counter() - t)
        tokens += batch["input_ids"].numel()
        ignored += int((batch["labels"] == -100).sum())
    elapsed = time.perf_counter() - start
    ms = np.array(waits) * 1e3
    return {"batches": batches, "tokens": tokens, "seconds": round(elapsed, 4),
            "tokens_per_s": round((tokens - ignored) / elapsed, 1),
            "padding_fraction": ignored / tokens,
            "fetch_ms_p50": round(float(np.percentile(ms, 50)), 4),
            "fetch_ms_p99": round(float(np.percentile(ms, 99)), 4),
            "first_batch_s": round(first, 4)}


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m data_pipeline.isolation", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True, help="per-rank micro batch")
    p.add_argument("--batches", type=int, default=200, help="batches to time (after the first)")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=torch.cuda.is_available(),
                   help="pin batches (default: on when CUDA is available)")
    a = p.parse_args(argv)
    try:
        loader = TokenLoader(a.path, batch_size=a.batch_size, seq_len=a.seq_len, rank=a.rank,
                             world_size=a.world_size, num_workers=a.num_workers, seed=a.seed,
                             pin_memory=a.pin_memory)
    except DatasetError as e:
        return fail(e)
    report = measure(loader, a.batches)
    report.update(batch_size=a.batch_size, seq_len=a.seq_len, num_workers=a.num_workers,
                  pin_memory=a.pin_memory, batches_per_epoch=loader.batches_per_epoch)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
