"""Do the GPUs starve for data? Measure the real loader, the copy and real training steps; decide.

    python -m cluster_checks.input_diagnosis --config jobs/training/configs/tiny.yaml --out DIR [key=value ...]

On one node, one process, with the training config's loader, shards and model:

1. the loader alone (no model) with 0 workers and with N workers: batches/s it can deliver;
2. the host-to-device copy of one real batch from pageable and from pinned memory (CUDA
   events), when a GPU is present;
3. a few real training steps (``training.train``, the same loop as production, with scratch
   checkpoint and log folders): step time and the share of it spent waiting for data;
4. optionally, where NVIDIA's gdsio is installed and a GPU is present, reading from the data
   file system through the CPU (storage -> host -> GPU) and through GPUDirect Storage.

Then ``input_verdict.decide`` turns the numbers into loader-bound / copy-bound / compute-bound and
the setting to change. The report goes to stdout and ``DIR/diagnosis.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from cli import ArgumentParser, fail
from data_pipeline.isolation import measure as measure_loader
from data_pipeline.loader import DatasetError, TokenLoader
from training.parallel import distributed
from training.config import ConfigError, load_config
from training.train import train

from .input_verdict import PipelineNumbers, compute_s_per_batch, decide

GDSIO_DEFAULT = "/usr/local/cuda/gds/tools/gdsio"


# --- measurements ------------------------------------------------------------------------------

def loader_rate(cfg, num_workers: int, batches: int) -> dict:
    """The training loader alone over the training shards (rank 0 of 1), after its first batch."""
    loader = TokenLoader(cfg.data.path, batch_size=cfg.train.micro_batch_size, seq_len=cfg.data.seq_len,
                         num_workers=num_workers, seed=cfg.data.seed, pin_memory=False)
    result = measure_loader(loader, batches)
    result.update(num_workers=num_workers, batches_per_s=result["batches"] / result["seconds"])
    return result


def copy_seconds(batch: dict, device: torch.device, pinned: bool, repeats: int = 50) -> float:
    """Mean time to copy one batch (inputs and labels) to the GPU, timed with CUDA events."""
    tensors = [t.pin_memory() if pinned else t for t in (batch["input_ids"], batch["labels"])]
    for _ in range(3):  # first copies pay for allocation
        [t.to(device, non_blocking=True) for t in tensors]
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        for t in tensors:
            t.to(device, non_blocking=True)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / repeats


def diagnosis_config(config: str | None, overrides: list[str], steps: int, scratch: Path):
    """The training config, run for ``steps`` steps (rounded up to even) with scratch folders.

    The run must neither resume from nor overwrite the model's own checkpoints and logs.
    """
    half = max(steps // 2, 1)
    scratch_dirs = [f"checkpoint.dir={scratch / 'checkpoints'}", f"log.dir={scratch / 'log'}",
                    f"log.tensorboard_dir={scratch / 'log' / 'tb'}"]
    warmup = load_config(config, [*overrides, *scratch_dirs]).optim.warmup_steps  # the user's, validated
    cfg = load_config(config, [*overrides, *scratch_dirs, f"train.steps={2 * half}", f"log.interval={half}",
                               f"checkpoint.every={2 * half}", f"optim.warmup_steps={min(warmup, 2 * half - 1)}",
                               "eval.every=0"])  # the loader's speed only: no validation passes in between
    return cfg


def training_steps(cfg) -> dict:
    """Run the real training loop; its second metrics interval is the steady-state sample.

    The final checkpoint's time is excluded from the step time by the metrics themselves.
    """
    if "MASTER_PORT" not in os.environ:  # a single process needs a port of its own for its gloo group
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    d = distributed.init(cfg.train.timeout_s)
    try:
        train(cfg, d)
    finally:
        distributed.shutdown()
    records = [json.loads(line) for line in (Path(cfg.log.dir) / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in records if "step" in r and "event" not in r][-1]
    return {"steps_timed": cfg.log.interval, "step_time_s": steady["step_time_s"],
            "data_wait_share": steady["data_wait_pct"] / 100, "tokens_per_s": steady["tokens_per_s"],
            "batches_per_step": cfg.grad_accum_steps(1), "device": str(d.device)}


def parse_gdsio(text: str) -> float:
    """GB/s from gdsio's result line (``... Throughput: 6.816723 GiB/sec, ...``)."""
    match = re.search(r"Throughput:\s*([\d.]+)\s*GiB/sec", text)
    if not match:
        raise ValueError(f"no 'Throughput: ... GiB/sec' in gdsio output: {text.strip()[-300:]!r}")
    return float(match.group(1)) * 2**30 / 1e9


