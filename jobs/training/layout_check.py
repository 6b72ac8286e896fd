"""One production layout, shrunk: the real training code at the recipe's widths, measured on the ranks at hand.

    torchrun --nnodes=2 --nproc-per-node=8 ... -m training.layout_check --recipe jobs/models/model7.yaml \
        --name llama2-70b --out $RESULTS/layouts
    torchrun --nproc-per-node=4 --standalone -m training.layout_check \
        --recipe jobs/training/configs/llama2-70b.yaml --preset tiny --steps 6 --out /tmp/layouts

The recipe's preset (its widths: hidden, heads, key/value heads, FFN; vocabulary: its config.json's, else 32000) with ``--layers``
layers (2: with 1 layer in n recomputed, layer 0 is and layer 1 is not), in the recipe's layout at the
world size torchrun gives: tensor parallel and HSDP shards as in the recipe, shrunk where the world is
smaller, so that 2 data-parallel copies (FSDP x TP) or 2 replicas (HSDP) remain; the JSON says what was
shrunk. The model and optimizer come from ``train.build`` and every step is ``Trainer.train_step``
(forward_backward, clipping, AdamW), on seeded synthetic sequences a model learns in a few steps (each
counts up from a random token id modulo 64): the loss must fall.

Rank 0 writes ``<out>/<name>.json``: the layout, then the numbers ``cluster_checks.acceptance`` reads
(``layout_checks``' keys; ``null`` where not measured, with the reason under ``not_measured``), and the
checks its builders make of them, plus three of this module's own (norms, shard statistics, replicas).
Exit 0: every check passed (on CPU the GPU-only ones are "not measured: no GPU" and do not count);
1: a check failed, one ``problem:`` line each on stderr; 2: bad input.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import math
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import asdict, replace
from itertools import combinations
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from cli import ArgumentParser, fail
from cluster_checks import layout_checks
from cluster_checks.verdict import FAIL, GO, NOT_MEASURED, PASS, Check, Report
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from training.parallel import distributed
from training.cluster import load_cluster
from training.config import Config, ConfigError, read_config_file, set_key
from training.dry_run import DEFAULT_VOCAB, load_model_config
from training.components.metrics import peak_flops
from training.models.llama import RESIDUAL_OUTPUTS, canonical_name, flops_per_token, hf_config
from training.models.architecture import ArchitectureError
from training.models.presets import resolve
from training.sizing.throughput import estimate_mfu
from training.train import Trainer, build

log = logging.getLogger("training.layout_check")
GIB = 1024**3
# Compile vs eager on CPU, fp32: Inductor sums in another order, ~1e-7 relative per operation, grown by
# a few Adam steps. On GPU: layout_checks.COMPILE_RTOL (bf16 rounds at 2^-8).
COMPILE_RTOL_CPU = 2e-4
COMPILE_SOURCE_CPU = "tests/training/test_compile.py and test_layouts.py RTOL: fp32 sums in another order"
PATTERN = 64  # token ids 0..63: each "next = this + 1" pair is seen often enough per step to be learned at once


# --- the shrunk config ------------------------------------------------------------------------------

def layout_config(recipe: str | None, preset: str | None, layers: int, steps: int, overrides: list[str],
                  world_size: int) -> tuple[Config, dict]:
    """The recipe with the command line's overrides, shrunk to ``world_size`` ranks; (config, what was shrunk)."""
    raw = read_config_file(recipe) if recipe else {}
    for item in overrides:  # as load_config applies them: the layout must be known before it is shrunk
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} is not section.key=value, e.g. train.steps=100")
        set_key(raw, key, yaml.safe_load(value))
    model, train = raw.setdefault("model", {}), raw.setdefault("train", {})
    if preset or not model.get("preset"):  # a recipe is named after its preset (configs/llama2-70b.yaml)
        model["preset"] = preset or (Path(recipe).stem if recipe else None)
    if not model["preset"]:
        raise ConfigError("no preset (the config names none, nor is its file named after one) — pass --preset")
    try:
        p = resolve(model["preset"])
    except ArchitectureError as exc:
        raise ConfigError(f"{exc} — pass --preset") from None
    model["vocab_size"] = model.get("vocab_size") or p.vocab or DEFAULT_VOCAB  # no dataset to size it
    if train.get("activation_checkpointing") and train.get("activation_checkpointing_every", 1) > 1 and layers < 2:
        raise ConfigError(f"--layers {layers} keeps no plain layer beside the recomputed one — use --layers 2 or more")

    # Tensor parallel and HSDP shards: the recipe's, or the largest that leaves 2 data-parallel copies /
    # replicas (the outer dimension is exercised too) and divides what it splits.
    def largest(wanted: int, limit: int, *split: int) -> int:
        return max(n for n in range(1, max(1, min(wanted, limit)) + 1) if all(s % n == 0 for s in split))

    seq_len = raw.get("data", {}).get("seq_len", Config().data.seq_len)
    shrunk = {"layers": {"preset": p.layers, "used": min(layers, p.layers)}}
    wanted = train.get("tensor_parallel", 1)
    tp = train["tensor_parallel"] = largest(wanted, world_size // 2, world_size, p.heads, p.kv_heads or p.heads,
                                            p.ffn_size, seq_len)
    if wanted > 1:
        shrunk["tensor_parallel"] = {"recipe": wanted, "used": tp}
    if train.get("parallelism") == "hsdp":
        dp, wanted = world_size // tp, train.get("hsdp_shard_size", Config().train.hsdp_shard_size)
        train["hsdp_shard_size"] = largest(wanted, dp // 2, dp)
        shrunk["hsdp_shard_size"] = {"recipe": wanted, "used": train["hsdp_shard_size"]}
    shrunk["why"] = (f"{world_size} ranks: at most the recipe's, leaving 2 data-parallel copies or HSDP replicas "
                     "where the world allows")
    # A short run of one micro-batch per rank and step; an override on the command line wins.
    micro = train.get("micro_batch_size", Config().train.micro_batch_size)
    given = {item.partition("=")[0] for item in overrides}
    for key, value in {"train.steps": steps, "optim.warmup_steps": steps // 4,
                       "train.global_batch_size": micro * (world_size // tp)}.items():
        if key not in given:
            set_key(raw, key, value)
    return load_model_config(raw), shrunk


def layout_name(cfg: Config, world_size: int) -> str:
    tp, t = cfg.train.tensor_parallel, cfg.train
    if t.parallelism == "hsdp":
        dp = world_size // tp
        text = f"HSDP {dp // t.hsdp_shard_size} replicas x {t.hsdp_shard_size} shards"
    else:
        text = f"{t.parallelism.upper()} {world_size // tp}"
    if tp > 1:
        text += f" x TP {tp} (sequence parallel)"
    if t.activation_checkpointing:
        text += ", activation checkpointing " + ("every layer" if t.activation_checkpointing_every == 1
                                                 else f"1 layer in {t.activation_checkpointing_every}")
    return text


# --- the real training step -------------------------------------------------------------------------

class _Clock:
    clock = staticmethod(time.perf_counter)

    def add_step(self, **_) -> None:
        pass


class Steps(Trainer):
    """``Trainer.train_step`` (forward_backward per micro-batch, grad clipping, AdamW, the lr schedule) on the
    model ``train.build`` makes; the trainer's dataset, checkpoints, watchdog and logs are left out."""

    def __init__(self, cfg: Config, d: distributed.Dist, mesh, model_config):  # no super(): it reads a dataset
        self.cfg, self.d, self.mesh, self.step = cfg, d, mesh, 0
        self.model, self.optimizer = build(cfg, model_config, d, mesh)
        self.accum = cfg.grad_accum_steps(d.world_size)
        self.metrics = _Clock()
        self.at_rest = self.replay = None  # the corruption checks are the trainer's, measured apart (benchmarks/replica_check)


def synthetic_batches(cfg: Config, d: distributed.Dist):
    """Seeded sequences, the same on a model copy's tensor-parallel ranks, another stream per copy: each
    counts up from a random start modulo ``PATTERN`` (next token = this one + 1), which a model learns
    within a few steps at any width, so the loss must fall (uniform random ids are near-unlearnable noise)."""
    dp_rank, _ = distributed.data_parallel_rank(d, cfg.train.tensor_parallel)
    generator = torch.Generator().manual_seed(cfg.data.seed * 100_003 + dp_rank)
    positions = torch.arange(cfg.data.seq_len + 1)
    while True:
        starts = torch.randint(0, PATTERN, (cfg.train.micro_batch_size, 1), generator=generator)
        tokens = (starts + positions) % PATTERN
        yield {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}


def run_steps(stepper: Steps, steps: int, on_step=None) -> tuple[list[float], list[float], list[float]]:
    """(losses averaged over ranks, grad norms, seconds) of ``steps`` optimizer steps."""
    batches = synthetic_batches(stepper.cfg, stepper.d)
    losses, norms, seconds = [], [], []
    for step in range(steps):
        if on_step:
            on_step(step)
        start = time.perf_counter()
        loss, grad_norm, _ = stepper.train_step(batches)
        losses.append(distributed.mean_over_ranks(loss.item(), stepper.d))  # .item(): the step's end on a GPU
        seconds.append(time.perf_counter() - start)
        norms.append(grad_norm.item())
        log.info("step %d/%d loss %.4f grad_norm %.4g %.2f s", step + 1, steps, losses[-1], norms[-1], seconds[-1])
    return losses, norms, seconds


# --- initialization -------------------------------------------------------------------------------

def intended(name: str, dim: int, model_config) -> tuple[float, float]:
    """(mean, std) init_weights should give: norms 1; matrices N(0, 0.02), residual outputs / sqrt(2 x layers)."""
    if dim < 2:
        return 1.0, 0.0
    std = model_config.initializer_range
    return 0.0, std / math.sqrt(2 * model_config.num_hidden_layers) if name.endswith(RESIDUAL_OUTPUTS) else std


@torch.no_grad()
def init_statistics(model) -> dict[str, dict]:
    """Per parameter: elements counted, mean and std of the whole parameter. Each rank sums x and x^2 of its
    shard; the sums are all-reduced over the mesh dimensions that shard the parameter (not over those that
    replicate it: HSDP's replicas, tensor parallel's copies of the norms), so nothing is gathered."""
    stats = {}
    for name, p in model.named_parameters():
        x = (p.to_local() if isinstance(p, DTensor) else p).double()
        count = torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device)
        sums = torch.stack([count, x.sum(), (x * x).sum()])
        if isinstance(p, DTensor):
            for dim, placement in enumerate(p.placements):
                if not placement.is_replicate():
                    dist.all_reduce(sums, group=p.device_mesh.get_group(dim))
        n, s, s2 = sums.tolist()
        mean = s / n if n else math.nan
        stats[canonical_name(name)] = {"numel": p.numel(), "dim": p.dim(), "count": int(n), "mean": mean,
                                       "std": math.sqrt(max(s2 / n - mean * mean, 0.0)) if n else math.nan}
    return stats


@torch.no_grad()
def shard_digests(model) -> list[tuple]:
    """This rank's (parameter, shard index, offset, dim, elements, sha1 of the bytes) per parameter. The index
    is the rank's coordinate on the mesh dimensions that shard the parameter: replicas share it."""
    out = []
    for name, p in model.named_parameters():
        local, index, offset = p, (), (0,) * p.dim()
        if isinstance(p, DTensor):
            local = p.to_local()
            coordinate = p.device_mesh.get_coordinate()
            index = tuple(c for c, placement in zip(coordinate, p.placements) if not placement.is_replicate())
            offset = tuple(compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)[1])
        data = local.detach().contiguous().cpu()
        digest = hashlib.sha1(data.view(torch.uint8).numpy()).hexdigest() if data.numel() else ""
        out.append((canonical_name(name), index, offset, p.dim(), data.numel(), digest))
    return out


def duplicates(per_rank: list[list[tuple]]) -> dict:
    """Pairs of different (parameter, shard) with equal bytes (0 expected), and shards whose copies differ.

    Expected equal, so not counted: the copies of one shard on several ranks (HSDP replicas; the norm
    weights on each tensor-parallel rank), which are compared with each other instead; the norm weights
    (vectors, all 1 by design: checked by their statistics); empty shards (uneven splits)."""
    by_key, by_digest, offsets = defaultdict(set), defaultdict(set), {}
    for entries in per_rank:
        for name, index, offset, dim, numel, digest in entries:
            if dim < 2 or numel == 0:
                continue
            key = (name, tuple(index))
            by_key[key].add(digest)
            by_digest[digest].add(key)
            offsets[key] = offset
    shown = lambda key: f"{key[0]}[offset {','.join(map(str, offsets[key]))}]"  # noqa: E731
    pairs = [(shown(a), shown(b)) for keys in by_digest.values() for a, b in combinations(sorted(keys), 2)]
    copies = sum(1 for entries in per_rank for e in entries if e[3] >= 2 and e[4]) - len(by_key)
    return {"shards": len(by_key), "pairs": len(pairs), "examples": pairs[:10], "replica_copies_compared": copies,
            "replica_mismatches": sorted(shown(k) for k, digests in by_key.items() if len(digests) > 1)}


# --- memory: the dry run of the same shrunk config ---------------------------------------------------

_PREDICT = r"""
import json, sys
from training import dry_run
args = json.loads(sys.argv[1])
hf_config = dry_run.hf_config
def shrunk(*a, **k):  # the dry run's model with the layout check's layers
    config = hf_config(*a, **k)
    config.num_hidden_layers = args["layers"]
    return config
dry_run.hf_config = shrunk
cfg = dry_run.load_model_config(args["config"])
report = dry_run.dry_run(cfg, args["world_size"], gpu_memory_gib=args["gpu_memory_gib"], vocab_size=args["vocab_size"])
print(json.dumps({"layout": report.layout, "categories": report.categories}))
"""


def predicted_memory(cfg: Config, layers: int, world_size: int, gpu_memory_gib: float) -> dict:
    """``dry_run`` of this config at ``world_size`` in a process of its own (it joins a fake process group):
    {"layout", "categories": {category: bytes}}. Its model is eager: compile only fuses temporaries."""
    config = cfg.to_dict()
    config["train"].update(compile=False, async_tp=False)
    args = json.dumps({"config": config, "layers": layers, "world_size": world_size,
                       "gpu_memory_gib": gpu_memory_gib, "vocab_size": cfg.model.vocab_size})
    # The jobs folder first; what the caller's path adds (packages installed beside the interpreter's) after it.
    path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    out = subprocess.run([sys.executable, "-c", _PREDICT, args], env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"dry run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def planned_step(cfg: Config, layers: int, world_size: int) -> dict:
    """The plan's step of this shrunk layout (``training.sizing.throughput``, the planner's formula) with this cluster's
    GPU peak, links and compute MFU (the jobs bundle's models/cluster.json): what the measured MFU is held to."""
    cluster = load_cluster()
    if not cluster.peak_tflops:
        raise ConfigError(f"{cluster.path} knows no peak FLOP/s of {cluster.instance_type}'s GPU")
    step = estimate_mfu(replace(resolve(cfg.model.preset), layers=layers), cfg.train, vocab=cfg.model.vocab_size,
                        seq_len=cfg.data.seq_len, gpus=world_size,
                        gpus_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world_size)),
                        peak_tflops=cluster.peak_tflops, node_link_gb_s=cluster.node_link_gb_s,
                        network_gb_s=cluster.network_gb_s, compute_mfu=cluster.plan_mfu)
    return {"mfu": step.mfu, "step_s": step.step_s, "compute_s": step.compute_s,
            "tensor_parallel_s": step.tensor_parallel_s, "data_parallel_s": step.data_parallel_s}


