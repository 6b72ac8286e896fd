"""Production dry run: one rank of the real job, at its real world size, without GPUs or memory.

    python -m training.dry_run model7 --env prod        # on the head node: the bundle's models/cluster.json
    python -m cluster_config jobs --env prod --out /tmp/jobs-prod   # in a checkout: prod's job files, then
    PYTHONPATH=jobs python -m training.dry_run model7 --env prod --jobs-dir /tmp/jobs-prod
    PYTHONPATH=jobs python -m training.dry_run --config jobs/training/configs/llama2-7b.yaml model.preset=llama2-7b \
        --world-size 88 --gpu-memory-gib 140

A model's config, world size and GPU memory come from the jobs bundle's ``models/cluster.json`` and
``models/<model>.yaml`` (training/cluster.py), generated from the settings with the job scripts.

The process joins PyTorch's fake process group (collectives return at once) as rank 0 of N, builds
the model exactly as ``train.py`` does (preset, FSDP2 wrapping, tensor parallelism, mixed precision,
activation checkpointing) inside ``FakeTensorMode`` (tensors have shapes and dtypes but no storage),
and runs a steady-state training step (optimizer state present, gradient shards from earlier
micro-batches present) under FSDP2's memory tracker. The peak per-GPU memory is reported by category against the GPU's memory, and any
wrapping or config error the launch would hit is raised here first.

How the GPU is modelled on a CPU:
- Mixed precision is forced on as on a GPU: bf16 parameters and compute, fp32 gradient reduction.
- Attention runs through PyTorch's fused flash-attention kernel (the CPU one): what it keeps for
  backward is the output and a per-row logsumexp, linear in seq_len, as the CUDA flash and
  memory-efficient kernels keep; its meta implementation gives the sizes. The CUDA flash backward
  also holds an fp32 accumulator of the query gradient while it runs: added as ``attention workspace``.
- What tensors cannot show is added as ``runtime``: CUDA context, cuBLAS workspaces and NCCL
  buffers (``RUNTIME_GIB``, a measured-order estimate). Allocator fragmentation is what the
  required headroom (``HEADROOM``) is for.

The estimate is checked against real CPU memory (``measure_cpu``) and an analytic model of the
production shapes in tests/training/test_dry_run.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker

from cli import ArgumentParser, fail

from training.parallel import distributed
from training.cluster import Cluster, add_arguments, load_cluster
from training.config import Config, ConfigError, load_config, read_config_file
from training.models.llama import hf_config
from training.models.presets import resolve

GIB = 1024**3
# CUDA context, library workspaces and NCCL's buffers, outside torch's allocator. Measured on one H100
# (benchmarks/results/gpu_check_H100): context 0.60 GiB, cuBLAS 0.03, one NCCL communicator of 1 rank 0.55;
# the rest is the estimate for a layout's several communicators with peers (~0.5-1.6 GiB each, reported).
RUNTIME_GIB = 3.0
HEADROOM = 0.15  # of the GPU's memory left free: fragmentation, spikes, what the model cannot see
DEFAULT_VOCAB = 32000  # Llama-2's tokenizer: the production configs' vocabulary


@dataclass
class Report:
    """Per-GPU memory of one rank at the step's peak, in bytes by category."""

    model: str
    preset: str
    world_size: int
    layout: str  # e.g. "FSDP 112" or "FSDP 14 x TP 8"
    micro_batch_size: int
    accumulation: int
    activation_checkpointing: str  # "off", "on" (every layer) or "on, 1 layer in 4"
    grad_sync: str  # "every micro-batch" or "last micro-batch"
    gpu_memory_gib: float
    categories: dict[str, int] = field(default_factory=dict)  # at the peak; sums to ``peak_bytes``
    seconds: float = 0.0

    @property
    def peak_bytes(self) -> int:
        return sum(self.categories.values())

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def fraction(self) -> float:
        return self.peak_gib / self.gpu_memory_gib

    @property
    def fits(self) -> bool:
        return self.fraction <= 1 - HEADROOM

    @property
    def other_bytes(self) -> int:
        """Everything but parameters, gradients, optimizer state and activations."""
        main = ("parameters", "gradients", "optimizer", "activations")
        return sum(v for k, v in self.categories.items() if k not in main)

    def as_dict(self) -> dict:
        return {"model": self.model, "preset": self.preset, "world_size": self.world_size, "layout": self.layout,
                "micro_batch_size": self.micro_batch_size, "accumulation": self.accumulation,
                "activation_checkpointing": self.activation_checkpointing, "grad_sync": self.grad_sync,
                "gpu_memory_gib": self.gpu_memory_gib, "peak_gib": round(self.peak_gib, 2),
                "fraction": round(self.fraction, 4), "fits": self.fits,
                "gib": {k: round(v / GIB, 2) for k, v in self.categories.items()}}

    def table_row(self) -> str:
        c = {k: v / GIB for k, v in self.categories.items()}
        c["other"] = self.other_bytes / GIB
        return (f"| {self.model} | {self.preset} | {self.layout} | {self.micro_batch_size} x {self.accumulation} | "
                f"{self.activation_checkpointing} | {c['parameters']:.1f} | {c['gradients']:.1f} | "
                f"{c['optimizer']:.1f} | {c['activations']:.1f} | {c['other']:.1f} | **{self.peak_gib:.1f}** | "
                f"{100 * self.fraction:.0f} % |")

    def summary(self) -> str:
        lines = [f"{self.model} ({self.preset}): {self.layout}, micro-batch {self.micro_batch_size} x "
                 f"{self.accumulation} accumulation, activation checkpointing "
                 f"{self.activation_checkpointing}, gradients reduced {self.grad_sync}",
                 f"  peak per GPU {self.peak_gib:.1f} GiB of {self.gpu_memory_gib:.0f} GiB "
                 f"({100 * self.fraction:.0f} %, limit {100 * (1 - HEADROOM):.0f} %): "
                 f"{'fits' if self.fits else 'DOES NOT FIT'}"]
        for name, value in self.categories.items():
            lines.append(f"    {name:<22} {value / GIB:8.2f} GiB")
        lines.append(f"  ({self.seconds:.0f} s)")
        return "\n".join(lines)


