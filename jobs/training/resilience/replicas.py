"""The replica-consistency sentinel: state that several ranks hold alike must stay bit-identical, and
state at rest must not change.

Under DDP every rank holds the whole model, under HSDP every replica of a shard group holds the same
shards, and under tensor parallelism every rank of a TP group holds the same copy of what TP does not
split (the norm weights; the embedding, sharded by FSDP only). After each optimizer step the copies
must agree bit for bit, parameters and optimizer state (AdamW's ``exp_avg``, ``exp_avg_sq``,
``step``) alike, since they started equal and applied the same reduced gradients. A GPU or its memory
that computes or stores a wrong value without an error (silent data corruption) breaks that: the
wrong copy trains on, and its error enters every replica through the next all-reduce, then every
checkpoint.

Every ``train.replica_check_every`` steps, and before every checkpoint:

- at rest (every layout): each rank's digest of its parameters and optimizer state, taken right after
  each optimizer step, is taken again before the next step and at the check: nothing may have changed
  them in between, so a difference is a flip in this rank's memory (the only check for state FSDP keeps
  one copy of);
- across copies: the ranks holding copies compare their digests (one small all-gather of one integer
  per tensor, in each group: DDP's world, HSDP's replicas, each TP group for its replicated tensors).

A digest sums each tensor's bits as integers, so it is exact and independent of order. A mismatch
names the tensor, the ranks and their nodes (the minority where three or more copies vote; both
where two disagree; the rank itself at rest) and stops the run before it saves, so every checkpoint
on disk was verified at its own step: its ``train_meta.json`` says ``verified: true`` (the resume
warns about one that does not). The suspect ranks report their nodes to the epilog
(training/resilience/node_suspect.py), which drains them, and the requeued job resumes from
``latest`` on other nodes. A wrong computation that leaves every copy equal (before the gradient
reduction) is the replay's to find (training/resilience/replay.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from training.parallel.distributed import Dist

_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class ReplicaMismatch(RuntimeError):
    """State that must agree does not (copies, state at rest, a computation and its replay): silent data
    corruption on the named ranks' GPUs.

    ``suspects``: the global ranks whose copies are suspect (their nodes are reported to the epilog);
    ``summary``: one short line for the node's drain reason."""

    def __init__(self, message: str, suspects: tuple[int, ...] = (), summary: str = ""):
        super().__init__(message)
        self.suspects, self.summary = tuple(suspects), summary or message


def parameter_sums(model: nn.Module) -> tuple[list[str], torch.Tensor]:
    """(names, int64 sums): each local parameter tensor's bits summed as integers (``bit_sum``)."""
    return state_sums(model)


def state_sums(model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
               keep: Callable[[nn.Parameter], bool] = lambda param: True) -> tuple[list[str], torch.Tensor]:
    """(names, int64 sums): the bits of each local parameter tensor (``keep``: which) and of its optimizer
    state, summed as integers (``bit_sum``), on the parameters' device. Reads each tensor once; allocates
    nothing of its size."""
    names, sums = [], []
    for name, param in model.named_parameters():
        if not keep(param):
            continue
        state = optimizer.state.get(param, {}) if optimizer is not None else {}
        for label, tensor in [(name, param), *((f"{name}:{k}", v) for k, v in sorted(state.items())
                                               if isinstance(v, torch.Tensor))]:
            names.append(label)
            sums.append(bit_sum(tensor))
    device = next((s.device for s in sums if s.device.type != "cpu"), torch.device("cpu"))
    if not sums:
        return names, torch.zeros(0, dtype=torch.int64, device=device)
    # Adam's ``step`` lives on the CPU: one copy of those sums to the device, not one per tensor.
    elsewhere = [i for i, s in enumerate(sums) if s.device != device]
    if elsewhere:
        for i, moved in zip(elsewhere, torch.stack([sums[i] for i in elsewhere]).to(device)):
            sums[i] = moved
    return names, torch.stack(sums)


