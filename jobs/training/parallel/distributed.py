"""torch.distributed set-up and parallel wrapping (FSDP2/HSDP/DDP x tensor parallel); the model never knows.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK. GPUs use NCCL for training collectives; CPU runs use
gloo. Three extra gloo groups keep CPU-side traffic off the training group: one for the per-step
"should we stop?" vote (no GPU sync), one for the checkpoint writer's background thread and one for
the snapshot writer's (collectives from two threads on one group could interleave differently on
different ranks).
HSDP and tensor parallel run their collectives on the device mesh's own groups, one per mesh dimension.
"""

from __future__ import annotations

import contextlib
import os
import socket
import warnings
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch._inductor.config
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor import parallel as tensor_parallel
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                               parallelize_module)
from torch.nn.parallel import DistributedDataParallel

from training.config import ConfigError
from training.parallel import float8

REDUCE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # train.reduce_dtype


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    control_group: dist.ProcessGroup  # gloo: stop votes
    checkpoint_group: dist.ProcessGroup  # gloo: the async checkpoint writer
    timeout: timedelta | None = None  # of the training collectives: start-up, then set_timeout's (None: fake group)
    # Groups that follow ``timeout``: the default one, the stop vote's, the device mesh's (``device_mesh``).
    groups: list[dist.ProcessGroup] = field(default_factory=list)
    snapshot_group: dist.ProcessGroup | None = None  # gloo: snapshots in memory, their copies to buddy nodes

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"


def init(timeout_s: int) -> Dist:
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # single-process runs without torchrun
    os.environ.setdefault("MASTER_PORT", "29500")
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        if local_rank >= gpus:  # CUDA's own error ("invalid device ordinal") names neither cause nor fix
            raise ConfigError(f"local rank {local_rank} has no GPU: this node shows {gpus} "
                              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); start at "
                              f"most {gpus} processes per node (torchrun --nproc-per-node), or hide the GPUs "
                              "(CUDA_VISIBLE_DEVICES=) to run every rank on the CPU")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout,
                            device_id=device if device.type == "cuda" else None)
    control = dist.new_group(backend="gloo", timeout=timeout)
    checkpoint = dist.new_group(backend="gloo", timeout=timeout)
    snapshot = dist.new_group(backend="gloo", timeout=timeout)
    return Dist(rank, world_size, local_rank, device, control, checkpoint, timeout,
                groups=[dist.group.WORLD, control], snapshot_group=snapshot)


def set_timeout(d: Dist, timeout_s: int) -> None:
    """Shorten the collective timeout once start-up is over (torchtitan: 300 s, then 100 s): a dead or
    stuck peer then ends the step in ~2 minutes instead of idling every GPU for the start-up allowance.
    The checkpoint writer's group keeps the long one: its collectives wait for the slowest rank's write."""
    d.timeout = timedelta(seconds=timeout_s)
    for group in d.groups:
        dist.distributed_c10d._set_pg_timeout(d.timeout, group)


@contextlib.contextmanager
def collective_timeout(d: Dist, timeout_s: int):
    """The training collectives' timeout is ``timeout_s`` inside, then what it was: for a known slow
    collective after start-up (the first evaluation compiles every layer again, for eval mode)."""
    before = d.timeout
    set_timeout(d, timeout_s)
    try:
        yield
    finally:
        if before is not None:
            set_timeout(d, int(before.total_seconds()))


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def any_rank(flag: bool, d: Dist) -> bool:
    """True on every rank if ``flag`` is true on any rank: how ranks agree at a step boundary."""
    t = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=d.control_group)
    return bool(t.item())


def mean_over_ranks(value: float, d: Dist) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, group=d.control_group)
    return t.item() / d.world_size


def hostnames(d: Dist) -> list[str]:
    """Every rank's host name, by global rank: what reports name a rank's node by."""
    hosts: list = [None] * d.world_size
    dist.all_gather_object(hosts, socket.gethostname(), group=d.control_group)
    return hosts


