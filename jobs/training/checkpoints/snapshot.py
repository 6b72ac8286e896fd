"""Snapshots in memory: every rank's own shard of the training state in its node's memory, and a copy on another node.

A failure that kills the training processes (a crashed rank, a lost node taking its peers' collectives
down) leaves the nodes' memory: files in ``/dev/shm`` outlive the processes that wrote them. Every
``checkpoint.snapshot_every`` steps each rank copies its own part of the state (model and optimizer shards,
the step, its RNG and loader position: ``Trainer.app_state`` with every DTensor as its local tensor) to
CPU memory, the only time training waits; a background thread then serializes it, writes it to the
node's memory and sends a second copy to its *buddy*, the rank with the same place on the node half the
allocation away (for an allocation across two Capacity Blocks in node order, the other block), which
writes it beside its own. Relaunched in the same job (jobs/train.sh), the ranks gather what every node
holds and load the newest step that is whole for every rank: from their own node's memory, or over the
network from whichever node holds a copy (a replacement node gets the lost node's shards from their
buddies); only when no step is whole do they read the checkpoint on the file system.

Layout, in ``checkpoint.snapshot_dir`` (default ``/dev/shm``)::

    llm-snapshots-<run name>-<uid>/    this run's user's, mode 0700; refused if anyone else's
      job_<Slurm job id>/<node>/         one folder per node (nodes may share a /dev/shm: the local cluster)
        step_00000120/rank_00003.pt      rank 3's state at step 120, here as its own or its buddy's copy
        step_00000120/rank_00003.json    its manifest: size, SHA-256, layout; written last

A file counts only with its manifest, and both are written under a temporary name and renamed, so a
snapshot interrupted by a failure is never loaded; a file whose SHA-256 does not match its manifest is
refused and another copy tried. The previous step's files are removed only once every rank has written
the new step and its buddy's copy. The same model and parallelism are needed to load. On the world size
that wrote it, each rank loads its own file; on another (a relaunch on fewer nodes, or on all of them
again), each rank fetches the files of the old ranks whose chunks hold its new shards and cuts them out
(training/checkpoints/reshard.py), and takes old rank 0's loader position, as a resume from the file
system on another world size does. The files go with the job: the run removes them when it ends cleanly,
and the node's epilog (node_scripts/slurm_health_hook.sh) when the job ends; except across the job's planned
requeue that grows a run on fewer nodes back to its whole allocation (``hold``): that stop keeps the state here
instead of saving it to the file system, and marks each node's job folder (``requeued``, with the restart count of
the run that wrote it) for the epilog to keep while Slurm requeues the job. The requeued run loads it on the whole
allocation, the returning node's ranks fetching their shards over the network, and removes the mark.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import socket
import stat
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from atomic_file import write_atomic
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from training.checkpoints import reshard
from training.parallel.distributed import Dist

log = logging.getLogger(__name__)
STEP_DIR = re.compile(r"step_(\d{8})")
RANK_FILE = re.compile(r"rank_(\d{5})\.json")
KEPT_MARK = "requeued"  # in job_<id>/: the epilog keeps the folder across the job's requeue (slurm_health_hook.sh)


def planned_grow_stop() -> bool:
    """This stop is the planned one that brings a run on fewer nodes back to all of them: jobs/train.sh creates
    TRAIN_GROW_MARK before it signals the workers, and the stop then keeps the state in memory (``hold``)."""
    mark = os.environ.get("TRAIN_GROW_MARK")
    return bool(mark) and os.path.exists(mark)


def node_name() -> str:
    """This node's name: Slurm's for it (SLURMD_NODENAME; unique even where nodes share a host), else the host's."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def run_root(snapshot_dir: str, run_name: str) -> Path:
    """The run's folder, named by its user too: another user's job of the same name keeps its own."""
    return Path(snapshot_dir) / f"llm-snapshots-{run_name}-{os.getuid()}"


def job_root(snapshot_dir: str, run_name: str) -> Path:
    return run_root(snapshot_dir, run_name) / f"job_{os.environ.get('SLURM_JOB_ID') or 'local'}"


class Untrusted(RuntimeError):
    """The snapshot folder is not this user's alone: another user could have written what it holds."""


