"""The replica-consistency sentinel: copies of the same parameters must stay bit-identical.

Under DDP every rank holds the whole model, under HSDP every replica of a shard group holds the same
shards; after each optimizer step they must agree bit for bit, since they started equal and applied
the same all-reduced gradients. A GPU or its memory that computes or stores a wrong value without an
error (silent data corruption) breaks that: the wrong copy trains on, and its error enters every
replica through the next all-reduce, then every checkpoint.

Every ``train.replica_check_every`` steps, and before every checkpoint, each rank sums the bits of
each of its local parameter tensors (as integers, so the sum is exact and independent of order) and
the ranks holding copies compare the sums (one small all-gather of one integer per tensor). A
mismatch names the parameter, the ranks and their nodes (the minority where three or more copies
vote; both where two disagree) and stops the run before it saves, so every checkpoint on disk was
verified at its own step (``latest`` is at or before the last agreeing step): the suspect ranks report
their nodes to the epilog (training/resilience/node_suspect.py), which drains them, and the requeued job resumes
from ``latest`` on other nodes.

FSDP and FSDP x tensor parallel hold one copy of each shard: there is nothing to compare, and the
sentinel says so once (a corruption there shows only as a loss spike or a non-finite loss).
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
from torch import nn

from training.parallel.distributed import Dist

_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class ReplicaMismatch(RuntimeError):
    """Copies of the same parameters differ: silent data corruption on the named ranks' GPUs.

    ``suspects``: the global ranks whose copies are suspect (their nodes are reported to the epilog);
    ``summary``: one short line for the node's drain reason."""

    def __init__(self, message: str, suspects: tuple[int, ...] = (), summary: str = ""):
        super().__init__(message)
        self.suspects, self.summary = tuple(suspects), summary or message


def parameter_sums(model: nn.Module) -> tuple[list[str], torch.Tensor]:
    """(names, int64 sums): each local parameter tensor's bits summed as integers of its element size.

    An integer sum is exact, so equal tensors give equal sums on any device in any order, and a single
    flipped bit changes the sum by a power of two. Reads each parameter once; allocates nothing of its size.
    """
    names, sums = [], []
    for name, param in model.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        words = local.detach().contiguous().view(_SAME_SIZE_INT[local.element_size()])
        names.append(name)
        sums.append(words.sum(dtype=torch.int64))
    device = sums[0].device if sums else torch.device("cpu")
    return names, torch.stack(sums) if sums else torch.zeros(0, dtype=torch.int64, device=device)


class Sentinel:
    """Compares this rank's parameter sums with the other copies' in ``group`` (the ranks holding the same shards)."""

    def __init__(self, model: nn.Module, group: dist.ProcessGroup, hosts: list[str]):
        self.model, self.group = model, group
        self.size = dist.get_world_size(group)
        self.members = [(r, hosts[r]) for r in dist.get_process_group_ranks(group)]  # (global rank, host), group order
        self.last_agreed = -1  # the step of the last check that agreed

    def check(self, step: int) -> None:
        """Raise ReplicaMismatch unless every copy in the group holds the same bits."""
        names, mine = parameter_sums(self.model)
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
        params = ", ".join(names[i] for i in differing[:3]) + (f" and {len(differing) - 3} more" if len(differing) > 3 else "")
        ranks = ", ".join(f"rank {self.members[i][0]} on {self.members[i][1]}" for i in suspects)
        raise ReplicaMismatch(
            f"replicas disagree after step {step} (last agreed at step {self.last_agreed}) in {params}; "
            f"suspect ({whose}): {ranks}. Silent data corruption: the run stops without saving and resumes from "
            f"the last checkpoint, every one of which was checked at its step",
            suspects=tuple(self.members[i][0] for i in suspects),
            summary=f"replicas disagree after step {step} (agreed at {self.last_agreed}) in {params}; suspect ({whose})")


def replica_group(parallelism: str, mesh, d: Dist) -> dist.ProcessGroup | None:
    """The ranks holding copies of this rank's parameters: all (DDP), this shard's replicas (HSDP), none (FSDP)."""
    if parallelism == "ddp" and d.world_size > 1:
        return dist.group.WORLD
    if parallelism == "hsdp" and mesh is not None and mesh["dp_replicate"].size() > 1:
        return mesh["dp_replicate"].get_group()
    return None