def gds_compare(directory: str, gdsio: str | None, seconds: int = 10) -> dict:
    """Read bandwidth storage -> CPU -> GPU (-x 2) versus GPUDirect Storage (-x 0), 8 threads, 1 MiB I/O."""
    if not torch.cuda.is_available():
        return {"available": False, "reason": "no GPU"}
    if not gdsio:
        return {"available": False, "reason": f"gdsio not found (PATH, {GDSIO_DEFAULT}): GDS tools not installed"}
    work = Path(tempfile.mkdtemp(prefix=".gdsio-", dir=directory))
    common = [gdsio, "-D", str(work), "-d", "0", "-w", "8", "-s", "1G", "-i", "1M"]
    try:
        # Lay the files out first (through the CPU, which works everywhere), then read them both ways.
        steps = {"layout": [*common, "-x", "1", "-I", "1"],
                 "cpu_path_gb_s": [*common, "-x", "2", "-I", "0", "-T", str(seconds)],
                 "gpudirect_gb_s": [*common, "-x", "0", "-I", "0", "-T", str(seconds)]}
        result: dict = {"available": True, "directory": directory}
        for name, command in steps.items():
            run = subprocess.run(command, capture_output=True, text=True, timeout=10 * seconds + 120)
            if run.returncode:
                tail = (run.stderr or run.stdout).strip()[-300:]
                return {"available": False, "reason": f"gdsio {name} failed (exit {run.returncode}): {tail}", **result}
            if name != "layout":
                result[name] = parse_gdsio(run.stdout)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- report ------------------------------------------------------------------------------------

def render(report: dict) -> str:
    loader, copy, steps, gds = report["loader"], report["copy"], report["training"], report["gds"]
    rows = [(f"loader alone, {r['num_workers']} workers",
             f"{r['batches_per_s']:.1f} batches/s ({r['tokens_per_s']:,.0f} tokens/s)") for r in loader]
    if copy["measured"]:
        for kind in ("pageable", "pinned"):
            seconds = copy[f"{kind}_s"]
            rows.append((f"host-to-device copy, {kind}",
                         f"{seconds * 1e3:.3f} ms per batch ({copy['bytes'] / seconds / 1e9:.1f} GB/s)"))
    else:
        rows.append(("host-to-device copy", f"not measured: {copy['reason']}"))
    rows += [(f"training step ({steps['steps_timed']} steps timed, {steps['device']})",
              f"{steps['step_time_s']:.3f} s ({steps['batches_per_step']} micro-batches)"),
             ("data wait share", f"{steps['data_wait_share']:.1%}"),
             ("compute per micro-batch", f"{report['compute_s_per_batch'] * 1e3:.1f} ms")]
    if gds["available"]:
        rows.append(("GDS read: CPU path / GPUDirect",
                     f"{gds['cpu_path_gb_s']:.2f} / {gds['gpudirect_gb_s']:.2f} GB/s"))
    else:
        rows.append(("GDS read: CPU path / GPUDirect", f"not available: {gds['reason']}"))
    width = max(len(name) for name, _ in rows)
    verdict = report["verdict"]
    lines = [f"Input pipeline diagnosis on {report['host']}: data {report['data_path']}",
             f"  batch {report['micro_batch_size']} x {report['seq_len']} tokens, model {report['preset']}, "
             f"{report['cpus']} CPUs for {report['ranks_per_node']} rank(s) per node",
             *(f"  {name.ljust(width)}  {value}" for name, value in rows),
             f"VERDICT: {verdict['kind']}",
             f"  why:    {verdict['reason']}",
             f"  change: {verdict['change']}"]
    return "\n".join(lines) + "\n"


