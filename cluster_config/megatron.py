"""Megatron-LM for the models whose entry has ``megatron:``: its rules, its arguments, its size.

A model's entry says what to train (preset, seq_len, global batch, steps, data, tokenizer) and,
under ``megatron:``, how Megatron-LM lays it out (tensor and pipeline parallel, micro-batch,
sequence parallel, recomputation, precision). From those:

- ``layout_problems``: Megatron-LM's own rules, checked at synth (the plan's errors and the job files
  refuse a layout Megatron would stop on at start-up, or silently change), each naming the field and
  the fix.
  From ``megatron/training/arguments.py`` (``validate_args``) and megatron-core's
  ``TransformerConfig`` and tensor-parallel layers: the world size divisible by TP x PP, the layers
  by PP, the attention heads and MLP width by TP, the key/value heads a multiple or a divisor of TP,
  hidden by heads (unless the head size is explicit), the global batch by micro-batch x DP, the
  sequence by TP under sequence parallelism, and sequence parallelism only with TP > 1 (Megatron
  turns it off without a word).
  Ours beside them: TP within one node (its all-gathers run every layer: NVLink, not EFA).
- ``arguments``: the arguments of ``pretrain_gpt.py`` for the entry, written to the bundle as
  ``jobs/models/<model>.megatron.args`` by cluster_config/model_jobs.py; the job adds the paths
  (jobs/megatron_lm/args.py).
- ``sizing``: memory per GPU and step time of the layout, for the plan (cluster_config/plan.py).

Torch-free, like the rest of the planner.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from training.models.architecture import Architecture, ArchitectureError
from training.models.presets import resolve
from training.parallel.communication import step_traffic
from training.sizing.memory import Memory
from training.sizing.throughput import BUS_EFFICIENCY, StepEstimate

from cluster_config.hardware import Gpu, gpu_of
from cluster_config.model_configs import model_config
from cluster_config.settings import ModelPlan, Settings, SettingsError, load_settings

VOCAB_MULTIPLE = 128  # --make-vocab-size-divisible-by (Megatron's default): the embedding rows are padded to 128 x TP


def padded_vocab(vocab_size: int, tensor_parallel: int) -> int:
    """The embedding's rows as Megatron pads them (``vocab_utils``: a multiple of 128 x TP)."""
    multiple = VOCAB_MULTIPLE * tensor_parallel
    return -(-vocab_size // multiple) * multiple


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _architecture(model: ModelPlan) -> Architecture | None:
    try:
        return resolve(model.preset)
    except ArchitectureError:
        return None  # an unknown preset: reported (with its fix) by the plan, which resolves it too


def layout_problems(settings: Settings, model: ModelPlan) -> list[str]:
    """What Megatron-LM would refuse (or silently change) in the entry's layout; [] when it has none."""
    layout = model.megatron
    arch = _architecture(model)
    if layout is None or arch is None:
        return []
    where = f"cluster_config/{settings.name}.yaml models: {model.name}: megatron"
    per_node = settings.gpu_queue.gpus_per_instance
    gpus = model.nodes * per_node
    tp, pp, micro = layout.tensor_parallel, layout.pipeline_parallel, layout.micro_batch_size
    problems = []

    def refuse(field: str, why: str, fix: str) -> None:
        problems.append(f"{where}{'.' + field if field else ''}: {why}; {fix}")

    if per_node % tp:
        refuse("tensor_parallel", f"{tp} does not divide the {per_node} GPUs of a node (tensor parallel "
               "all-gathers every layer: it stays within a node's NVLink)",
               f"use one of {', '.join(map(str, _divisors(per_node)))}")
    kv_heads = arch.kv_heads or arch.heads

    def splits(d: int) -> bool:  # key/value heads: split over TP, or each replicated on TP / kv ranks
        return arch.heads % d == 0 and (kv_heads % d == 0 or d % kv_heads == 0) and arch.ffn_size % d == 0

    if not splits(tp):
        fits = [d for d in _divisors(per_node) if splits(d)]
        refuse("tensor_parallel", f"{tp} does not split preset {model.preset} (heads {arch.heads}, key/value heads "
               f"{kv_heads}, MLP width {arch.ffn_size}): each tensor-parallel rank holds whole heads and an equal "
               "share of the MLP", f"use one of {', '.join(map(str, fits))}")
    if not arch.head_dim and arch.hidden % arch.heads:
        refuse("", f"preset {model.preset}: hidden {arch.hidden} is not a multiple of its "
               f"{arch.heads} heads (Megatron derives the head size from them)",
               "use a preset whose config.json sets head_dim")
    if arch.layers % pp:
        fits = [d for d in _divisors(arch.layers) if gpus % (tp * d) == 0]
        refuse("pipeline_parallel", f"{pp} does not divide the {arch.layers} layers of preset {model.preset} "
               "(every stage holds as many layers)", f"use one of {', '.join(map(str, fits))}")
    if gpus % (tp * pp):
        refuse("pipeline_parallel", f"tensor_parallel x pipeline_parallel = {tp * pp} does not divide the model's "
               f"{gpus} GPUs ({model.nodes} nodes x {per_node}): the data-parallel replicas would not be whole",
               f"use a product that divides {gpus}, or give the model a number of nodes it divides")
    else:
        dp = gpus // (tp * pp)
        if model.global_batch_size % (micro * dp):
            batches = range(micro * dp, 2 * model.global_batch_size + 1, micro * dp)
            near = min(batches, key=lambda b: abs(b - model.global_batch_size))
            refuse("micro_batch_size", f"the global batch {model.global_batch_size} is not a multiple of micro-batch "
                   f"{micro} x data parallel {dp} = {micro * dp} (each step must be whole micro-batches on every "
                   "replica)", f"set global_batch_size: {near}, or change the layout")
    if layout.sequence_parallel and tp == 1:
        refuse("sequence_parallel", "true with tensor_parallel 1: Megatron turns it off without saying so",
               "remove it (it is on by default with tensor parallel) or raise tensor_parallel")
    if layout.sequence_parallel_on and model.seq_len % tp:
        refuse("tensor_parallel", f"sequence parallel splits the {model.seq_len}-token sequence over {tp} ranks",
               f"use a seq_len divisible by {tp}, or sequence_parallel: false")
    entry = f"cluster_config/{settings.name}.yaml models: {model.name}"
    if model.hot_spares:
        problems.append(f"{entry}: hot_spares {model.hot_spares} with megatron: a Megatron-LM job restarts by "
                        "requeueing, not onto a hot spare inside the job; set hot_spares: 0")
    if model.min_nodes:
        problems.append(f"{entry}: min_nodes {model.min_nodes} with megatron: a Megatron-LM job trains on its whole "
                        "layout or waits for it (TP x PP x DP is fixed); remove min_nodes")
    if arch.rope_scaling:
        refuse("", f"preset {model.preset} scales its rotary embedding ({dict(arch.rope_scaling)}), which these "
               "arguments do not pass to Megatron-LM", "train it with the project's trainer (remove megatron:)")
    return problems


def vocabulary(settings: Settings, model: ModelPlan) -> int:
    """The tokenizer's vocabulary: the architecture's when it fixes one, else plan.vocab_size."""
    arch = _architecture(model)
    return (arch.vocab if arch and arch.vocab else 0) or settings.plan.vocab_size


def arguments(settings: Settings, model: ModelPlan) -> list[str]:
    """``pretrain_gpt.py``'s arguments for the entry: shape, layout, precision, schedule and optimizer.

    The optimizer and its schedule are the model's recipe's (jobs/training/configs/), as for the
    project's trainer; the data, tokenizer, checkpoint and log paths are added by the job. SettingsError
    when Megatron-LM would refuse the layout (``layout_problems``): the job files are written at synth."""
    problems = layout_problems(settings, model)
    if problems:
        raise SettingsError("\n  ".join(problems))
    layout, arch, cfg = model.megatron, resolve(model.preset), model_config(settings, model)
    assert layout is not None
    optim = cfg.optim
    args = [
        # Llama's decoder: rotary positions, RMSNorm, SwiGLU, no biases, untied output projection.
        "--num-layers", arch.layers, "--hidden-size", arch.hidden, "--num-attention-heads", arch.heads,
        "--ffn-hidden-size", arch.ffn_size, "--seq-length", model.seq_len,
        "--max-position-embeddings", max(model.seq_len, arch.max_positions),
        "--position-embedding-type", "rope", "--rotary-base", f"{arch.rope_theta:g}",
        "--normalization", "RMSNorm", "--norm-epsilon", f"{arch.rms_norm_eps:g}", "--swiglu",
        "--disable-bias-linear", "--attention-dropout", 0, "--hidden-dropout", 0,
        "--make-vocab-size-divisible-by", VOCAB_MULTIPLE,
    ]
    if arch.head_dim:
        args += ["--kv-channels", arch.head_dim]
    if arch.kv_heads and arch.kv_heads != arch.heads:
        args += ["--group-query-attention", "--num-query-groups", arch.kv_heads]
    if arch.qkv_bias:
        args += ["--add-qkv-bias"]
    if not arch.tied_embeddings:
        args += ["--untie-embeddings-and-output-weights"]
    args += ["--tensor-model-parallel-size", layout.tensor_parallel,
             "--pipeline-model-parallel-size", layout.pipeline_parallel,
             "--micro-batch-size", layout.micro_batch_size, "--global-batch-size", model.global_batch_size,
             f"--{layout.precision}"]
    if layout.sequence_parallel_on:
        args += ["--sequence-parallel"]
    if layout.distributed_optimizer:
        args += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    if layout.recompute == "selective":
        args += ["--recompute-activations"]
    elif layout.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", 1]
    args += [
        "--train-iters", model.steps, "--lr", f"{optim.lr:g}", "--min-lr", f"{optim.min_lr:g}",
        "--lr-decay-style", "cosine", "--lr-warmup-iters", optim.warmup_steps, "--lr-decay-iters", model.steps,
        "--weight-decay", f"{optim.weight_decay:g}", "--adam-beta1", f"{optim.beta1:g}",
        "--adam-beta2", f"{optim.beta2:g}", "--clip-grad", f"{optim.grad_clip:g}", "--init-method-std", 0.02,
        "--save-interval", layout.save_every, "--ckpt-format", "torch_dist", "--log-interval", cfg.log.interval,
        "--eval-interval", cfg.eval.every or model.steps, "--eval-iters", cfg.eval.batches or 10,
        # Saves and exits on SIGTERM at the next iteration (the job's --signal, and scancel).
        "--exit-signal-handler",
    ]
    return [str(arg) for arg in args]


@dataclass(frozen=True)
class Sized:
    """A Megatron layout's memory per GPU and optimizer step, as the plan sizes the project's trainer."""

    memory: Memory
    step: StepEstimate
    micro_batches: int  # per replica per step
    bubble: float  # the 1F1B pipeline's idle share of compute: (PP - 1) / micro-batches


def sizing(settings: Settings, model: ModelPlan, gpu: Gpu) -> Sized:
    """Memory per GPU (the busiest stage: the first, with the embedding) and the step, from the shape.

    Memory (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"):
    bf16 weights (2 bytes a parameter), fp32 main gradients (4: Megatron accumulates in fp32) and the
    optimizer's fp32 master weights and two moments (12), sharded over DP with the distributed optimizer.
    Activations per layer and micro-batch, ``s b h`` tokens x width: ``34 / t`` bytes with sequence
    parallel and selective recomputation (``5 a s / h`` more without recomputation, ``2 / t`` with full),
    and the first stage of a 1F1B schedule holds PP micro-batches in flight. Transient: fp32 logits and
    their gradient on the output stage (8 bytes x padded vocabulary / t per token).
    Step: the model's FLOPs (and full recomputation's second forward) at ``plan.mfu``, stretched by the
    pipeline's bubble; tensor parallel's collectives on the critical path and the data-parallel
    gradient reduce-scatter and parameter all-gather (overlapped with compute) as the project's
    trainer's are counted (training/parallel/communication.py: a stage's layers, DDP's bytes).
    """
    layout = model.megatron
    assert layout is not None
    arch = resolve(model.preset)
    tp, pp, micro = layout.tensor_parallel, layout.pipeline_parallel, layout.micro_batch_size
    per_node = settings.gpu_queue.gpus_per_instance
    gpus = model.nodes * per_node
    dp = max(1, gpus // (tp * pp))
    vocab = padded_vocab(vocabulary(settings, model), tp)
    stage_layers = arch.layers // pp
    per_stage = stage_layers * arch.layer_parameters / tp + vocab * arch.hidden / tp  # + the embedding
    optimizer = 12 * per_stage / (dp if layout.distributed_optimizer else 1)
    s, b, h, t = model.seq_len, micro, arch.hidden, tp if layout.sequence_parallel_on else 1
    per_layer = {"none": s * b * h * (34 + 5 * arch.heads * s / h) / t, "selective": s * b * h * 34 / t,
                 "full": 2 * s * b * h / t}[layout.recompute]
    micro_batches = max(1, model.global_batch_size // (micro * dp))
    activations = per_layer * stage_layers * min(pp, micro_batches)
    transient = 8 * s * b * vocab / tp + (s * b * h * 34 / t if layout.recompute == "full" else 0)
    memory = Memory(parameters=2 * per_stage, gradients=4 * per_stage, optimizer=optimizer, gathered=0.0,
                    activations=activations, transient=transient)

    tokens = model.global_batch_size * s / gpus  # per GPU: a TP group and a pipeline share their tokens
    useful = tokens * arch.flops_per_token(vocab, s)
    recompute = 0.0
    if layout.recompute == "full":  # a second forward of every layer
        recompute = tokens * arch.layers * (2 * (arch.layer_parameters - 2 * h) + 4 * arch.q_size * s)
    bubble = (pp - 1) / micro_batches
    peak = gpu.peak_tflops * 1e12
    compute_s = (useful + recompute) / (peak * settings.plan.mfu) * (1 + bubble)
    traffic = step_traffic(replace(arch, layers=stage_layers), vocab_size=vocab, micro_batch=micro, seq_len=s,
                           accumulation=micro_batches, tp=tp, dp=dp, parallelism="ddp",
                           activation_checkpointing=layout.recompute == "full")
    tp_s = dp_s = 0.0
    if gpu.node_link_gb_s and gpu.network_gb_s:  # link rates known
        node, network = gpu.node_link_gb_s * BUS_EFFICIENCY * 1e9, gpu.network_gb_s * BUS_EFFICIENCY * 1e9
        dp_bytes = traffic.bytes() - traffic.bytes("tp")  # DDP's: the whole stage's gradients and parameters
        tp_s, dp_s = traffic.bytes("tp") / node, dp_bytes / (network if model.nodes > 1 else node)
    estimate = StepEstimate(compute_s, tp_s, dp_s, 0.0)
    step = StepEstimate(compute_s, tp_s, dp_s, useful / (estimate.step_s * peak))
    return Sized(memory=memory, step=step, micro_batches=micro_batches, bubble=bubble)


def memory_error(model: ModelPlan, need_gib: float, usable_gib: float, gpu: Gpu, where: str) -> str:
    """The plan's refusal of a Megatron layout that does not fit, with what would make it fit."""
    layout = model.megatron
    assert layout is not None
    fixes = [] if layout.recompute == "full" else ["megatron.recompute: full"]
    if layout.micro_batch_size > 1:
        fixes.append(f"a lower megatron.micro_batch_size (now {layout.micro_batch_size})")
    if not layout.distributed_optimizer:
        fixes.append("megatron.distributed_optimizer: true")
    fixes.append("a higher megatron.pipeline_parallel or tensor_parallel")
    return (f"{model.name}: needs {need_gib:.0f} GiB per GPU with Megatron-LM, more than the {usable_gib:.0f} GiB "
            f"usable on a {gpu.name}; in {where}, set " + ", or ".join(fixes))


# Reference layouts on 8-GPU nodes (p5e.48xlarge): preset -> (nodes, tensor parallel, pipeline parallel).
# The 39.1B is the common Megatron-LM example's: 2 nodes, TP 4, PP 2. Each fits H200 memory with
# selective recomputation and the distributed optimizer at micro-batch 1 and sequence 4096
# (tests/megatron/test_megatron_layouts.py sizes them).
REFERENCE_LAYOUTS: dict[str, tuple[int, int, int]] = {
    "1.7b": (1, 1, 1), "3.6b": (1, 2, 1), "7.5b": (2, 2, 1), "18.4b": (2, 4, 1), "39.1b": (2, 4, 2),
    "76.1b": (4, 8, 2), "145.6b": (8, 8, 4), "310.1b": (16, 8, 8),
    "llama2-7b": (4, 1, 1), "llama2-13b": (7, 2, 1), "llama2-70b": (34, 8, 2),
}


def job_script(settings: Settings, model: ModelPlan, *, header: str, time_limit: str, time_min_s: int,
               signal_lead_s: int) -> str:
    """``jobs/train_<model>.sh`` of a Megatron-LM model: its allocation, running jobs/megatron_lm/pretrain.sh.

    As the project's trainer's (cluster_config/model_jobs.py: ``job_script``, which gives the generated-by
    ``header`` and the ``time_limit``), but one task per GPU (Megatron-LM reads its rank from the task; no
    torchrun) and SIGTERM, not USR1, before the time limit: Megatron's ``--exit-signal-handler`` saves and
    exits at the next iteration on it."""
    queue = settings.gpu_queue
    return f"""#!/usr/bin/env bash
# {model.name} on {settings.cluster_name}: preset {model.preset} with Megatron-LM on {model.nodes} x
# {queue.instance_type} ({model.nodes * queue.gpus_per_instance} GPUs), arguments jobs/models/{model.name}.megatron.args.
# {header}
#   sbatch jobs/train_{model.name}.sh [extra pretrain_gpt.py arguments]
# Each directive is explained in jobs/megatron_lm/pretrain.sh, which runs the job.
#SBATCH --job-name={model.name}
#SBATCH --nodes={model.nodes}
#SBATCH --account={model.name}
#SBATCH --qos={model.name}
#SBATCH --output={settings.storage.logs.mount_dir}/{model.name}/%x_%j.out
#SBATCH --error={settings.storage.logs.mount_dir}/{model.name}/%x_%j.err
#SBATCH --ntasks-per-node={queue.gpus_per_instance}
#SBATCH --gpus-per-node={queue.gpus_per_instance}
#SBATCH --exclusive
#SBATCH --time={time_limit}
#SBATCH --time-min={time_min_s // 60}
#SBATCH --signal=TERM@{signal_lead_s}
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail
exec bash "${{JOBS_DIR:-${{SLURM_SUBMIT_DIR:-$PWD}}/jobs}}/megatron_lm/pretrain.sh" {model.name} "$@"
"""


def reference_table(env: str) -> str:
    """The reference layouts on ``env``'s GPU queue, each as an entry of 4,096-token sequences (the global batch
    of the prod models for Llama 2, the Megatron-LM example's 288 for the GPT sizes): memory and step, estimated."""
    settings = load_settings(env)
    gpu, per_node = gpu_of(settings), settings.gpu_queue.gpus_per_instance
    batches = {m.preset: m.global_batch_size for m in settings.models if m.preset.startswith("llama2")}
    lines = [f"Megatron-LM reference layouts on {settings.gpu_queue.instance_type} ({per_node} x {gpu.name}), "
             f"seq 4096, micro-batch 1, selective recomputation, distributed optimizer; "
             f"plan.mfu {settings.plan.mfu:.0%}",
             f"  {'preset':11} {'nodes':>5} {'GPUs':>5} {'TP':>3} {'PP':>3} {'DP':>4} {'batch':>6} {'micro':>6} "
             f"{'GiB/GPU':>8} {'step s':>7} {'MFU':>5}"]
    for preset, (nodes, tp, pp) in REFERENCE_LAYOUTS.items():
        model = ModelPlan(name="reference", nodes=nodes, preset=preset, seq_len=4096,
                          global_batch_size=batches.get(preset, 288), steps=1, dataset="reference",
                          tokenizer="reference",
                          megatron={"tensor_parallel": tp, "pipeline_parallel": pp})
        problems = layout_problems(settings, model)
        if problems:
            raise ValueError("\n".join(problems))
        sized = sizing(settings, model, gpu)
        gpus = nodes * per_node
        lines.append(f"  {preset:11} {nodes:5} {gpus:5} {tp:3} {pp:3} {gpus // (tp * pp):4} "
                     f"{model.global_batch_size:6} "
                     f"{sized.micro_batches:6} {sized.memory.total / 2**30:8.1f} {sized.step.step_s:7.2f} "
                     f"{sized.step.mfu:5.0%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m cluster_config.megatron",
                                     description="Megatron-LM's reference layouts, sized for an environment's GPUs.")
    parser.add_argument("--env", default="prod", help="the environment whose GPU queue sizes them (default prod)")
    args = parser.parse_args(argv)
    try:
        print(reference_table(args.env))
    except SettingsError as exc:  # it names the file and the fix (docs/cli.md)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
