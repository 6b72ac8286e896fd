"""A snapshot in memory loaded on another number of ranks: each rank's new shards cut from the old ranks' files.

A snapshot file holds one rank's local shards (``snapshot.local_shards``); its manifest names, for each device
mesh of the state, the mesh's shape and the rank's place in it. The model and optimizer have the same global
shapes and placements on any world size, so the old ranks' chunks of every tensor follow from those alone
(torch's own arithmetic for a DTensor's chunk, uneven and strided shards included): a rank of the new world
knows which old ranks hold the elements it now owns before reading any file, fetches only those
(``Plan.sources``), and copies the elements into place (``Plan.assemble``). Copies, never arithmetic: the
result is bit for bit what the file system's checkpoint (DCP, resharding) gives on the new world. Replicated
copies of a chunk (HSDP replicas, tensor-parallel replicated weights) are read from one old rank, the one
already fetched where there is one.

Not tensors of a DTensor (the step, optimizer hyperparameters, the per-parameter Adam step) are the same in
every old rank's file and are taken from the first one fetched; per-rank items (loader position, RNG) come
from old rank 0, as a resume from the file system on another world size takes them.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import _get_shard_size_and_offsets
from torch.distributed.tensor.placement_types import _StridedShard
from torch.utils._pytree import tree_flatten, tree_unflatten

SHARDED = ("model", "optim")  # the keys whose DTensors are resharded; ``step`` and ``rank<N>`` are not tensors of one


class Unreshardable(ValueError):
    """The snapshot cannot be cut into this layout's shards (a placement or mesh this code does not map)."""


def mesh_key(mesh) -> str:
    return ",".join(mesh.mesh_dim_names) if mesh.mesh_dim_names else f"{mesh.ndim}d"


def meshes(state) -> dict[str, dict]:
    """This rank's place in each device mesh of ``state``'s DTensors: what a manifest records for resharding."""
    found = {}
    for leaf in tree_flatten(state)[0]:
        if isinstance(leaf, DTensor):
            mesh = leaf.device_mesh
            found.setdefault(mesh_key(mesh), {"shape": list(mesh.shape), "coordinate": list(mesh.get_coordinate())})
    return found


def chunk_indices(shape, mesh_shape, coordinate, placements) -> list[torch.Tensor]:
    """The global indices, per dimension, of the chunk of a tensor of ``shape`` that the rank at ``coordinate``
    of a mesh of ``mesh_shape`` holds under ``placements`` (ascending; its local tensor is their product)."""
    indices: dict[int, torch.Tensor] = {}
    sizes = list(shape)
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Replicate):
            continue
        if not isinstance(placement, (Shard, _StridedShard)):
            raise Unreshardable(f"placement {placement} is not resharded from a snapshot")
        dim = placement.dim
        size, index = _get_shard_size_and_offsets(sizes[dim], mesh_shape[mesh_dim], coordinate[mesh_dim], placement,
                                                  indices.get(dim), shape[dim], False)
        sizes[dim] = size
        indices[dim] = index[:size]
    out = [indices.get(dim, torch.arange(n)) for dim, n in enumerate(shape)]
    if any(len(i) > 1 and not bool((i[1:] > i[:-1]).all()) for i in out):
        raise Unreshardable("a chunk whose indices are not ascending")
    return out