# --- the measurement ------------------------------------------------------------------------------

def measure(cfg: Config, d: distributed.Dist, layers: int, *, warmup: int, compile_check: bool,
            compile_steps: int) -> dict:
    """Every rank: build, check the init, train, time, and maybe the other compile setting. Rank 0 gets the
    record (numbers in acceptance's keys, ``None`` where not measured with the reason in ``not_measured``)."""
    vocab = cfg.model.vocab_size
    model_config = hf_config(cfg.model.preset, vocab, cfg.data.seq_len)
    model_config.num_hidden_layers = layers
    mesh = distributed.device_mesh(d, cfg.train)
    stepper = Steps(cfg, d, mesh, model_config)

    stats = init_statistics(stepper.model)
    digests = [None] * d.world_size if d.is_main else None
    dist.gather_object(shard_digests(stepper.model), digests, dst=0, group=d.control_group)

    def reset_peak(step: int) -> None:  # the peak of the steady state (the dry run's step), after warm-up
        if d.on_gpu and step == warmup:
            torch.cuda.reset_peak_memory_stats(d.device)

    losses, norms, seconds = run_steps(stepper, cfg.train.steps, reset_peak)
    r, why = {}, {}
    if d.on_gpu:
        peak = torch.tensor([torch.cuda.max_memory_allocated(d.device) / GIB], device=d.device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        r["peak_memory_gib"] = peak.item()  # the fullest GPU
        r["peak_reserved_gib"] = torch.cuda.max_memory_reserved(d.device) / GIB  # rank 0: the allocator's cache too
    else:
        why["peak_memory_gib"] = why["predicted_memory_gib"] = (
            "no GPU: torch.cuda.max_memory_allocated needs one, and the dry run predicts the GPU job's memory")

    compiled_first = cfg.train.compile if cfg.train.compile is not None else d.on_gpu
    if compile_check:
        del stepper
        gc.collect()
        if d.on_gpu:
            torch.cuda.empty_cache()
        other = cfg.model_copy(deep=True)
        other.train.compile = not compiled_first
        other_losses, _, _ = run_steps(Steps(other, d, mesh, model_config), compile_steps)
        first = losses[:compile_steps]
        r["compiled_losses"], r["eager_losses"] = (first, other_losses) if compiled_first else (other_losses, first)
    else:
        why["compiled_losses"] = why["eager_losses"] = (
            "compile check off on CPU (slow: ~1 min per process on 2 cores); tests/training/test_compile.py covers it"
            if not d.on_gpu else "compile check turned off (--no-compile-check)")
    if not d.is_main:
        return {}

    timed = seconds[warmup:]
    tokens_per_s = cfg.train.global_batch_size * cfg.data.seq_len * len(timed) / sum(timed)
    r.update(tokens_per_s=tokens_per_s, tokens_per_s_per_gpu=tokens_per_s / d.world_size, timed_steps=len(timed),
             flops_per_token=flops_per_token(model_config, cfg.data.seq_len), peak_flops=peak_flops(d.device))
    if r["peak_flops"] is None:
        why["peak_flops"] = why["mfu"] = ("no GPU: MFU is against a GPU's dense bf16 peak" if not d.on_gpu else
                                          f"peak FLOP/s of {torch.cuda.get_device_name(d.device)} unknown "
                                          "(training/components/metrics.py PEAK_BF16_FLOPS)")
    else:
        r["mfu"] = r["tokens_per_s_per_gpu"] * r["flops_per_token"] / r["peak_flops"]
    init_std = {}
    for name, s in stats.items():
        s["intended_mean"], s["intended_std"] = intended(name, s["dim"], model_config)
        if s["dim"] >= 2:
            init_std[name] = [s["std"], s["intended_std"]]
    dup = duplicates(digests)
    return {**r, "init_std": init_std, "init": stats, "duplicate_hashes": dup["pairs"], "duplicates": dup,
            "losses": losses, "grad_norms": norms, "step_seconds": seconds, "not_measured": why,
            "compile": compiled_first}


# --- the checks ----------------------------------------------------------------------------------

def _own(name: str, ok: bool, measured: str, expected: str, why_fail: str, source: str = "training/layout_check.py"
         ) -> Check:
    return Check(name, PASS if ok else FAIL, measured, expected, "" if ok else why_fail, source)


def checks(name: str, r: dict, gpu: bool) -> list[Check]:
    """acceptance's builders on the record, and this module's own: norms, shard statistics, replicas."""
    layout = f"layout {name}"
    norms = {p: s for p, s in r["init"].items() if s["dim"] < 2}
    off = sorted(p for p, s in norms.items() if not (abs(s["mean"] - 1) <= 1e-6 and s["std"] <= 1e-6))
    uncovered = sorted(p for p, s in r["init"].items() if s["count"] != s["numel"])
    dup = r["duplicates"]
    distinct = layout_checks.init_distinct(name, dup["pairs"])
    if dup["pairs"]:  # name them
        equal = "; ".join(f"{a} = {b}" for a, b in dup["examples"])
        distinct = replace(distinct, why=f"{distinct.why}; equal: {equal}")
    result = [
        layout_checks.init_std(name, r["init_std"]),
        _own(f"{layout}: norm weights all 1", not off, f"{len(norms) - len(off)} of {len(norms)} with mean 1, std 0",
             "mean 1, std 0 (within 1e-6)", f"off: {', '.join(off)}: init_weights did not fill them"),
        _own(f"{layout}: init statistics cover each parameter once", not uncovered,
             f"{len(r['init']) - len(uncovered)} of {len(r['init'])} parameters", "shards' elements = parameter's",
             f"{', '.join(uncovered)}: the shards do not tile the parameter"),
        distinct,
        _own(f"{layout}: copies of a shard equal", not dup["replica_mismatches"],
             f"{dup['replica_copies_compared']} copies compared, {len(dup['replica_mismatches'])} differ",
             "HSDP replicas (and tensor-parallel copies) equal",
             f"differ: {', '.join(dup['replica_mismatches'][:5])}: the replicas start from different weights"),
        layout_checks.loss_decreases(name, r["losses"]),
        layout_checks.grad_norm_finite(name, r["grad_norms"]),
    ]
    if gpu:
        return result + [layout_checks.peak_memory(name, r["peak_memory_gib"], r["predicted_memory_gib"]),
                         layout_checks.mfu(name, r["tokens_per_s_per_gpu"], r["flops_per_token"], r["peak_flops"],
                                        r["expected_mfu"]),
                         layout_checks.compile_matches_eager(name, r["compiled_losses"], r["eager_losses"])]
    result += [Check.no_gpu(f"{layout}: peak GPU memory vs dry run",
                            f"-{layout_checks.MEMORY_CONSERVATIVE:.0%} to +{layout_checks.MEMORY_TOLERANCE:.0%}",
                            layout_checks.MEMORY_SOURCE),
               Check.no_gpu(f"{layout}: MFU vs plan", f">= {layout_checks.MFU_MIN_RATIO:.0%} of the plan",
                            layout_checks.MFU_SOURCE)]
    compile_name, expected = f"{layout}: compiled vs eager losses", f"every step within {COMPILE_RTOL_CPU:g} (fp32)"
    if r["compiled_losses"] is None:
        return result + [Check(compile_name, NOT_MEASURED, "", expected,
                               r["not_measured"]["compiled_losses"]["why"], COMPILE_SOURCE_CPU, needs_gpu=True)]
    worst = max(abs(c - e) / abs(e) for c, e in zip(r["compiled_losses"], r["eager_losses"]))
    return result + [_own(compile_name, worst <= COMPILE_RTOL_CPU, f"max {worst:.2g}", expected,
                          "compiled layers compute something else than eager ones", COMPILE_SOURCE_CPU)]


# --- command line ----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.layout_check", description=__doc__.splitlines()[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 1)[1])
    parser.add_argument("--recipe", help="config file: a recipe (jobs/training/configs/) or a model's config")
    parser.add_argument("--preset", help="model widths (default: the config's, else the recipe file's name); "
                        "tiny on CPU")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps (default 12)")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of tokens/s and peak memory")
    parser.add_argument("--compile-check", action=argparse.BooleanOptionalAction, default=None,
                        help="also run the other train.compile setting from the same init (default: on GPU only)")
    parser.add_argument("--compile-steps", type=int, default=4, help="steps compared compiled vs eager (default 4)")
    parser.add_argument("--expected-mfu", type=float, help="the MFU the check holds the run to (0-1); default on GPU: "
                        "the plan's formula (training.sizing.throughput) for this shrunk layout on this cluster")
    parser.add_argument("--name", help="the layout's name: <out>/<name>.json (default: the recipe's or preset's)")
    parser.add_argument("--out", default="layout_check", help="folder for the JSON (default ./layout_check)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_intermixed_args(argv)
    if not args.recipe and not args.preset:
        return fail("no recipe or preset", "pass --recipe FILE (jobs/training/configs/llama2-70b.yaml) or --preset")
    if not (args.layers >= 1 and args.steps >= 3 and 0 <= args.warmup < args.steps and args.compile_steps >= 1):
        return fail(f"--layers {args.layers}, --steps {args.steps}, --warmup {args.warmup}, --compile-steps "
                    f"{args.compile_steps}", "use layers >= 1, steps >= 3, 0 <= warmup < steps, compile-steps >= 1")
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    try:
        cfg, shrunk = layout_config(args.recipe, args.preset, args.layers, args.steps, args.overrides, world_size)
        cfg.grad_accum_steps(world_size)
    except ConfigError as exc:
        return fail(exc)
    name = args.name or (Path(args.recipe).stem if args.recipe else cfg.model.preset)
    compile_check = torch.cuda.is_available() if args.compile_check is None else args.compile_check

    try:
        d = distributed.init(cfg.train.init_timeout_s)
    except ConfigError as exc:  # more ranks than GPUs
        return fail(exc)
    logging.basicConfig(level=logging.INFO if d.is_main else logging.WARNING,
                        format=f"%(asctime)s [rank{d.rank}] %(levelname)s %(name)s: %(message)s")
    record = describe(cfg, d, name, args, shrunk)
    try:
        record.update(measure(cfg, d, record["layers"], warmup=args.warmup, compile_check=compile_check,
                              compile_steps=min(args.compile_steps, args.steps)))
    except Exception as exc:  # the acceptance report needs the failure: rank 0 records it (an OOM as such)
        log.exception("layout check failed")
        record.update(error=f"{type(exc).__name__}: {exc}", oom=isinstance(exc, torch.cuda.OutOfMemoryError))
        if d.is_main:
            write(record, args.out)
        return 1
    finally:
        distributed.shutdown()
    return conclude(record, cfg, d, args.out) if d.is_main else 0


def describe(cfg: Config, d: distributed.Dist, name: str, args, shrunk: dict) -> dict:
    """What runs: the layout, its shrink, the widths, batch and device."""
    layers, p, t = shrunk["layers"]["used"], resolve(cfg.model.preset), cfg.train
    return {
        "layout": layout_name(cfg, d.world_size), "name": name, "recipe": args.recipe, "world_size": d.world_size,
        "shrunk": shrunk, "preset": cfg.model.preset, "layers": layers,
        "widths": {"hidden": p.hidden, "heads": p.heads, "kv_heads": p.kv_heads or p.heads, "ffn": p.ffn_size,
                   "vocab": cfg.model.vocab_size},
        "recomputed_layers": [i for i in range(layers) if t.activation_checkpointing
                              and i % t.activation_checkpointing_every == 0],
        "micro_batch_size": t.micro_batch_size, "accumulation": cfg.grad_accum_steps(d.world_size),
        "global_batch_size": t.global_batch_size, "seq_len": cfg.data.seq_len, "steps": t.steps,
        "warmup_steps": args.warmup, "lr": cfg.optim.lr,
        "device": torch.cuda.get_device_name(d.device) if d.on_gpu else "cpu",
        "dtype": "bf16 compute, fp32 parameters and gradient reduction (FSDP mixed precision)" if d.on_gpu else "fp32",
        "expected_mfu": args.expected_mfu,
    }


def conclude(record: dict, cfg: Config, d: distributed.Dist, out: str) -> int:
    """Rank 0, after the measurement: the dry run's prediction (GPU), the checks, the JSON, the exit status."""
    why = record["not_measured"]
    if record["expected_mfu"] is None and not d.on_gpu:
        why["expected_mfu"] = "no GPU: the plan's MFU is a GPU's"
    elif record["expected_mfu"] is None:
        try:
            record["planned"] = planned_step(cfg, record["layers"], d.world_size)
            record["expected_mfu"] = record["planned"]["mfu"]
        except ConfigError as exc:
            why["expected_mfu"] = f"the plan's figures of this cluster: {exc}"
    if d.on_gpu:  # after the measurement: the dry run takes a CPU core
        try:
            predicted = predicted_memory(cfg, record["layers"], d.world_size,
                                         torch.cuda.get_device_properties(d.device).total_memory / GIB)
        except RuntimeError as exc:
            why["predicted_memory_gib"] = str(exc)
        else:
            gib = {k: v / GIB for k, v in predicted["categories"].items()}
            # What torch's allocator holds, as max_memory_allocated counts it: less the CUDA context and
            # NCCL buffers (the dry run's "runtime").
            record["predicted_memory_gib"] = sum(gib.values()) - gib.get("runtime", 0.0)
            record["predicted_memory"] = {"layout": predicted["layout"], "gib": gib}
    for key, reason in why.items():
        record.setdefault(key, None)
        why[key] = {"status": "not measured", "why": reason}
    report = Report(d.on_gpu, checks(record["name"], record, d.on_gpu))
    record.update(verdict=report.verdict, checks=[asdict(c) for c in report.checks])
    path = write(record, out)
    print(f"{record['name']}: {record['layout']}, {d.world_size} ranks, {record['preset']} x {record['layers']} "
          f"layers: {report.verdict} ({path})")
    for c in report.checks:
        print(f"  {c.status:<12} {c.name}: {c.measured or c.why}")
    for c in report.blocking():
        print(f"problem: {c.name}: {c.why}", file=sys.stderr)
    return 0 if report.verdict == GO else 1


def write(record: dict, out: str) -> Path:
    path = Path(out) / f"{record['name']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


if __name__ == "__main__":
    sys.exit(main())
