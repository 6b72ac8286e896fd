"""How long a training step takes on the target and the MFU that follows, from the shape and layout alone.

Torch-free, like ``presets``, ``sizing`` and ``communication``: the planner (``python -m cluster_config
plan``) estimates every model's MFU with it, and the acceptance run (``training.layout_check``)
the MFU of each shrunk layout it measures, so measured and planned figures come from one formula.

Per GPU per step::

    compute = (model FLOPs + the forward of every recomputed layer) / (peak x compute_mfu)
    tensor parallel = TP bytes (communication.step_traffic) / (node link x BUS_EFFICIENCY)   not overlapped
    data parallel = FSDP/HSDP bytes / (node link or network x BUS_EFFICIENCY)                overlapped
    step = compute + tensor parallel + max(0, data parallel - compute)
    MFU = model FLOPs / (step x peak)

``compute_mfu`` is the MFU of a step whose communication is hidden and which recomputes nothing
(``plan.mfu``, 40 %: torchtitan's Llama 3.1 8B FSDP runs, Llama 3 405B's 38-43 %).
"""

from __future__ import annotations

from dataclasses import dataclass

from training.parallel.communication import recomputed_layers, step_traffic
from training.models.architecture import Architecture

# Bus bandwidth NCCL's ring all-gather/reduce-scatter reach, as a share of the link rate: nccl-tests on
# 8 x H100 report ~360-480 GB/s of bus bandwidth on 450 GB/s links (the higher with NVLink SHARP).
BUS_EFFICIENCY = 0.8


@dataclass(frozen=True)
class StepEstimate:
    """Seconds per optimizer step on each GPU, by what the GPU waits for, and the MFU that follows."""

    compute_s: float  # the step's FLOPs (with recomputation) at compute_mfu
    tensor_parallel_s: float  # TP collectives: on the critical path (their overlap, async TP, is not modelled)
    data_parallel_s: float  # FSDP/HSDP collectives, overlapped with compute
    mfu: float

    @property
    def exposed_data_parallel_s(self) -> float:
        return max(0.0, self.data_parallel_s - self.compute_s)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.tensor_parallel_s + self.exposed_data_parallel_s


def estimate_mfu(preset: Architecture, train, *, vocab: int, seq_len: int, gpus: int, gpus_per_node: int,
                 peak_tflops: float, node_link_gb_s: float, network_gb_s: float, compute_mfu: float) -> StepEstimate:
    """One step of ``train`` (a training config's ``train`` section) on ``gpus``: where the time goes, and its MFU.

    ``node_link_gb_s`` and ``network_gb_s``: link rates per GPU and direction within a node (NVLink)
    and across nodes (the instance's network / its GPUs); 0 leaves communication out.

    MFU counts the model's FLOPs only (6 x matmul parameters + attention per token, as the trainer
    reports it). The step also recomputes the forward of every checkpointed layer (2 x its matmul
    parameters + 4 x hidden x seq_len per token) and waits for what its communication does not
    overlap: tensor parallel's all-gathers and reduce-scatters (inside a node), and the part of the
    data-parallel traffic longer than the compute (FSDP prefetches one layer ahead; HSDP's shard
    group is one node, its replicas and FSDP's shards span nodes).
    """
    tp = train.tensor_parallel
    dp = gpus // tp
    accum = train.global_batch_size // (train.micro_batch_size * dp)
    tokens = train.global_batch_size * seq_len / gpus  # per GPU; a TP group shares its tokens
    useful = tokens * preset.flops_per_token(vocab, seq_len)
    recomputed = recomputed_layers(preset.layers, train.activation_checkpointing, train.activation_checkpointing_every)
    layer_forward = (2 * (preset.layer_parameters - 2 * preset.hidden) + 4 * preset.hidden * seq_len)
    recompute = tokens * recomputed * layer_forward
    peak = peak_tflops * 1e12
    compute_s = (useful + recompute) / (peak * compute_mfu)
    traffic = step_traffic(preset, vocab_size=vocab, micro_batch=train.micro_batch_size, seq_len=seq_len,
                           accumulation=accum, tp=tp, dp=dp, parallelism=train.parallelism,
                           hsdp_shard_size=train.hsdp_shard_size,
                           activation_checkpointing=train.activation_checkpointing,
                           activation_checkpointing_every=train.activation_checkpointing_every,
                           grad_reduce=train.grad_reduce,
                           reduce_bytes=2 if train.reduce_dtype == "bfloat16" else 4)
    if not (node_link_gb_s and network_gb_s):  # link rates unknown (an instance type without figures): not modelled
        return StepEstimate(compute_s, 0.0, 0.0, useful / (compute_s * peak))
    node, network = node_link_gb_s * BUS_EFFICIENCY * 1e9, network_gb_s * BUS_EFFICIENCY * 1e9
    shard_inside_node = train.parallelism == "hsdp" and train.hsdp_shard_size * tp <= gpus_per_node
    tp_s = traffic.bytes("tp") / node
    dp_s = (traffic.bytes("dp_shard") / (node if shard_inside_node else network)
            + traffic.bytes("dp_replicate") / network)
    estimate = StepEstimate(compute_s, tp_s, dp_s, 0.0)
    return StepEstimate(compute_s, tp_s, dp_s, useful / (estimate.step_s * peak))
