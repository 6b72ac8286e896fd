"""Snapshots in memory (training/checkpoints/snapshot.py): what one costs the training step, measured, then per prod model.

    .venv/bin/python -m benchmarks.snapshot [--hidden 768 --layers 8] [--snapshots 5] [--out FILE]

Measured here, in one process on this machine's device, on a real model with its AdamW state:
the step time with no snapshot (the baseline), the time a snapshot blocks training (the copy of
the state to CPU memory), the step time while the writer thread serializes, hashes and writes it to
node memory, and so the copy and write rates. Then, per prod model, from the plan (its snapshot
interval, its step time and each rank's share of the state): the blocked seconds at the copy rate of a
GPU to host memory, as a fraction of the time between two snapshots (target: under 1 %), and the
background work (the write at this machine's rate + the node's copies to their buddies over its network, the
plan's figure) against that interval.
The GPU's copy rate is a stated figure until the one-GPU proof measures it (``make gpu-check``).
The time a relaunch takes to load them is measured on the local cluster (tests/training/test_slurm_relaunch.py).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "jobs")]

import torch  # noqa: E402
from cli import ArgumentParser  # noqa: E402

from benchmarks.training.checkpoint import OneProcess  # noqa: E402
from training.checkpoints.snapshot import Snapshots  # noqa: E402
from training.parallel import distributed  # noqa: E402

TARGET = 0.01  # of training time between two snapshots
# A GPU's state copied to pageable host memory (``Tensor.to("cpu")``): H100/H200 over PCIe 5.0 x16
# move ~50 GB/s pinned; pageable copies reach about half. Stated, not measured here.
GPU_TO_HOST_GB_S = 20.0


def measure(hidden: int, layers: int, snapshots: int) -> dict:
    one = OneProcess.build(hidden, layers)
    d, model, train_step, state = one.d, one.model, one.train_step, one.state
    baseline = [train_step() for _ in range(4)][1:]
    state_bytes = one.state_bytes
    blocked, background, during = [], [], []
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as shm:
        taker = Snapshots(shm, "bench", every=1, d=d, layout={})
        for step in range(1, snapshots + 1):
            blocked.append(taker.take(step, state(step)))
            while taker._pending and not taker._pending[0].done():  # train while the writer works
                during.append(train_step())
            taker.wait()
            background.append(taker.last_write_s)
        taker.close(remove=True)
    distributed.shutdown()
    blocked_s, background_s = statistics.median(blocked), statistics.median(background)
    return {"parameters": sum(p.numel() for p in model.parameters()), "state_bytes": state_bytes,
            "snapshots": snapshots, "step_s": round(statistics.median(baseline), 4),
            "step_s_during_write": round(statistics.median(during), 4) if during else None,
            "blocked_s": blocked, "background_s": background,
            "blocked_median_s": round(blocked_s, 4), "background_median_s": round(background_s, 4),
            # 4 significant digits: a small model on a busy machine writes well under 0.1 GB/s
            "copy_gb_per_s": float(f"{state_bytes / blocked_s / 1e9:.4g}"),
            "write_gb_per_s": float(f"{state_bytes / background_s / 1e9:.4g}"),
            "blocked_over_step": round(blocked_s / statistics.median(baseline), 4)}


def prod_models(write_gb_per_s: float) -> list[dict]:
    """Per prod model: one rank's snapshot, what it blocks and what the writer does, against its interval."""
    from cluster_config.plan import build_plan
    from cluster_config.settings import load_settings

    rows = []
    for row in build_plan(load_settings("prod")).rows:
        if not row.snapshot_every:
            rows.append({"model": row.name, "snapshot_every": 0})
            continue
        gpus_per_node = row.gpus // row.nodes
        rank_bytes = row.snapshot_bytes_per_node / gpus_per_node
        interval_s = row.snapshot_every * row.step_s
        blocked_s = rank_bytes / (GPU_TO_HOST_GB_S * 1e9)
        # The node's ranks write and send at once: each gets its share of the node's network.
        background_s = rank_bytes / (write_gb_per_s * 1e9) + row.snapshot_bytes_per_node / (row.network_gb_s_per_node * 1e9)
        rows.append({"model": row.name, "snapshot_every": row.snapshot_every, "step_s": round(row.step_s, 2),
                     "interval_s": round(interval_s, 1), "rank_gib": round(rank_bytes / 2**30, 2),
                     "blocked_s": round(blocked_s, 3), "fraction_of_interval": round(blocked_s / interval_s, 5),
                     "background_s": round(background_s, 1), "background_fits": background_s < interval_s})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.snapshot", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/snapshot.json"))
    parser.add_argument("--hidden", type=int, default=768, help="the model's width (default 768)")
    parser.add_argument("--layers", type=int, default=8, help="its decoder layers (default 8: 57M parameters)")
    parser.add_argument("--snapshots", type=int, default=5, help="snapshots taken (default 5)")
    args = parser.parse_args(argv)
    if args.hidden < 64 or args.hidden % 64 or args.layers < 1 or args.snapshots < 1:
        parser.error("--hidden a multiple of 64, --layers >= 1, --snapshots >= 1")
    here = measure(args.hidden, args.layers, args.snapshots)
    models = prod_models(here["write_gb_per_s"])
    met = all(m["fraction_of_interval"] < TARGET and m["background_fits"] for m in models if m["snapshot_every"])
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                          "device": "cpu"},
              "measured": here, "gpu_to_host_gb_per_s": GPU_TO_HOST_GB_S, "target_fraction": TARGET, "models": models,
              "meets_target": met}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")

    print(f"snapshot of {here['state_bytes'] / 2**30:.3f} GiB ({here['parameters'] / 1e6:.0f}M parameters + AdamW moments), "
          f"here on the CPU")
    print(f"  step, no snapshot             {here['step_s']:8.3f} s  (baseline)")
    print(f"  blocked per snapshot          {here['blocked_median_s']:8.3f} s  ({100 * here['blocked_over_step']:.1f} % "
          f"of a step; copy {here['copy_gb_per_s']} GB/s)")
    print(f"  step while the writer works   {here['step_s_during_write'] or float('nan'):8.3f} s  "
          f"(write {here['write_gb_per_s']} GB/s in {here['background_median_s']:.3f} s)")
    print(f"prod, at {GPU_TO_HOST_GB_S:g} GB/s GPU to host (stated), the write rate above, and the node's network "
          "(the plan's) for the buddy copies:")
    print("| model | every (steps) | interval | rank's state | blocked | of the interval | writer |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in models:
        if not m["snapshot_every"]:
            print(f"| {m['model']} | off | | | | | |")
            continue
        print(f"| {m['model']} | {m['snapshot_every']} | {m['interval_s']:.0f} s | {m['rank_gib']:.1f} GiB | "
              f"{m['blocked_s']:.2f} s | {100 * m['fraction_of_interval']:.2f} % | {m['background_s']:.0f} s |")
    print(f"target: blocked under {100 * TARGET:g} % of the interval and the writer done within it: "
          f"{'met' if met else 'NOT met'}")
    print(f"wrote {args.out}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