TABLE_HEADER = ("| model | preset | layout (GPUs) | micro-batch x accumulation | act. ckpt | params GiB | grads GiB | "
                "optimizer GiB | activations GiB | other GiB | peak GiB | of GPU |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|")

# FSDPMemTracker's categories, folded into the report's.
_CATEGORY = {
    "Sharded Param": "parameters", "Unsharded Param": "parameters", "Buffer": "parameters",
    "Sharded Grad": "gradients", "Unsharded Grad": "gradients",
    "OptState": "optimizer",
    "Activation": "activations", "Inputs": "activations",
    "Temp": "temporaries", "All Gather": "communication", "Reduce Scatter": "communication",
}


def fake_dist(world_size: int, rank: int = 0) -> distributed.Dist:
    """Join the fake process group as ``rank`` of ``world_size``: collectives are no-ops."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group already exists in this process; run the dry run in its own process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    group = dist.group.WORLD
    return distributed.Dist(rank, world_size, rank % 8, torch.device("cpu"), group, group)


def dry_run(cfg: Config, world_size: int, *, gpu_memory_gib: float = 141.0, vocab_size: int = 0,
            gpu: bool = True) -> Report:
    """Peak memory of rank 0 of ``world_size`` in a steady-state step of ``cfg``'s training loop.

    ``vocab_size``: 0 is the architecture's (a config.json fixes it), else the config's, else DEFAULT_VOCAB.

    ``gpu``: model the GPU job (bf16 mixed precision, kernel workspace, runtime); False models the
    same run on CPU (fp32, nothing added), which ``measure_cpu`` checks.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from training.models.llama import compute_loss
    from training.train import build

    start = time.perf_counter()
    accum = cfg.grad_accum_steps(world_size)
    d = fake_dist(world_size)
    vocab_size = vocab_size or vocabulary(cfg)
    model_config = hf_config(cfg.model.preset, vocab_size, cfg.data.seq_len)
    deferred = cfg.train.grad_reduce == "last_micro_batch" or cfg.train.parallelism == "ddp"
    try:
        mesh = distributed.device_mesh(d, cfg.train)  # outside fake mode: it reads real rank tensors
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        model, optimizer = build(cfg, model_config, d, mesh, mixed_precision=gpu, allocating=fake, initialize=False)
        with fake:
            if cfg.train.parallelism == "ddp":
                model.register_comm_hook(None, _no_communication)
                tracker = _peak_only(MemTracker)()
                tracker.track_external(model, optimizer)
            else:
                tracker = _peak_only(FSDPMemTracker)(model, optimizer)
            shape = (cfg.train.micro_batch_size, cfg.data.seq_len)
            _warm_up(model, optimizer, cfg)  # before tracking: see _warm_up
            with tracker:
                # The measured step starts mid-accumulation (gradient shards from earlier micro-batches
                # are there, as is the optimizer state). Deferred reduction needs a second micro-batch
                # to hold the first one's unsharded gradients.
                micro = min(accum, 2) if deferred else 1
                for m in range(micro):
                    inputs = torch.randint(0, vocab_size, shape)
                    labels = torch.randint(0, vocab_size, shape)
                    with (distributed.gradient_sync(model, m == micro - 1, cfg.train.grad_reduce),
                          distributed.loss_parallel(cfg.train)):
                        (compute_loss(model, inputs, labels, chunks=cfg.train.loss_chunks) / accum).backward()
                    tracker.reset_mod_stats()  # per-module stats only (one forward each); the peak stays
                distributed.clip_grad_norm(model, cfg.optim.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            peak = tracker.get_tracker_snapshot("peak")
    finally:
        dist.destroy_process_group()

    device_peak = next(iter(peak.values()))
    categories = {"parameters": 0, "gradients": 0, "optimizer": 0, "activations": 0,
                  "temporaries": 0, "communication": 0}
    for name, value in device_peak.items():
        if name != "Total":
            categories[_CATEGORY.get(getattr(name, "value", name), "temporaries")] += value
    if gpu:
        categories["attention workspace"] = _attention_workspace(model_config, cfg)
        categories["runtime"] = int(RUNTIME_GIB * GIB)
    tp = cfg.train.tensor_parallel
    layout = {"ddp": "DDP", "fsdp": "FSDP", "hsdp": "HSDP"}[cfg.train.parallelism]
    layout = f"{layout} {world_size // tp}" + (f" x TP {tp}" if tp > 1 else "")
    if cfg.train.parallelism == "hsdp":
        layout += f" (shards of {cfg.train.hsdp_shard_size})"
    return Report(
        model=cfg.name, preset=cfg.model.preset, world_size=world_size, layout=layout,
        micro_batch_size=cfg.train.micro_batch_size, accumulation=accum,
        activation_checkpointing=_checkpointing(cfg),
        grad_sync="last micro-batch" if deferred else "every micro-batch", gpu_memory_gib=gpu_memory_gib,
        categories=categories, seconds=time.perf_counter() - start)


def _no_communication(state, bucket):  # unannotated: DDP compares the annotation as an object, not a string
    """DDP's gradient all-reduce, done: the bucket as it is. The fake process group's all-reduce gives DDP
    no tensor back, which its reducer refuses; the bucket's memory is DDP's either way."""
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def _peak_only(tracker: type) -> type:
    """``tracker`` keeping the device's peak only. torch's memory trackers also keep each module's peak,
    walking every module after every operation: 6 million steps and a third of the 70B dry run's time,
    for figures the report does not read."""

    class PeakOnly(tracker):
        def _update_peak_stats(self, peak_state) -> None:  # torch's, less the walk over the modules
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot["Total"]:
                    self._peak_mem[device] = snapshot["Total"]
                    self._peak_mem_snap[device] = dict(snapshot)

    return PeakOnly


def _checkpointing(cfg: Config) -> str:
    every = cfg.train.activation_checkpointing_every
    if not cfg.train.activation_checkpointing:
        return "off"
    return "on" if every == 1 else f"on, 1 layer in {every}"


def _warm_up(model, optimizer, cfg: Config) -> None:
    """One clip + optimizer step on zero gradient shards, untracked: the state of step 2 and later.

    Afterwards the optimizer state and gradient shards exist (the tracker files them under their
    categories when it starts), and DTensor's caches are warm: the first call of each DTensor
    operation infers its output sharding by running it on fake tensors of the *global* shape,
    which a tracker would count (4 bytes x all parameters at once, e.g. 257 GiB for 70B) although
    no GPU ever allocates it.
    """
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    distributed.clip_grad_norm(model, cfg.optim.grad_clip)
    optimizer.step()


def analytic_activation_bytes(model_config, micro_batch_size: int, seq_len: int) -> int:
    """Activations kept for backward without checkpointing or tensor parallelism, counted by hand.

    Per token and layer, bf16 unless noted: each RMSNorm keeps its input in fp32 and its output
    (2 x (4h + 2h)); Q, K, V after RoPE (2h + 4kv); the attention output and o_proj's input
    (2 x 2h); the four SwiGLU tensors (4 x 2f); the attention's logsumexp (4 x heads, fp32).
    Plus the fp32 logits and their gradient (8 x vocab per token).
    """
    c = model_config
    h, f, heads = c.hidden_size, c.intermediate_size, c.num_attention_heads
    kv = c.num_key_value_heads * (h // heads)
    per_token_layer = 12 * h + (2 * h + 4 * kv) + 4 * h + 8 * f + 4 * heads
    tokens = micro_batch_size * seq_len
    return tokens * (c.num_hidden_layers * per_token_layer + 8 * c.vocab_size)


def _attention_workspace(model_config, cfg: Config) -> int:
    """The CUDA flash backward's fp32 query-gradient accumulator for one layer (b x s x hidden x 4 B), of
    this rank's heads: tensor parallel splits the heads over its ranks."""
    heads_width = model_config.hidden_size // cfg.train.tensor_parallel
    return cfg.train.micro_batch_size * cfg.data.seq_len * heads_width * 4


_MEASURE = r"""
import json, os, resource, sys, torch, torch.distributed as dist
from training.parallel import distributed
from training.dry_run import load_model_config
from training.models.llama import hf_config
from training.models.llama import compute_loss
from training.train import build

args = json.loads(sys.argv[1])
torch.manual_seed(0)
cfg = load_model_config(args["config"], args["overrides"])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args["port"]))
dist.init_process_group("gloo", rank=0, world_size=1)
d = distributed.Dist(0, 1, 0, torch.device("cpu"), dist.group.WORLD, dist.group.WORLD)
model_config = hf_config(cfg.model.preset, args["vocab_size"], cfg.data.seq_len)
profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
profiler.__enter__()
model, optimizer = build(cfg, model_config, d, distributed.device_mesh(d, cfg.train), mixed_precision=False)
accum = cfg.grad_accum_steps(1)
# The peak is in step 2's last micro-batch (optimizer state and earlier micro-batches' gradients are there) or in
# an optimizer step; what the micro-batches before it leave behind does not depend on their batch's shape, so
# they run on one row of 8 tokens, and the last at the config's shape.
for step in range(2):
    for m in range(accum):
        last = step == 1 and m == accum - 1
        shape = (cfg.train.micro_batch_size, cfg.data.seq_len) if last else (1, 8)
        inputs = torch.randint(0, args["vocab_size"], shape)
        labels = torch.randint(0, args["vocab_size"], shape)
        with distributed.gradient_sync(model, m == accum - 1, cfg.train.grad_reduce):
            (compute_loss(model, inputs, labels) / accum).backward()
    distributed.clip_grad_norm(model, cfg.optim.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
profiler.__exit__(None, None, None)
# Every CPU allocator event (+bytes allocated, -bytes freed) in time order; the running sum's maximum.
events = sorted((e.start_ns(), e.nbytes()) for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]")
live = peak = 0
for _, delta in events:
    live += delta
    peak = max(peak, live)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak_bytes": peak, "max_rss_bytes": rss}))
dist.destroy_process_group()
"""


def measure_cpu(config_path: str, overrides: list[str] = (), *, vocab_size: int = DEFAULT_VOCAB) -> int:
    """Real memory of two training steps of the config on one CPU process (fp32, world size 1).

    PyTorch's profiler records every allocation and free of the CPU allocator (``profile_memory``)
    from before the model is built: the peak of their running sum is the most tensor memory that
    was live at once, what the dry run estimates (the process's own resident memory adds the
    interpreter, libraries and the allocator's cache on top).
    """
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    args = json.dumps({"config": str(config_path), "overrides": list(overrides), "vocab_size": vocab_size, "port": port})
    out = subprocess.run([sys.executable, "-c", _MEASURE, args], env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"CPU measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]


def production_setup(model: str, cluster: Cluster) -> tuple[dict, int, float]:
    """What ``model`` trains with on ``cluster`` (its jobs bundle's models/cluster.json): the training
    config its job script runs, its world size and its GPUs' memory (GiB)."""
    job = cluster.models.get(model)
    if job is None:
        raise ConfigError(f"model {model!r} is not in the {cluster.environment} plan; choose one of "
                          f"{', '.join(cluster.models)} ({cluster.path})")
    if cluster.gpu_memory_gib is None:
        raise ConfigError(f"GPU memory of {cluster.instance_type} is unknown ({cluster.path}) — pass --gpu-memory-gib, "
                          f"or set plan.gpu_memory_gib in cluster_config/{cluster.environment}.yaml")
    return read_config_file(job.config), job.world_size, cluster.gpu_memory_gib


def estimate(model: str, cluster: Cluster | None = None, overrides: list[str] = ()) -> dict:
    """The dry run of ``model`` on ``cluster`` (default: this bundle's) as plain numbers (GiB), for other tools.

    {"model", "preset", "world_size", "layout", "micro_batch_size", "accumulation",
     "activation_checkpointing", "gpu_memory_gib", "peak_gib", "fraction", "fits", "gib": {category: GiB}}
    Takes seconds for 7B and a few minutes for 70B on two CPU cores.
    """
    raw, world_size, gpu_gib = production_setup(model, cluster or load_cluster())
    cfg = load_model_config(raw, overrides)
    report = dry_run(cfg, world_size, gpu_memory_gib=gpu_gib)
    return report.as_dict()


def vocabulary(cfg: Config) -> int:
    """The vocabulary a dry run of ``cfg`` sizes: the architecture's (its config.json fixes it), else the config's
    model.vocab_size, else DEFAULT_VOCAB (no dataset to size it), as the planner does with plan.vocab_size."""
    return resolve(cfg.model.preset).vocab or cfg.model.vocab_size or DEFAULT_VOCAB


def load_model_config(source: str | dict, overrides: list[str] = ()) -> Config:
    """The job's config (a file, or a mapping); directory variables only need a value, nothing is read or written."""
    for var in ("FSX_DATA", "FSX_CHECKPOINTS", "FSX_LOGS"):
        os.environ.setdefault(var, f"/dry-run/{var.lower()}")
    return load_config(source, list(overrides))


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.dry_run", description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="model of the plan (e.g. model7): its config in the jobs folder")
    add_arguments(parser)  # --jobs-dir, --env: the cluster file giving the model's config, nodes and GPU
    parser.add_argument("--config", help="a config file instead of the model's own")
    parser.add_argument("--world-size", type=int, help="ranks (default: the model's nodes x GPUs per node)")
    parser.add_argument("--gpu-memory-gib", type=float, help="memory per GPU (default: the cluster file's GPU)")
    parser.add_argument("--vocab-size", type=int, default=0,
                        help=f"vocabulary (default: the architecture's config.json's, else the config's model.vocab_size, "
                             f"else {DEFAULT_VOCAB})")
    parser.add_argument("--json", action="store_true", help="also print the numbers as one JSON line")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_intermixed_args(argv)
    if args.model and "=" in args.model:  # --config FILE section.key=value: an override, not a model's name
        args.overrides, args.model = [args.model, *args.overrides], None
    if not args.model and not args.config:
        return fail("no model", "name a model of the plan (e.g. model7) or pass --config FILE")
    try:
        world_size, gpu_gib = args.world_size, args.gpu_memory_gib
        if args.config:
            cfg = load_model_config(args.config, args.overrides)
        if not args.config or world_size is None or gpu_gib is None:
            cluster = load_cluster(args.jobs_dir, args.env)
            raw, planned, memory = production_setup(args.model or cfg.name, cluster)
            cfg = cfg if args.config else load_model_config(raw, args.overrides)
            world_size, gpu_gib = world_size or planned, gpu_gib or memory
        report = dry_run(cfg, world_size, gpu_memory_gib=gpu_gib, vocab_size=args.vocab_size)
    except ConfigError as exc:
        return fail(exc)
    print(report.summary())
    if args.json:
        print(json.dumps(report.as_dict()))
    return 0 if report.fits else 1


if __name__ == "__main__":
    sys.exit(main())