# --- entry point -------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m cluster_checks.input_diagnosis", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="the training config (a model's jobs/models/<model>.yaml, or jobs/training/configs/tiny.yaml)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="training config overrides")
    p.add_argument("--out", type=Path, required=True, help="folder for diagnosis.json and scratch files")
    p.add_argument("--workers", type=int, default=0, help="N for the loader alone (default: the config's, at least 2)")
    p.add_argument("--batches", type=int, default=200, help="batches timed per loader measurement")
    p.add_argument("--steps", type=int, default=20, help="training steps to run (the second half is timed)")
    p.add_argument("--ranks-per-node", type=int, default=0, help="training ranks sharing this node's CPUs "
                   "(default: the GPU count, or 1 without GPUs)")
    p.add_argument("--gdsio", default=shutil.which("gdsio") or (GDSIO_DEFAULT if os.path.exists(GDSIO_DEFAULT) else None))
    p.add_argument("--no-gds", action="store_true", help="skip the GPUDirect Storage comparison")
    args = p.parse_args(argv)
    if args.workers < 0 or args.batches < 1 or args.steps < 2:
        p.error("--workers must be >= 0, --batches >= 1, --steps >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="train-", dir=args.out))
    try:
        cfg = diagnosis_config(args.config, args.overrides, args.steps, scratch)
        workers = args.workers or max(cfg.data.num_workers, 2)
        cpus = len(os.sched_getaffinity(0))
        ranks = args.ranks_per_node or (torch.cuda.device_count() if torch.cuda.is_available() else 1)
        print(f"input_diagnosis: loader alone over {cfg.data.path} with 0 and {workers} workers ...", flush=True)
        loader = [loader_rate(cfg, w, args.batches) for w in (0, workers)]

        batch = next(iter(TokenLoader(cfg.data.path, batch_size=cfg.train.micro_batch_size,
                                      seq_len=cfg.data.seq_len, num_workers=0, seed=cfg.data.seed)))
        copy: dict = {"measured": False, "reason": "no GPU (CUDA not available)"}
        if torch.cuda.is_available():
            device = torch.device("cuda", 0)
            copy = {"measured": True, "bytes": sum(t.nbytes for t in batch.values()),
                    "pageable_s": copy_seconds(batch, device, pinned=False),
                    "pinned_s": copy_seconds(batch, device, pinned=True)}

        print(f"input_diagnosis: {cfg.train.steps} real training steps ...", flush=True)
        steps = training_steps(cfg)
    except ConfigError as exc:
        return fail(exc, "see python -m training.train --help for the keys")
    except DatasetError as exc:
        return fail(exc)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    gds = ({"available": False, "reason": "skipped (--no-gds)"} if args.no_gds
           else gds_compare(str(Path(cfg.data.path).parent), args.gdsio))
    numbers = PipelineNumbers(
        loader_batches_per_s_0=loader[0]["batches_per_s"], loader_batches_per_s_n=loader[1]["batches_per_s"],
        workers_measured=workers, workers_in_training=cfg.data.num_workers, cpus_per_rank=max(cpus // ranks, 1),
        step_time_s=steps["step_time_s"], batches_per_step=steps["batches_per_step"],
        data_wait_share=steps["data_wait_share"], copy_pageable_s=copy.get("pageable_s"),
        copy_pinned_s=copy.get("pinned_s"), pinned_in_training=torch.cuda.is_available())
    report = {"host": socket.gethostname(), "data_path": cfg.data.path, "preset": cfg.model.preset,
              "micro_batch_size": cfg.train.micro_batch_size, "seq_len": cfg.data.seq_len, "cpus": cpus,
              "ranks_per_node": ranks, "loader": loader, "copy": copy, "training": steps, "gds": gds,
              "compute_s_per_batch": compute_s_per_batch(numbers), "numbers": asdict(numbers),
              "verdict": asdict(decide(numbers))}
    (args.out / "diagnosis.json").write_text(json.dumps(report, indent=2) + "\n")
    print(render(report), end="")
    print(f"input_diagnosis: numbers in {args.out / 'diagnosis.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
