"""Every collective of a production layout's training step, recorded on the dry run's fake process group.

The model is built as ``training.dry_run`` builds it (``training.train.build`` on the fake process
group at the job's world size, inside ``FakeTensorMode``, bf16 mixed precision forced on as on a
GPU) with the preset's real widths but only a few decoder layers. One warm-up micro-batch and
optimizer step (FSDP's lazy initialization, DTensor's caches, the optimizer state: a later step's
state) run unrecorded; then a micro-batch, the step's last micro-batch and the optimizer step are
recorded apart: FSDP reduce-scatters every micro-batch, HSDP all-reduces across replicas on the last.

``CollectiveRecorder`` is a dispatch mode that sees each c10d and functional collective with its
tensors and process group: kind, mesh dimension, size. PyTorch's ``CommDebugMode`` counts the same
collectives alongside; ``measure`` fails if the two counts differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode
from training.parallel import distributed
from training.parallel.communication import Traffic
from training.dry_run import fake_dist
from training.models.llama import compute_loss, hf_config
from training.train import build

_C10D = {  # process-group ops (FSDP2, DDP, torch.distributed calls)
    "_allgather_base_": "all_gather", "allgather_": "all_gather", "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter", "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all", "broadcast_": "broadcast", "reduce_": "reduce", "gather_": "gather",
    "scatter_": "scatter",
}
_FUNCTIONAL = {  # functional collectives (DTensor's redistributions)
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce", "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
}


def _collective_ops() -> dict:
    ops = {}
    for namespace, names in (("c10d", _C10D), ("_c10d_functional", _FUNCTIONAL), ("c10d_functional", _FUNCTIONAL),
                             ("_c10d_functional_autograd", {"all_to_all_single": "all_to_all"}),
                             ("_dtensor", {"shard_dim_alltoall": "all_to_all"})):
        for name, kind in names.items():
            packet = getattr(getattr(torch.ops, namespace), name, None)
            if packet is not None:
                ops[packet] = kind
    return ops


COLLECTIVES = _collective_ops()
# Functional all-gathers take the local shard; the size counted is the gathered tensor's.
_GATHERS_SHARD = {torch.ops._c10d_functional.all_gather_into_tensor,
                  torch.ops._c10d_functional.all_gather_into_tensor_coalesced}


@dataclass(frozen=True)
class Record:
    op: str
    kind: str
    dim: str  # mesh dimension (tp, dp_shard, dp_replicate), else the group's name
    size: int  # bytes of the whole tensor: all-gather's output, reduce-scatter's input, all-reduce's tensor
    group: int  # ranks in the group
    dtype: str
    backward: bool  # issued while autograd ran backward (activation checkpointing's recomputation included)


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _group(value) -> dist.ProcessGroup:
    if isinstance(value, str):
        return dist.distributed_c10d._resolve_process_group(value)
    if isinstance(value, torch.ScriptObject):
        return dist.ProcessGroup.unbox(value)
    return value


class CollectiveRecorder(TorchDispatchMode):
    """Records each collective dispatched while active (``records``), by kind, mesh dimension and size."""

    def __init__(self, dims: dict[str, str]):
        super().__init__()
        self.dims = dims  # process group name -> mesh dimension
        self.records: list[Record] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor turn its redistributions into collectives first
        kind = COLLECTIVES.get(getattr(func, "overloadpacket", None))
        if kind is not None:
            self.records.append(self._record(func, kind, args, kwargs))
        return func(*args, **kwargs)

    def _record(self, func, kind: str, args, kwargs) -> Record:
        named = dict(zip((a.name for a in func._schema.arguments), args))
        named.update(kwargs)
        group = _group(named.get("process_group", named.get("group_name")))
        sizes = [sum(t.numel() * t.element_size() for t in _tensors(v)) for v in named.values()]
        tensors = [t for v in named.values() for t in _tensors(v)]
        size = max(sizes)  # the whole tensor: the largest argument (output of a gather, input of a scatter)
        if func.overloadpacket in _GATHERS_SHARD:
            size *= group.size()
        return Record(str(func.overloadpacket), kind, self.dims.get(group.group_name, group.group_name), size,
                      group.size(), str(tensors[0].dtype).removeprefix("torch."),
                      backward=torch._C._current_graph_task_id() != -1)

    def traffic(self, *, backward: bool | None = None) -> Traffic:
        """All recorded collectives (``backward``: only those of backward, or only those of forward)."""
        total = Traffic()
        for r in self.records:
            if backward is None or r.backward == backward:
                total += Traffic.of(r.dim, r.kind, r.size, r.group)
        return total


@dataclass
class Phase:
    """The collectives of one part of a step."""

    traffic: Traffic
    forward: Traffic  # the part issued in forward
    records: list[Record] = field(default_factory=list)
    debug_mode_count: int = 0  # CommDebugMode's count of the same collectives


PHASES = ("micro_batch", "last_micro_batch", "optimizer")


def _micro_batch(model, cfg, vocab_size: int, accumulation: int, *, last: bool) -> None:
    """One forward and backward as the trainer runs it (``Trainer.forward_backward``)."""
    shape = (cfg.train.micro_batch_size, cfg.data.seq_len)
    inputs, labels = torch.randint(0, vocab_size, shape), torch.randint(0, vocab_size, shape)
    with distributed.gradient_sync(model, last, cfg.train.grad_reduce), distributed.loss_parallel(cfg.train):
        (compute_loss(model, inputs, labels) / accumulation).backward()


def _optimizer_step(model, optimizer, cfg) -> None:
    distributed.clip_grad_norm(model, cfg.optim.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(cfg, world_size: int, *, layers: int, vocab_size: int) -> dict[str, Phase]:
    """The collectives of rank 0 of ``world_size`` training ``cfg`` with ``layers`` decoder layers, by phase.

    Runs in this process on the fake process group (as the dry run: no other group may exist).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    accumulation = cfg.grad_accum_steps(world_size)
    d = fake_dist(world_size)
    try:
        model_config = hf_config(cfg.model.preset, vocab_size, cfg.data.seq_len)
        model_config.num_hidden_layers = layers
        mesh = distributed.device_mesh(d, cfg.train)  # outside fake mode, as the dry run
        dims = {dist.group.WORLD.group_name: "world"}
        if mesh is not None:
            dims.update({mesh.get_group(name).group_name: name for name in mesh.mesh_dim_names})
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        model, optimizer = build(cfg, model_config, d, mesh, mixed_precision=True, allocating=fake)
        steps = {
            "micro_batch": lambda: _micro_batch(model, cfg, vocab_size, accumulation, last=False),
            "last_micro_batch": lambda: _micro_batch(model, cfg, vocab_size, accumulation, last=True),
            "optimizer": lambda: _optimizer_step(model, optimizer, cfg),
        }
        phases = {}
        with fake:
            steps["last_micro_batch"]()  # warm-up, unrecorded
            steps["optimizer"]()
            for name in PHASES:
                debug, recorder = CommDebugMode(), CollectiveRecorder(dims)
                with debug, recorder:
                    steps[name]()
                phases[name] = Phase(recorder.traffic(), recorder.traffic(backward=False), recorder.records,
                                     debug.get_total_counts())
                if phases[name].debug_mode_count != len(recorder.records):
                    raise RuntimeError(f"{name}: CommDebugMode counted {debug.get_total_counts()} collectives, "
                                       f"the recorder {len(recorder.records)}: {debug.get_comm_counts()}")
    finally:
        dist.destroy_process_group()
    return phases
