"""Collective-communication benchmark over torch.distributed, with a correctness check per rank.

Runs wherever torch.distributed does: NCCL on GPUs, gloo on CPU. Launch one process per
GPU (or per chosen CPU slot) with torchrun, for example from jobs/collectives.sh:

    srun torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d \\
        --rdzv-endpoint=node1:29500 -m cluster_checks.collectives --out-dir /fsx/logs/validation/x

For each collective and message size every rank first runs the operation once on known data
and compares its result with the exact expected value, then times ``--iters`` operations after
``--warmup``. Rank 0 prints a table and writes results.csv, results.json and busbw.png.
A collective that the backend does not implement is emulated with ones it does, and every row
says which ("method"): an emulated figure measures the emulation, not the collective.
Exit status: 0 when every checked rank got the right answer, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from cli import ArgumentParser
from cluster_checks.results import COLLECTIVES, Row, format_table, write_all

DTYPE = torch.float32
ELEMENT_BYTES = 4

# Test data: rank r holds r*100 + (global index % 89). Sums over up to ~500 ranks stay exact in
# float32, and in all_to_all every received chunk tells which rank sent it.
RANK_STRIDE = 100
INDEX_PERIOD = 89


def pattern(rank: int, start: int, count: int, device: torch.device) -> torch.Tensor:
    index = torch.arange(start, start + count, device=device, dtype=torch.int64) % INDEX_PERIOD
    return (index + rank * RANK_STRIDE).to(DTYPE)


def summed_pattern(world: int, start: int, count: int, device: torch.device) -> torch.Tensor:
    index = torch.arange(start, start + count, device=device, dtype=torch.int64) % INDEX_PERIOD
    return (index * world + RANK_STRIDE * world * (world - 1) // 2).to(DTYPE)


# Each case prepares buffers for one message size, runs the collective once and checks it.
# It returns the operation to time and this rank's verdict (None: this rank has no result to
# check, e.g. the non-root ranks of reduce).
Case = Callable[[int, int, int, torch.device], tuple[Callable[[], None], bool | None]]


def all_reduce(rank: int, world: int, count: int, dev: torch.device):
    buf = pattern(rank, 0, count, dev)

    def run():
        dist.all_reduce(buf)

    run()
    return run, torch.equal(buf, summed_pattern(world, 0, count, dev))


def all_gather(rank: int, world: int, count: int, dev: torch.device):
    chunk = count // world
    inp, out = pattern(rank, rank * chunk, chunk, dev), torch.empty(count, dtype=DTYPE, device=dev)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def run():
        gather(out, inp)

    run()
    expected = torch.cat([pattern(r, r * chunk, chunk, dev) for r in range(world)])
    return run, torch.equal(out, expected)


def broadcast(rank: int, world: int, count: int, dev: torch.device):
    buf = pattern(rank, 0, count, dev)

    def run():
        dist.broadcast(buf, src=0)

    run()
    return run, torch.equal(buf, pattern(0, 0, count, dev))


def reduce(rank: int, world: int, count: int, dev: torch.device):
    buf = pattern(rank, 0, count, dev)

    def run():
        dist.reduce(buf, dst=0)

    run()
    # Only the root holds a defined result; the other ranks' buffers are scratch space.
    return run, torch.equal(buf, summed_pattern(world, 0, count, dev)) if rank == 0 else None


def reduce_scatter(rank: int, world: int, count: int, dev: torch.device, emulate: bool = False):
    chunk = count // world
    inp, out = pattern(rank, 0, count, dev), torch.empty(chunk, dtype=DTYPE, device=dev)
    native = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def run():
        native(out, inp)

    def run_emulated():
        full = inp.clone()
        dist.all_reduce(full)
        out.copy_(full[rank * chunk:(rank + 1) * chunk])

    op = run_emulated if emulate else run
    op()
    return op, torch.equal(out, summed_pattern(world, rank * chunk, chunk, dev))


def all_to_all(rank: int, world: int, count: int, dev: torch.device):
    chunk = count // world
    inp, out = pattern(rank, 0, count, dev), torch.empty(count, dtype=DTYPE, device=dev)

    def run():
        dist.all_to_all_single(out, inp)

    run()
    # Chunk j of this rank's output is chunk `rank` of rank j's input.
    expected = torch.cat([pattern(j, rank * chunk, chunk, dev) for j in range(world)])
    return run, torch.equal(out, expected)


CASES: dict[str, Case] = {
    "all_reduce": all_reduce, "all_gather": all_gather, "broadcast": broadcast,
    "reduce": reduce, "reduce_scatter": reduce_scatter, "all_to_all": all_to_all,
}
EMULATION = "emulated: all_reduce + local slice"


def backend_has_reduce_scatter(device: torch.device) -> bool:
    """Probe once: older gloo builds raise for reduce_scatter (same on every rank)."""
    world = dist.get_world_size()
    try:
        reduce_scatter(dist.get_rank(), world, world, device)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (use e.g. 4096, 64K, 16M, 1G)")


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    if min_bytes <= 0 or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"need 0 < --min-bytes <= --max-bytes and --factor >= 2, "
                         f"got {min_bytes}, {max_bytes}, {factor}")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def timed(op: Callable[[], None], warmup: int, iters: int, sync: Callable[[], None]) -> float:
    """Seconds per operation on this rank."""
    for _ in range(warmup):
        op()
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        op()
    sync()
    return (time.perf_counter() - start) / iters


def run_benchmark(args: argparse.Namespace, device: torch.device, backend: str) -> list[Row]:
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    native_rs = backend_has_reduce_scatter(device)
    rows = []
    for name in args.collectives:
        method = "native" if name != "reduce_scatter" or native_rs else EMULATION
        for size in message_sizes(args.min_bytes, args.max_bytes, args.factor):
            # Whole elements, divisible by the number of ranks (nccl-tests rounds the same way).
            count = max(world, size // ELEMENT_BYTES // world * world)
            case = CASES[name]
            if method == EMULATION:
                op, ok = reduce_scatter(rank, world, count, device, emulate=True)
            else:
                op, ok = case(rank, world, count, device)
            seconds = torch.tensor([timed(op, args.warmup, args.iters, sync)], dtype=torch.float64,
                                   device=device)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
            verdicts: list[bool | None] = [None] * world
            dist.all_gather_object(verdicts, ok)
            checked = [v for v in verdicts if v is not None]
            rows.append(Row.measured(name, count * ELEMENT_BYTES, count, "float32", world,
                                     seconds.item(), bool(checked) and all(checked), len(checked),
                                     method, backend))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cluster_checks.collectives", description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", type=parse_bytes, default=parse_bytes("4K"))
    parser.add_argument("--max-bytes", type=parse_bytes, default=parse_bytes("16M"))
    parser.add_argument("--factor", type=int, default=4, help="size multiplier between steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--collectives", nargs="+", choices=COLLECTIVES, default=list(COLLECTIVES))
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                        help="auto: nccl when CUDA is available, else gloo")
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    message_sizes(args.min_bytes, args.max_bytes, args.factor)  # fail early on a bad sweep

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend)
    try:
        hosts: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(hosts, socket.gethostname())
        rows = run_benchmark(args, device, backend)
        if dist.get_rank() == 0:
            nodes = sorted(set(hosts))
            title = f"{backend}: {len(hosts)} ranks on {len(nodes)} node(s)"
            print(f"{title} ({', '.join(nodes)})")
            print(format_table(rows))
            paths = write_all(rows, args.out_dir, title, backend=backend, world_size=len(hosts),
                              nodes=nodes, iters=args.iters, warmup=args.warmup)
            print("results:", ", ".join(str(p) for p in paths.values()))
    finally:
        dist.destroy_process_group()
    wrong = [f"{r.collective}@{r.size_bytes}" for r in rows if not r.correct]
    if wrong:
        print(f"problem: rank {os.environ.get('RANK', '?')}: wrong results for {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