def device_mesh(d: Dist, train) -> DeviceMesh | None:
    """The ranks' layout for FSDP/HSDP (None for DDP), named dimensions, row-major.

    ``tp`` is the last (fastest) dimension, so one model copy's tensor-parallel ranks are
    neighbours: the GPUs of one node, linked by NVLink. ``dp_shard`` shards parameters, gradients
    and optimizer state (FSDP2); with HSDP, ``dp_replicate`` holds whole copies of those shards
    (one all-reduce of the shard per step instead of a world-wide reduce-scatter).

    The mesh's groups join ``d.groups`` and take our timeout, not the 30 min torch creates them with.
    Slices of the mesh (``mesh["tp"]``) share these groups.
    """
    if train.parallelism == "ddp":
        return None
    tp, dp = train.tensor_parallel, d.world_size // train.tensor_parallel
    shape, names = [dp], ["dp_shard"]
    if train.parallelism == "hsdp":
        shape, names = [dp // train.hsdp_shard_size, train.hsdp_shard_size], ["dp_replicate", "dp_shard"]
    if tp > 1:
        shape, names = [*shape, tp], [*names, "tp"]
    mesh = init_device_mesh(d.device.type, tuple(shape), mesh_dim_names=tuple(names))
    for group in mesh.get_all_groups():
        if group not in d.groups:  # a dimension over all ranks is the default group
            d.groups.append(group)
            if d.timeout is not None:
                dist.distributed_c10d._set_pg_timeout(d.timeout, group)
    return mesh


def data_parallel_rank(d: Dist, tensor_parallel: int) -> tuple[int, int]:
    """(rank, size) among the model copies: the ranks of one tensor-parallel group read the same data."""
    return d.rank // tensor_parallel, d.world_size // tensor_parallel


# Megatron's layout with sequence parallelism (Korthikanti et al. 2022), in torchtitan's form. Between
# blocks the residual stream is split along the sequence over the tensor-parallel ranks: the norms
# run on 1/t of the tokens and activation checkpointing keeps 1/t of each layer's input. Each block
# all-gathers its normalized input once (``PrepareModuleInput``), its column-parallel matrices (Q/K/V,
# gate/up) compute their heads / FFN slice, and the row-parallel output projection reduce-scatters
# back to sequence shards: per attention and per MLP block one all-gather and one reduce-scatter
# forward, the mirror pair backward. The embedding stays whole (no communication; FSDP shards it) and
# the first layer splits the sequence, so the model sees whole sequences: positions and the causal
# mask are its own. The output projection is split by vocabulary and the loss computed on vocabulary
# shards (``loss_parallel``): no rank holds whole logits.
SEQUENCE = Shard(1)  # (batch, sequence, hidden): the sequence dimension

BLOCK_PLAN = {
    "input_layernorm": SequenceParallel(),
    "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": SEQUENCE},
                                    desired_input_kwarg_layouts={"hidden_states": Replicate()}),
    "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(), "self_attn.v_proj": ColwiseParallel(),
    "self_attn.o_proj": RowwiseParallel(output_layouts=SEQUENCE),
    "post_attention_layernorm": SequenceParallel(),
    "mlp": PrepareModuleInput(input_layouts=(SEQUENCE,), desired_input_layouts=(Replicate(),)),
    "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
    "mlp.down_proj": RowwiseParallel(output_layouts=SEQUENCE),
}
SPLIT_SEQUENCE = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(SEQUENCE,),
                                    use_local_output=True)  # the first layer's input: no communication
MODEL_PLAN = {
    "model.norm": SequenceParallel(),
    "lm_head": ColwiseParallel(input_layouts=SEQUENCE, output_layouts=Shard(-1), use_local_output=False),
}