class Plan:
    """Where this rank's state on the new layout comes from: for each DTensor of ``template`` (this rank's
    ``app_state`` on the new world), the old ranks whose chunks hold its elements, and their indices.

    ``manifests``: every old rank's manifest, by rank. ``local``: old ranks whose file is on this rank's node
    (preferred where several hold the same chunk)."""

    def __init__(self, template: dict, manifests: dict[int, dict], local: set[int], *, rank: int):
        self.old_world = len(manifests)
        self.pieces: list[list[tuple[int, list[torch.Tensor], list[torch.Tensor]]] | None] = []
        chosen: list[int] = []
        cache: dict = {}
        for leaf in self._leaves(template):
            if not isinstance(leaf, DTensor):
                self.pieces.append(None)
                continue
            mesh = leaf.device_mesh
            want = chunk_indices(leaf.shape, mesh.shape, mesh.get_coordinate(), leaf.placements)
            key = (tuple(leaf.shape), tuple(leaf.placements), mesh_key(mesh))
            if key not in cache:  # every old rank's chunk, grouped: replicas hold the same one
                groups: dict = {}
                for old, manifest in manifests.items():
                    place = manifest.get("meshes", {}).get(mesh_key(mesh))
                    if place is None or len(place["shape"]) != mesh.ndim:
                        raise Unreshardable(f"old rank {old} has no {mesh_key(mesh)} mesh of {mesh.ndim} dimensions")
                    held = chunk_indices(leaf.shape, place["shape"], place["coordinate"], leaf.placements)
                    first = tuple(int(i[0]) if len(i) else -1 for i in held)
                    groups.setdefault(first, (held, []))[1].append(old)
                cache[key] = list(groups.values())
            pieces, covered = [], 0
            for held, holders in cache[key]:
                common = [torch.isin(w, h) for w, h in zip(want, held)]
                if not all(bool(c.any()) for c in common) or any(len(h) == 0 for h in held):
                    continue
                old = min(holders, key=lambda r: (r not in chosen, r not in local, r))
                if old not in chosen:
                    chosen.append(old)
                new_pos = [c.nonzero().flatten() for c in common]
                old_pos = [torch.searchsorted(h, w[p]) for h, w, p in zip(held, want, new_pos)]
                pieces.append((old, new_pos, old_pos))
                count = 1
                for p in new_pos:
                    count *= len(p)
                covered += count
            if covered != leaf.to_local().numel():
                raise Unreshardable(f"the old ranks' chunks cover {covered} of this rank's {leaf.to_local().numel()} "
                                    f"elements of a tensor of shape {tuple(leaf.shape)}")
            self.pieces.append(pieces)
        if not chosen:  # no DTensor (DDP: whole copies): any one old rank's file, this node's if it holds one
            chosen.append(min(manifests, key=lambda r: (r not in local, r)))
        if rank == 0 and 0 not in chosen:  # old rank 0's per-rank items: rank 0 reads them and sends them on
            chosen.append(0)
        self.sources = sorted(chosen)

    @staticmethod
    def _leaves(state: dict) -> list:
        return tree_flatten({k: state[k] for k in SHARDED if k in state})[0]

    def assemble(self, template: dict, files: dict[int, dict]) -> dict:
        """This rank's local shards on the new layout, cut from the old ranks' ``files`` (``Plan.sources``), in
        the form of ``template`` less its per-rank items (the caller adds old rank 0's)."""
        part = {k: template[k] for k in SHARDED if k in template}
        want_leaves, spec = tree_flatten(part)
        first = files[self.sources[0]]
        old_leaves = {old: tree_flatten({k: f[k] for k in SHARDED if k in f}) for old, f in files.items()}
        if old_leaves[self.sources[0]][1] != spec:
            raise Unreshardable("the snapshot's state has other keys than this run's")
        out = []
        for index, (want, pieces) in enumerate(zip(want_leaves, self.pieces)):
            if pieces is None:
                out.append(old_leaves[self.sources[0]][0][index])
                continue
            local = None
            for old, new_pos, old_pos in pieces:
                have = old_leaves[old][0][index]
                if local is None:
                    local = torch.empty(want.to_local().shape, dtype=have.dtype)
                piece = have
                for dim, pos in enumerate(old_pos):
                    piece = piece.index_select(dim, pos)
                grid = [pos.view([-1 if d == dim else 1 for d in range(len(new_pos))]) for dim, pos in enumerate(new_pos)]
                local[tuple(grid)] = piece
            out.append(local)
        result = tree_unflatten(out, spec)
        result["step"] = first["step"]
        return result