def own_folder(path: Path) -> None:
    """Create ``path`` (mode 0700) or accept it only if it is this user's and nobody else's to write."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise Untrusted(f"{path} is not a folder of this user's alone (owner uid {info.st_uid}, mode "
                        f"{stat.S_IMODE(info.st_mode):o}): snapshots in memory are off for this run; remove it")


@dataclass(frozen=True)
class Copy:
    """One rank's state at one step, held in one node's memory."""
    node: str
    rank: int  # the rank that saved it (the one that loads it, on the same world size)
    step: int
    manifest: dict


def same_run(layout: dict, other: dict) -> bool:
    """The same model and parallelism, on any world size."""
    return {k: v for k, v in layout.items() if k != "world_size"} == {k: v for k, v in other.items() if k != "world_size"}


def plan_restore(holdings: list[Copy], *, world_size: int, layout: dict, not_before: int,
                 refused: set[tuple[str, int, int]]) -> tuple[int, dict[int, list[Copy]]] | None:
    """The newest step at or after ``not_before`` for which every rank of the world that wrote it has its
    state held somewhere (and not refused, as ``(node, rank, step)``), and where each of those ranks' states
    is held; None if there is none. That world may be another size than ``world_size`` (then resharded):
    ``len(sources)`` is its size. At one step, this world's snapshot is preferred."""
    by_step: dict[tuple[int, int], dict[int, list[Copy]]] = {}
    for copy in holdings:
        m = copy.manifest
        if (copy.node, copy.rank, copy.step) in refused or not same_run(m.get("layout", {}), layout):
            continue
        by_step.setdefault((copy.step, int(m.get("world_size", 0))), {}).setdefault(copy.rank, []).append(copy)
    for step, world in sorted(by_step, key=lambda k: (k[0], k[1] == world_size), reverse=True):
        if step < not_before:
            break
        ranks = by_step[step, world]
        if set(ranks) == set(range(world)):
            return step, {rank: sorted(copies, key=lambda c: c.node) for rank, copies in ranks.items()}
    return None


def local_shards(state):
    """``state`` with every tensor a CPU copy of this rank's own part (a DTensor's local tensor)."""
    leaves, spec = tree_flatten(state)
    out = []
    for leaf in leaves:
        if isinstance(leaf, DTensor):
            leaf = leaf.to_local()
        if isinstance(leaf, torch.Tensor):
            leaf = leaf.detach().to("cpu", copy=True)
        out.append(leaf)
    return tree_unflatten(out, spec)


def into_template(saved, template):
    """The saved local shards as ``template`` holds them (DTensors rebuilt on the template's mesh and placements)."""
    saved_leaves, saved_spec = tree_flatten(saved)
    leaves, spec = tree_flatten(template)
    if saved_spec != spec:
        raise ValueError("the snapshot's state has other keys than this run's")
    out = []
    for have, want in zip(saved_leaves, leaves):
        if isinstance(want, DTensor):
            local = have.to(want.device)
            if local.shape != want.to_local().shape:
                raise ValueError(f"a shard of shape {tuple(local.shape)} where this run has {tuple(want.to_local().shape)}")
            have = DTensor.from_local(local, want.device_mesh, want.placements, run_check=False,
                                      shape=want.shape, stride=want.stride())
        elif isinstance(want, torch.Tensor):
            have = have.to(want.device)
        out.append(have)
    return tree_unflatten(out, spec)