def block_plan(float8_projections: set[str]) -> dict:
    """``BLOCK_PLAN`` for one decoder layer whose ``float8_projections`` (names in the layer: ``mlp.up_proj``) are
    tensorwise float8 ones: torchao's styles, as torchtitan uses them, which cast to float8 before the
    tensor-parallel all-gather, for each block whose projections all are."""
    if not float8_projections:
        return BLOCK_PLAN
    from torchao.float8.float8_tensor_parallel import (Float8ColwiseParallel, Float8RowwiseParallel,
                                                       PrepareFloat8ModuleInput)

    plan = dict(BLOCK_PLAN)
    for block, inputs in (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj"))):
        if not all(f"{block}.{name}" in float8_projections for name in inputs):
            continue
        prepare = BLOCK_PLAN[block]
        plan[block] = PrepareFloat8ModuleInput(
            input_layouts=prepare.input_layouts, desired_input_layouts=prepare.desired_input_layouts,
            input_kwarg_layouts=prepare.input_kwarg_layouts,
            desired_input_kwarg_layouts=prepare.desired_input_kwarg_layouts,
            fwd_config_submodule_fqn=inputs[0])
        for name in inputs:
            plan[f"{block}.{name}"] = Float8ColwiseParallel()
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        if name in float8_projections:
            plan[name] = Float8RowwiseParallel(output_layouts=SEQUENCE)
    return plan


def loss_parallel(train):
    """Where the loss and its backward run: on vocabulary-sharded logits under tensor parallel."""
    return tensor_parallel.loss_parallel() if train.tensor_parallel > 1 else contextlib.nullcontext()


def reduce_each_parameter(model: DistributedDataParallel) -> None:
    """DDP's gradient all-reduce one parameter at a time, for ``train.deterministic`` runs.

    DDP reduces gradients in buckets, and lays its buckets out again after a run's first step (in the
    order gradients became ready). An all-reduce splits its tensor into chunks by size, so where a
    gradient sits in its bucket decides the order each of its elements is summed in across more than
    two ranks: a run resumed from a checkpoint takes its first step in the first layout, where the
    uninterrupted run took it in the second, and the losses part by an ulp. Reduced alone, each
    parameter's sums do not depend on the layout; the cost is one collective per parameter.
    """
    model.register_comm_hook(None, _all_reduce_each_parameter)


def _all_reduce_each_parameter(group, bucket):  # unannotated: DDP compares the annotation as an object
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size(group))  # as DDP's own all-reduce: divided first, then summed
    offset = 0
    for param in bucket.parameters():
        dist.all_reduce(buffer[offset:offset + param.numel()], group=group)
        offset += param.numel()
    if offset != buffer.numel():
        raise RuntimeError(f"DDP bucket of {buffer.numel()} elements holds parameters of {offset}")
    done = torch.futures.Future()
    done.set_result(buffer)
    return done


def parallelize(model: nn.Module, train, d: Dist, mesh: DeviceMesh | None, *,
                mixed_precision: bool | None = None, compile: bool | None = None, init_sync: bool = True) -> nn.Module:
    """Apply tensor parallelism, activation checkpointing, torch.compile, then FSDP2/HSDP or DDP.

    torchtitan's order. Call on the meta-device model for FSDP/HSDP (then ``init_weights``); DDP
    wants the initialized model. ``train.float8`` swaps the decoder layers' projections for float8 ones first
    (``float8.py``; refused where the device cannot take it). ``mixed_precision`` (default: on GPU) gives FSDP
    bf16 parameters and compute, gradients reduced in ``train.reduce_dtype``; the dry run forces it on to
    model the GPU job.
    ``compile`` (default: ``train.compile``, else on GPU only) compiles each decoder layer.
    ``init_sync``: DDP checks every rank's parameter shapes and broadcasts rank 0's values (the dry
    run's parameters have no values to read).
    """
    modelling_gpu = mixed_precision and not d.on_gpu  # the dry run: the GPU job's choices, traced on a CPU
    mixed_precision = d.on_gpu if mixed_precision is None else mixed_precision
    compile = (train.compile if train.compile is not None else d.on_gpu) if compile is None else compile
    layers = model.model.layers
    float8_layers: list[str] = []
    if train.float8 != "off" and not modelling_gpu:  # the dry run sizes the layers in bf16 (float8.py)
        float8_layers = float8.convert(model, train.float8, d.device, sharded=train.parallelism != "ddp")
    if train.async_tp:
        enable_async_tp(mesh)
    if train.tensor_parallel > 1:
        parallelize_module(model, mesh["tp"], MODEL_PLAN)
        parallelize_module(layers[0], mesh["tp"], SPLIT_SEQUENCE)
        gathered_in_float8 = float8_layers if train.float8 == "tensorwise" else []  # rowwise: TP collectives in bf16
        for i, layer in enumerate(layers):
            prefix = f"model.layers.{i}."
            parallelize_module(layer, mesh["tp"], block_plan({name.removeprefix(prefix) for name in gathered_in_float8
                                                              if name.startswith(prefix)}))
    for i, layer in enumerate(layers):
        if compile:
            # The layer's own forward, so FSDP's and the checkpoint wrapper's hooks stay outside the
            # graph and state-dict keys do not change.
            layer.forward = torch.compile(layer.forward)
        if train.activation_checkpointing and i % train.activation_checkpointing_every == 0:
            layers[i] = checkpoint_wrapper(layer)
    if train.parallelism == "ddp":
        return DistributedDataParallel(model, device_ids=[d.device.index] if d.on_gpu else None, init_sync=init_sync)
    dp_mesh = mesh["dp_replicate", "dp_shard"] if train.parallelism == "hsdp" else mesh["dp_shard"]
    kwargs = {"mesh": dp_mesh}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=REDUCE_DTYPES[train.reduce_dtype])
    # torchtitan's units: the embedding, each layer, the final norm with the output projection (needed
    # again at once by backward: not resharded after forward), then the root for what is left.
    tied = model.lm_head.weight is model.model.embed_tokens.weight  # Llama 3.2 1B/3B: one table, two uses
    if not tied:
        fully_shard(model.model.embed_tokens, **kwargs)
    for layer in layers:
        fully_shard(layer, **kwargs)
    # A tied table is one parameter: one unit holds it for both uses, kept gathered from the embedding to the head.
    head = [model.model.embed_tokens] if tied else []
    fully_shard(head + [model.model.norm, model.lm_head], **kwargs, reshard_after_forward=False)
    fully_shard(model, **kwargs)
    return model