def bit_sum(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bits summed as 64-bit integers (wrapping): equal tensors give equal sums in any order, and one
    flipped bit moves the sum by a power of two. Read as int64 words where the bytes allow: a plain
    vectorized sum, 8x faster on a CPU than widening 32-bit words one by one (the trainer digests every step)."""
    flat = (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach().contiguous().view(-1)
    if flat.numel() * flat.element_size() % 8 == 0 and flat.storage_offset() * flat.element_size() % 8 == 0:
        return flat.view(torch.int64).sum()
    return flat.view(_SAME_SIZE_INT[flat.element_size()]).sum(dtype=torch.int64)


def tp_replicated(param: nn.Parameter) -> bool:
    """Whether every rank of this parameter's TP group holds the same local tensor: TP does not split it
    (placed ``Replicate`` on the ``tp`` dimension, or on a mesh without one, as the FSDP-only embedding)."""
    if not isinstance(param, DTensor):
        return False
    names = param.device_mesh.mesh_dim_names or ()
    return "tp" not in names or isinstance(param.placements[names.index("tp")], Replicate)


class Sentinel:
    """Compares this rank's digest of parameters and optimizer state with the other copies' in ``group``
    (the ranks holding the same tensors); ``keep``: which parameters the group holds alike."""

    def __init__(self, model: nn.Module, group: dist.ProcessGroup, hosts: list[str], *,
                 optimizer: torch.optim.Optimizer | None = None,
                 keep: Callable[[nn.Parameter], bool] = lambda param: True, what: str = "replicas"):
        self.model, self.optimizer, self.group, self.keep, self.what = model, optimizer, group, keep, what
        self.size = dist.get_world_size(group)
        self.members = [(r, hosts[r]) for r in dist.get_process_group_ranks(group)]  # (global rank, host), group order
        self.last_agreed = -1  # the step of the last check that agreed

    def check(self, step: int) -> None:
        """Raise ReplicaMismatch unless every copy in the group holds the same bits."""
        names, mine = state_sums(self.model, self.optimizer, self.keep)
        gathered = torch.empty(self.size * mine.numel(), dtype=torch.int64, device=mine.device)  # flat: gloo's form
        dist.all_gather_into_tensor(gathered, mine, group=self.group)
        rows = gathered.view(self.size, -1).cpu()
        differing = (rows != rows[0]).any(dim=0).nonzero().flatten().tolist()
        if not differing:
            self.last_agreed = step
            return
        votes = Counter(tuple(row.tolist()) for row in rows)
        top = votes.most_common()
        if len(top) > 1 and top[0][1] > top[1][1]:  # a majority: the others are wrong
            suspects = [i for i, row in enumerate(rows) if tuple(row.tolist()) != top[0][0]]
            whose = "the minority"
        else:  # two copies, or no majority: any of them may be the corrupted one
            suspects = list(range(self.size))
            whose = "no majority: every copy"
        params = _some(names[i] for i in differing)
        ranks = ", ".join(f"rank {self.members[i][0]} on {self.members[i][1]}" for i in suspects)
        raise ReplicaMismatch(
            f"{self.what} disagree after step {step} (last agreed at step {self.last_agreed}) in {params}; "
            f"suspect ({whose}): {ranks}. Silent data corruption: the run stops without saving and resumes from "
            f"the last checkpoint, every one of which was checked at its step",
            suspects=tuple(self.members[i][0] for i in suspects),
            summary=f"{self.what} disagree after step {step} (agreed at {self.last_agreed}) in {params}; suspect ({whose})")


class AtRest:
    """This rank's parameters and optimizer state must not change between the optimizer step that wrote them
    and the next one: ``record`` after each step, ``before_step`` before the next (a comparison on the device,
    kept without waiting for it), ``check`` before a save and every ``replica_check_every`` steps (both)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, host: str):
        self.model, self.optimizer, self.rank, self.host = model, optimizer, rank, host
        self.recorded: tuple[int, list[str], torch.Tensor] | None = None
        self.changed: tuple[int, torch.Tensor] | None = None  # since the last check: (from step, which tensors)

    def record(self, step: int) -> None:
        self.recorded = (step, *state_sums(self.model, self.optimizer))

    def before_step(self) -> None:
        """Compare the state with its digest at ``record`` before the optimizer reads it; a difference (a flip
        during forward and backward) is kept for ``check``: no wait for the device here."""
        if self.recorded is None:
            return
        written, names, before = self.recorded
        now = state_sums(self.model, self.optimizer)[1]
        differs = now != before if now.shape == before.shape else torch.ones_like(before, dtype=torch.bool)
        self.changed = (written, differs) if self.changed is None else (self.changed[0], self.changed[1] | differs)

    def check(self, step: int) -> None:
        """Raise ReplicaMismatch (this rank the suspect) if the state differs from its digest at ``record``, or
        differed before an optimizer step since the last check."""
        if self.recorded is None:  # no step since the start: the loaded state is the checkpoint's
            return
        written, names, before = self.recorded
        between, self.changed = self.changed, None
        if between is not None and bool(between[1].any()):
            where = _some(names[i] for i in between[1].nonzero().flatten().tolist())
            when = f"between optimizer steps {between[0]} and {step}, before one read it"
        else:
            now = state_sums(self.model, self.optimizer)[1]
            changed = (now != before).nonzero().flatten().tolist() if now.shape == before.shape else range(len(names))
            if not changed:
                return
            where = _some(names[i] for i in changed)
            when = f"after step {written} (found at step {step}, before its save)"
        raise ReplicaMismatch(
            f"state changed at rest on rank {self.rank} on {self.host}: {where} differ from what the optimizer "
            f"wrote, {when}. Silent data corruption in this rank's memory: the run stops without saving and "
            f"resumes from the last checkpoint", suspects=(self.rank,), summary=f"state changed at rest {when} in {where}")


def sentinels(parallelism: str, tensor_parallel: int, mesh, d: Dist, model: nn.Module,
              optimizer: torch.optim.Optimizer, hosts: list[str]) -> list[Sentinel]:
    """A sentinel for each group of ranks holding copies of this rank's tensors: all (DDP), this shard's
    replicas (HSDP), this rank's TP group for what TP does not split; none for FSDP alone."""
    found = []
    if parallelism == "ddp" and d.world_size > 1:
        found.append(Sentinel(model, dist.group.WORLD, hosts, optimizer=optimizer))
    if parallelism == "hsdp" and mesh is not None and mesh["dp_replicate"].size() > 1:
        found.append(Sentinel(model, mesh["dp_replicate"].get_group(), hosts, optimizer=optimizer))
    if tensor_parallel > 1 and mesh is not None:
        found.append(Sentinel(model, mesh["tp"].get_group(), hosts, optimizer=optimizer, keep=tp_replicated,
                              what="tensor-parallel copies"))
    return found


def _some(names) -> str:
    names = list(names)
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