class Snapshots:
    """``every``: steps between snapshots. ``layout``: what must match to load one (model, parallelism, world)."""

    def __init__(self, snapshot_dir: str, run_name: str, *, every: int, d: Dist, layout: dict):
        self.every, self.d, self.layout = every, d, layout
        self.group = d.snapshot_group
        self.node = node_name()
        nodes: list = [None] * d.world_size
        dist.all_gather_object(nodes, self.node, group=self.group)
        self.nodes = nodes  # every rank's node, by rank
        self.buddy, self.buddy_of = buddies(nodes, d.rank)
        self.dir: Path | None = None
        problem = ""
        try:
            own_folder(run_root(snapshot_dir, run_name))
            own_folder(job_root(snapshot_dir, run_name))
            self.dir = job_root(snapshot_dir, run_name) / self.node
            self.dir.mkdir(exist_ok=True)
            if nodes.index(self.node) == d.rank:  # this run has the folder now: the next end of the job removes it
                (self.dir.parent / KEPT_MARK).unlink(missing_ok=True)
        except (Untrusted, OSError) as exc:
            problem = str(exc)
        problems: list = [None] * d.world_size  # off on every rank if off on any: the buddy copies pair up ranks
        dist.all_gather_object(problems, problem, group=self.group)
        if any(problems):
            if d.is_main:
                log.warning("snapshots in memory: off: %s", next(p for p in problems if p))
            self.dir = None
        elif d.is_main:
            log.info("snapshots in memory every %d steps in %s on each node%s", every, job_root(snapshot_dir, run_name),
                     ", a copy of each on its buddy node half the allocation away" if self.buddy is not None
                     else " (one node: no buddy copy)")
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot-writer")
        self._pending: tuple[Future, int] | None = None
        self.last_written = -1  # the newest step every rank and buddy holds
        self.last_write_s = 0.0  # the writer's seconds for it: serialize, hash, store, copy to the buddy

    @property
    def enabled(self) -> bool:
        return self.dir is not None

    def due(self, step: int) -> bool:
        return self.enabled and self.every > 0 and step % self.every == 0

    # --- taking -------------------------------------------------------------------------------
    def take(self, step: int, state: dict) -> float:
        """Copy this rank's state to CPU memory and hand it to the writer; returns the seconds training waited."""
        start = time.perf_counter()
        self.wait()
        copy, places = local_shards(state), reshard.meshes(state)
        self._pending = (self._writer.submit(self._write, step, copy, places), step)
        return time.perf_counter() - start

    def hold(self, step: int, state: dict) -> bool:
        """The planned stop before a requeue onto the whole allocation: a snapshot of ``step`` taken and waited
        for; if it is whole on every node (own and buddy copies), each node's job folder is marked for the epilog to
        keep across the requeue and True is returned on every rank; else False (save to the file system instead)."""
        if not self.enabled:
            return False
        self.take(step, state)
        self.wait()
        whole = torch.tensor([1 if self.last_written == step else 0], dtype=torch.int32)
        dist.all_reduce(whole, op=dist.ReduceOp.MIN, group=self.group)
        if not whole.item():
            return False
        if self.nodes.index(self.node) == self.d.rank:
            mark = self.dir.parent / KEPT_MARK
            mark.write_text(f"{int(os.environ.get('SLURM_RESTART_COUNT', 0) or 0)}\n")
        if self.d.is_main and os.environ.get("TRAIN_GROW_MARK"):  # the nodes holding it, for jobs/train.sh's requeue
            write_atomic(Path(os.environ["TRAIN_GROW_MARK"]), " ".join(dict.fromkeys(self.nodes)) + "\n")
        dist.barrier(group=self.group)
        return True

    def poll(self) -> None:
        if self._pending and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        if self._pending:
            future, step = self._pending
            self._pending = None
            try:
                future.result()
            except Exception as exc:  # a peer gone mid-copy: this step's snapshot is not whole, and never loads
                log.warning("snapshot step %d not written: %s", step, exc)

    def _write(self, step: int, state: dict, places: dict) -> None:
        started = time.perf_counter()
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getbuffer()
        manifest = {"step": step, "rank": self.d.rank, "world_size": self.d.world_size, "layout": self.layout,
                    "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "written_on": self.node,
                    "meshes": places}  # this rank's place in each device mesh: where its chunks lie, to reshard
        problem = ""
        try:
            self._store(self.d.rank, step, data, manifest)
            if self.buddy is not None:
                theirs, their_manifest = self._exchange(data, manifest)
                if hashlib.sha256(theirs).hexdigest() != their_manifest["sha256"]:
                    raise OSError(f"the copy of rank {self.buddy_of}'s snapshot arrived damaged")
                self._store(self.buddy_of, step, theirs, their_manifest)
        except OSError as exc:  # a full /dev/shm: this step is not whole; every rank still votes below
            problem = str(exc)
        # Whole on every rank (its own and its buddy's): the older steps can go.
        whole = torch.tensor([0 if problem else 1], dtype=torch.int32)
        dist.all_reduce(whole, op=dist.ReduceOp.MIN, group=self.group)
        if problem:
            raise OSError(problem)
        if whole.item():
            self.last_written, self.last_write_s = step, time.perf_counter() - started
            self._remove_before(step)

    def _exchange(self, data, manifest: dict) -> tuple[memoryview, dict]:
        """Send this rank's snapshot to its buddy and receive the one it keeps a copy of."""
        meta = bytearray(json.dumps(manifest).encode())
        sizes = torch.tensor([len(meta), len(data)], dtype=torch.int64)
        their_sizes = torch.empty(2, dtype=torch.int64)
        wait_all([dist.isend(sizes, self.buddy, group=self.group), dist.irecv(their_sizes, self.buddy_of, group=self.group)])
        their_meta = torch.empty(int(their_sizes[0]), dtype=torch.uint8)
        theirs = torch.empty(int(their_sizes[1]), dtype=torch.uint8)
        wait_all([dist.isend(torch.frombuffer(meta, dtype=torch.uint8), self.buddy, group=self.group),
                  dist.isend(torch.frombuffer(data, dtype=torch.uint8), self.buddy, group=self.group),
                  dist.irecv(their_meta, self.buddy_of, group=self.group),
                  dist.irecv(theirs, self.buddy_of, group=self.group)])
        return memoryview(theirs.numpy()), json.loads(their_meta.numpy().tobytes())

    def _store(self, rank: int, step: int, data, manifest: dict) -> None:
        """The data, then its manifest, each renamed into place: a file without its manifest never loads."""
        folder = self.dir / f"step_{step:08d}"
        folder.mkdir(exist_ok=True)
        for name, payload in ((f"rank_{rank:05d}.pt", data), (f"rank_{rank:05d}.json", json.dumps(manifest).encode())):
            temporary = folder / f".{name}.{os.getpid()}"
            with open(temporary, "wb") as f:
                f.write(payload)
            os.replace(temporary, folder / name)

    def _remove_before(self, step: int) -> None:
        """Every file on this node of every step before ``step``: every rank of the job has written ``step``
        (or the state is being discarded), and older steps may hold another world size's ranks."""
        for folder in self.dir.glob("step_*"):
            match = STEP_DIR.fullmatch(folder.name)
            if not match or int(match[1]) >= step:
                continue
            for suffix in ("json", "pt"):  # the manifests first: a file without one is never loaded
                for path in folder.glob(f"rank_*.{suffix}"):
                    path.unlink(missing_ok=True)
            try:
                folder.rmdir()  # the node's last rank to get here removes it
            except OSError:
                pass

    def discard(self) -> None:
        """Remove this rank's snapshots (the state may be corrupt: the next start reads the file system)."""
        self.wait()
        if self.enabled:
            self._remove_before(1 << 40)

    def close(self, *, remove: bool) -> None:
        """Finish the write in flight; ``remove``: the run ended cleanly, its snapshots are of no more use."""
        self.wait()
        self._writer.shutdown(wait=True)
        if remove and self.enabled:
            dist.barrier(group=self.group)  # no rank still reading or writing
            if self.nodes.index(self.node) == self.d.rank:
                shutil.rmtree(self.dir, ignore_errors=True)

    # --- restoring ----------------------------------------------------------------------------
    def holdings(self) -> list[Copy]:
        """Every rank's state this node holds, by its manifests (read by the node's lowest rank only)."""
        if not self.enabled or self.nodes.index(self.node) != self.d.rank:
            return []
        found = []
        for manifest_path in self.dir.glob("step_*/rank_*.json"):
            if not STEP_DIR.fullmatch(manifest_path.parent.name) or not RANK_FILE.fullmatch(manifest_path.name):
                continue
            try:
                manifest = json.loads(manifest_path.read_text())
                found.append(Copy(self.node, int(manifest["rank"]), int(manifest["step"]), manifest))
            except (OSError, ValueError, KeyError) as exc:
                log.warning("snapshot manifest %s unreadable (%s): ignored", manifest_path, exc)
        return found

    def restore(self, template, *, not_before: int) -> tuple[dict, int, dict] | None:
        """Load the newest whole snapshot at or after step ``not_before`` (the file system's latest) on every
        rank; None (on every rank) where there is none. ``template(saved_world)``: this run's state to load
        into, for a snapshot written by ``saved_world`` ranks (``app_state``: rank 0's per-rank items on
        another world size). Returns (state, step, how: ranks loaded from their own node and from another's,
        bytes sent between nodes, seconds, the world size that wrote it)."""
        if not self.enabled:
            return None
        gathered: list = [None] * self.d.world_size
        dist.all_gather_object(gathered, self.holdings(), group=self.group)
        holdings = [copy for node_copies in gathered for copy in node_copies]
        refused: set[tuple[str, int, int]] = set()
        while True:
            plan = plan_restore(holdings, world_size=self.d.world_size, layout=self.layout, not_before=max(not_before, 0),
                                refused=refused)
            if plan is None:
                if self.d.is_main and holdings:
                    log.warning("snapshots in memory: no step whole for every rank (%d copies held%s): resuming from "
                                "the file system", len(holdings), f", {len(refused)} refused" if refused else "")
                return None
            step, sources = plan
            saved_world = len(sources)
            start = time.perf_counter()
            state = template(saved_world)
            cut, problem = None, ""
            if saved_world == self.d.world_size:
                mine = [self.d.rank]
            else:
                try:
                    local = {rank for rank, copies in sources.items() if any(c.node == self.node for c in copies)}
                    cut = reshard.Plan(state, {rank: copies[0].manifest for rank, copies in sources.items()}, local,
                                       rank=self.d.rank)
                    mine = cut.sources
                except reshard.Unreshardable as exc:
                    problem, mine = str(exc), []
            problems: list = [None] * self.d.world_size
            dist.all_gather_object(problems, problem, group=self.group)
            if any(problems):
                if self.d.is_main:
                    log.warning("snapshots in memory: step %d of %d ranks cannot be resharded to %d ranks (%s): resuming "
                                "from the file system", step, saved_world, self.d.world_size, next(p for p in problems if p))
                return None
            needs: list = [None] * self.d.world_size
            dist.all_gather_object(needs, mine, group=self.group)
            data, failures, moved = self._fetch(step, sources, needs)
            everyone: list = [None] * self.d.world_size
            dist.all_gather_object(everyone, failures, group=self.group)
            new = {f for rank_failures in everyone for f in rank_failures}
            if not new:
                break
            for node, rank, bad_step, why in sorted(new):
                if self.d.is_main:
                    log.warning("snapshot step %d of rank %d on %s refused: %s; trying another copy", bad_step, rank, node, why)
                refused.add((node, rank, bad_step))
        files = {rank: torch.load(io.BytesIO(payload), weights_only=True) for rank, payload in data.items()}
        if cut is None:
            state = into_template(files[self.d.rank], state)
        else:  # old rank 0's per-rank items (its loader position) to every rank, from new rank 0, which read them
            items = [files[0]["rank0"] if self.d.is_main else None]
            dist.broadcast_object_list(items, src=0, group=self.group)
            state = into_template({**cut.assemble(state, files), "rank0": items[0]}, state)
        local = all(self._holder(sources[old], self.d.rank).node == self.node for old in needs[self.d.rank])
        counts = torch.tensor([int(local), moved], dtype=torch.int64)
        dist.all_reduce(counts, group=self.group)
        how = {"own_node": int(counts[0]), "other_node": self.d.world_size - int(counts[0]), "bytes_moved": int(counts[1]),
               "seconds": round(time.perf_counter() - start, 3), "saved_world": saved_world}
        if self.d.is_main:
            resharded = f", resharded from {saved_world} ranks" if saved_world != self.d.world_size else ""
            log.info("resumed from the snapshot in memory of step %d%s: of its %d ranks, %d from their own node, %d from a "
                     "copy on another node (%.3g MB sent, %.2f s)", step, resharded, self.d.world_size, how["own_node"],
                     how["other_node"], how["bytes_moved"] / 1e6, how["seconds"])
        self.last_written = step
        return state, step, how

    def _holder(self, copies: list[Copy], rank: int) -> Copy:
        """The copy ``rank`` reads: one on its own node if its node holds one, else the first node's."""
        return next((c for c in copies if c.node == self.nodes[rank]), copies[0])

    def _fetch(self, step: int, sources: dict[int, list[Copy]], needs: list[list[int]]) -> tuple[dict[int, bytes], list, int]:
        """The saved states this rank needs (``needs[rank]``: saving ranks) at ``step``: read here, or received from
        the node holding them; this rank sends what its node holds for ranks elsewhere (the node's lowest rank
        sends), each file read once. Returns (payload by saving rank, refused copies, bytes sent)."""
        first_rank = {node: self.nodes.index(node) for node in set(self.nodes)}
        failures, sent, sends, keep = [], 0, [], []
        if first_rank[self.node] == self.d.rank:
            read: dict[int, bytearray] = {}
            for rank, wanted in enumerate(needs):
                if self.nodes[rank] == self.node:
                    continue
                for old in wanted:
                    copy = self._holder(sources[old], rank)
                    if copy.node != self.node:
                        continue
                    if old not in read:
                        read[old], why = self._read(copy)
                        if why:
                            failures.append((copy.node, old, step, why))
                    payload = read[old]
                    size = torch.tensor([len(payload)], dtype=torch.int64)
                    keep.append(size)
                    sends.append(dist.isend(size, rank, group=self.group))
                    if len(payload):
                        sends.append(dist.isend(torch.frombuffer(payload, dtype=torch.uint8), rank, group=self.group))
                        sent += len(payload)
        data: dict[int, bytes] = {}
        for old in needs[self.d.rank]:
            copy = self._holder(sources[old], self.d.rank)
            if copy.node == self.node:
                payload, why = self._read(copy)
                if why:
                    failures.append((copy.node, old, step, why))
                else:
                    data[old] = payload
                continue
            size = torch.zeros(1, dtype=torch.int64)
            dist.recv(size, first_rank[copy.node], group=self.group)
            if not int(size):  # unreadable there: the sender reports it
                continue
            buffer = torch.empty(int(size), dtype=torch.uint8)
            dist.recv(buffer, first_rank[copy.node], group=self.group)
            payload = buffer.numpy().tobytes()
            if hashlib.sha256(payload).hexdigest() != copy.manifest["sha256"]:
                failures.append((copy.node, old, step, "its SHA-256 does not match its manifest (damaged in transfer)"))
            else:
                data[old] = payload
        wait_all(sends)
        return data, failures, sent

    def _read(self, copy: Copy) -> tuple[bytearray, str]:
        """A copy's bytes and '' if whole, else what is wrong with it."""
        path = self.dir / f"step_{copy.step:08d}" / f"rank_{copy.rank:05d}.pt"
        try:
            with open(path, "rb") as f:
                data = bytearray(f.read())
        except OSError as exc:
            return bytearray(), f"unreadable ({exc})"
        if len(data) != copy.manifest["bytes"] or hashlib.sha256(data).hexdigest() != copy.manifest["sha256"]:
            return bytearray(), f"{path}: its SHA-256 does not match its manifest"
        return data, ""


def buddies(nodes: list[str], rank: int) -> tuple[int | None, int | None]:
    """(the rank this rank's copy goes to, the rank whose copy it keeps): the rank with the same place on the
    node half the nodes away, in order of first rank. None, None on one node or nodes of unequal rank counts."""
    order = list(dict.fromkeys(nodes))
    ranks_of = {node: [r for r, n in enumerate(nodes) if n == node] for node in order}
    if len(order) < 2 or len({len(ranks) for ranks in ranks_of.values()}) > 1:  # pairs need equal nodes
        return None, None
    here = order.index(nodes[rank])
    place = ranks_of[nodes[rank]].index(rank)
    shift = len(order) // 2

    def at(node_index: int) -> int:
        return ranks_of[order[node_index % len(order)]][place]

    return at(here + shift), at(here - shift)


def wait_all(works) -> None:
    for work in works:
        work.wait()