def enable_async_tp(mesh: DeviceMesh) -> None:
    """Let the compiled layers fuse each tensor-parallel all-gather / reduce-scatter with its matmul.

    Two switches, as torchtitan sets them: inductor's micro-pipeline pass, and symmetric memory for the
    tensor-parallel group, without which the pass finds no buffers to overlap and silently does nothing.
    """
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    torch._inductor.config._micro_pipeline_tp = True
    with warnings.catch_warnings():  # torch 2.13 calls it deprecated, yet its pass still checks for it
        warnings.simplefilter("ignore", FutureWarning)
        enable_symm_mem_for_group(mesh["tp"].get_group().group_name)


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip all gradients to a total L2 norm of ``max_norm``; returns the norm (a plain tensor).

    Parameters may live on different device meshes (FSDP x tensor parallel: matrices on both,
    the embedding on the data-parallel mesh only), which one foreach norm cannot mix: the
    norm is taken per mesh and combined.
    """
    by_mesh: dict = {}
    for p in model.parameters():
        if p.grad is not None:
            key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            by_mesh.setdefault(key, []).append(p)
    squares = []
    for params in by_mesh.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
        squares.append((norm.full_tensor() if isinstance(norm, DTensor) else norm) ** 2)
    total = torch.stack(squares).sum().sqrt() if squares else torch.zeros(())
    for params in by_mesh.values():
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def gradient_sync(model: nn.Module, last_micro_batch: bool, grad_reduce: str):
    """Whether this micro-batch's backward reduces gradients across ranks.

    DDP: only the last (``no_sync`` before it): its gradients are whole on every rank anyway.
    FSDP2/HSDP with ``every_micro_batch`` (the default): every backward reduce-scatters, so each
    rank holds only its gradient shard. ``last_micro_batch`` skips the reduce-scatter until the
    last micro-batch, and FSDP keeps every parameter's *unsharded* gradient in fp32 (the reduce
    dtype) until then: 4 bytes x all parameters per GPU whatever the world size (257 GiB for 70B).
    It saves (accumulation - 1) reduce-scatters per step: only where the dry run shows it fits.
    HSDP reduce-scatters within its shard group every micro-batch and all-reduces across the groups
    (nodes) only on the last.
    """
    if isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext() if last_micro_batch else model.no_sync()
    model.set_requires_gradient_sync(last_micro_batch or grad_reduce == "every_micro_batch")
    # HSDP: the reduce-scatter stays inside the shard group (a node: NVLink) every micro-batch; the
    # all-reduce of the shards across nodes waits for the last one (fp32 shards: 4 B x params / shard).
    model.set_requires_all_reduce(last_micro_batch)
    return contextlib.nullcontext()


def autocast(d: Dist, mode: str):
    """bf16 autocast for DDP on GPU (FSDP casts through its mixed-precision policy); fp32 on CPU."""
    if d.on_gpu and mode == "ddp":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
