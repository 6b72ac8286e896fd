"""torch.distributed set-up and data-parallel wrapping; the model never knows how it is parallelized.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK. GPUs use NCCL for training collectives; CPU runs use
gloo. Two extra gloo groups keep small CPU-side traffic off the training group: one for the
per-step "should we stop?" vote (no GPU sync), one for the checkpoint writer's background thread
(collectives from two threads on one group could interleave differently on different ranks).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    control_group: dist.ProcessGroup  # gloo: stop votes
    checkpoint_group: dist.ProcessGroup  # gloo: the async checkpoint writer

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
    return Dist(rank, world_size, local_rank, device, control, checkpoint)


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


def parallelize(model: nn.Module, mode: str, d: Dist, mixed_precision: bool | None = None,
                mesh: DeviceMesh | None = None) -> nn.Module:
    """FSDP2 (each decoder layer, then the root) or DDP. Call on the meta-device model for FSDP.

    ``mixed_precision`` (default: on GPU) gives FSDP bf16 parameters and compute with fp32 gradient
    reduction; the dry run forces it on to model the GPU job on a CPU.
    """
    if mixed_precision is None:
        mixed_precision = d.on_gpu
    if mode == "fsdp":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision else None
        kwargs = {"mp_policy": mp} if mp else {}
        if mesh is not None:
            kwargs["mesh"] = mesh
        for layer in model.model.layers:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        return model
    return DistributedDataParallel(model, device_ids=[d.device.index] if d.on_gpu else None)


def checkpoint_activations(model: nn.Module) -> None:
    """Recompute each decoder layer's activations in backward (call before ``parallelize``).

    The layer is wrapped (torchtitan's way), so FSDP's hooks sit outside the recomputed region.
    transformers' own ``gradient_checkpointing_enable`` puts them inside, and FSDP2 then keeps every
    layer's unsharded fp32 gradient to the end of backward (the dry run measured 4 bytes x all
    parameters per GPU). State-dict keys are unchanged: DCP's state_dict drops the wrapper's prefix.
    """
    layers = model.model.layers
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(layer)


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip all gradients to a total L2 norm of ``max_norm``; returns the norm (a plain tensor).

    Parameters may live on different device meshes (FSDP x tensor parallel: matrices on both,
    norms and embeddings on the data-parallel mesh only), which one foreach norm cannot mix: the
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


def gradient_sync(model: nn.Module, enabled: bool):
    """Skip the gradient all-reduce on all but the last micro-batch of an accumulation."""
    if isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext() if enabled else model.no_sync()
    model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def autocast(d: Dist, mode: str):
    """bf16 autocast for DDP on GPU (FSDP casts through its mixed-precision policy); fp32 on CPU."""
    if d.on_gpu and mode == "ddp":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
