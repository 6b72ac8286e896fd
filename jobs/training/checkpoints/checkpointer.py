"""Checkpoints with torch.distributed.checkpoint: asynchronous saves, a ``latest`` pointer, fallback.

Layout of a model's checkpoint directory::

    LEASE                   the one job writing here (training.checkpoints.lease); a second one refuses to start
    step_00000500/          one checkpoint: DCP shards (*.distcp), .metadata, train_meta.json
    step_00001000/
    step_00001500.partial-job1234-9f2c0a1b/   a save being written, by the lease holder
    step_00000250.deleting-job1234-9f2c0a1b/  a checkpoint being pruned
    latest                  "step_00001000": the newest complete checkpoint, written last

A checkpoint is written under a temporary name of its writer's own and counts only once it is
complete: DCP writes ``.metadata`` after every rank's data, then rank 0 writes
``train_meta.json`` (what the checkpoint holds), renames the folder to ``step_<N>`` and only
then replaces ``latest`` atomically. So a ``step_<N>`` folder is never half written, and a save
of a step that is already there (a resume from an older step) replaces it only at its commit. A
folder newer than ``latest`` is a save whose commit did not finish and is ignored. ``latest``
never moves backwards: a commit older than the step it names means another writer has been at
work, and the run stops (``CheckpointInUse``) leaving ``latest`` as it is. Resuming never
silently starts again: if ``latest`` exists and no checkpoint loads, the run stops
(``NothingLoadable``) naming each one and why; skipped newer ones are moved aside, never
deleted, and ``latest`` is set back to the checkpoint resumed from.

At most one save is in flight: the state is copied to CPU memory (the only time training
waits), written by a background thread, and the next save first waits for the previous one.
Old checkpoints are deleted by a cleaner thread on rank 0, never in the training loop: removing
a 70B checkpoint's folder on Lustre takes long enough to stall every rank at the next collective.
A checkpoint to delete is first renamed to a ``.deleting-`` name, so a process killed while
deleting it (every infrastructure failure ends with ``os._exit``) leaves no half-deleted folder
that looks complete. Temporary folders left by crashed runs are removed by the next lease holder
at its start: while it holds the lease, no other job writes them.

Verified: the trainer checks parameters and optimizer state before every save (unchanged since the
optimizer step, equal across their copies: training/resilience/replicas.py) and stops without saving
when they are not; ``train_meta.json`` records ``verified: true`` for a checkpoint so checked. A
resume from one without it says so in a warning.

Full disks: before each save, rank 0 compares the checkpoint's size (every tensor of the state,
counted once) with the free space of the file system and all ranks follow its answer. A periodic
save that does not fit is skipped with a warning naming the path and the numbers (training goes
on; ``latest`` still names the previous checkpoint); a final save that does not fit raises
``NoRoomForCheckpoint`` (exit 2: a human must make room). A save that fails anyway (the disk
filled while writing) is logged and its partial folder removed; ``latest`` is never touched. A write
refused for the model's quota (EDQUOT: its Lustre project quota on the checkpoint file system, which
the head node sets from the plan, node_scripts/fsx_quotas.sh) says so, with the quota and the fix: a
free-space check cannot see a quota, and one model's full quota stops only that model's saves.

HSDP: the replicas (``dp_replicate``) hold identical shards of model and optimizer, so only
replica 0 touches them on disk. On resume its ranks read them and broadcast every tensor to the
ranks holding the same shard in the other replicas (the mesh's ``dp_replicate`` group); on save
the other replicas pass DCP only their per-rank items and ``step``, so they stage nothing big
(DCP would write one copy anyway). Per-rank items (``rank<N>``: RNG, loader position) and
``step`` are read and written by every rank. For model5/6 (12 replicas) a resume reads 222 GB
once instead of 2.7 TB: ~31 s at the file system's 7.2 GB/s instead of ~6 min.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from atomic_file import write_atomic
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.tensor import DTensor

from training.checkpoints import lease
from training.parallel.distributed import Dist
from training.checkpoints.lease import CheckpointInUse

log = logging.getLogger(__name__)
LATEST = "latest"
META = "train_meta.json"
STEP_DIR = re.compile(r"step_(\d{8})")
# Folders of unfinished saves and unfinished deletions, by the writer whose name they end with.
PARTIAL, DELETING = ".partial-", ".deleting-"
LEFTOVER = re.compile(r"step_\d{8}\.(partial|deleting)-.+")


SPACE_MARGIN = 1.05  # DCP metadata and file-system block rounding on top of the tensors' bytes
# Keys of the state whose tensors are sharded over dp_shard and identical across HSDP replicas;
# every other key (``step``, ``rank<N>``) belongs to each rank.
REPLICATED = ("model", "optim")


class CheckpointMismatch(RuntimeError):
    """The checkpoint was written for a different model than the one configured."""


class NoRoomForCheckpoint(RuntimeError):
    """The final checkpoint does not fit on the checkpoint file system."""


class NothingLoadable(RuntimeError):
    """``latest`` names a checkpoint but none loads: stop rather than start again from step 0."""


class Checkpointer:
    """``replicate_group``: under HSDP, this rank's group of the mesh's ``dp_replicate`` dimension
    (the ranks holding the same shards, replica 0 first); None without replicas."""

    def __init__(self, directory: str | os.PathLike, *, keep: int, async_save: bool, d: Dist, identity: dict,
                 replicate_group: dist.ProcessGroup | None = None):
        self.dir = Path(directory)
        self.keep, self.async_save, self.d = keep, async_save, d
        self.identity = identity  # what must match to resume: preset, shape, vocabulary
        if replicate_group is not None and dist.get_world_size(replicate_group) == 1:
            replicate_group = None  # one replica: nothing to share
        self.replicate_group = replicate_group
        self.replica = dist.get_rank(replicate_group) if replicate_group is not None else 0
        self._pending: tuple[Future, int, float, dict] | None = None  # the save in flight: step, start, meta
        # One stager for the whole run, so pinned CPU buffers are allocated once (GPU only).
        self._stager = DefaultStager(StagingOptions(d.on_gpu, False, False, False)) if async_save else None
        self._cleaner: ThreadPoolExecutor | None = None  # rank 0's deleting thread, started when first needed
        self.holder: lease.Holder | None = None  # rank 0: this run's lease on the folder
        refusal = ""
        if d.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            try:
                self.holder = lease.acquire(self.dir)
            except CheckpointInUse as exc:
                refusal = str(exc)
        decision = [refusal, self.holder.name if self.holder else ""]
        dist.broadcast_object_list(decision, src=0, group=d.checkpoint_group)
        if decision[0]:
            raise CheckpointInUse(decision[0])
        self.writer = decision[1]  # ends the names of this run's temporary folders, the same on every rank
        if d.is_main:
            self._clear_leftovers()

    # --- saving ---------------------------------------------------------------------------------
    def save(self, step: int, state: dict, *, wait: bool = False, meta: dict | None = None) -> float:
        """Save ``state`` as step ``step``; returns the seconds training was blocked. ``meta``: recorded in
        ``train_meta.json`` beside the identity (the replica check's last agreeing step)."""
        start = time.perf_counter()
        self.wait()
        path = self.partial_dir(step)
        problem = self._no_room(step, state)
        if problem and wait:
            raise NoRoomForCheckpoint(f"{problem}: cannot save the final checkpoint. Free space there (or lower "
                                      f"checkpoint.keep), then resubmit: the run resumes from `latest`")
        if problem:
            log.warning("%s: skipping this checkpoint, training goes on and `latest` stays at step %d. Free space "
                        "there or lower checkpoint.keep", problem, self.latest_step())
            return time.perf_counter() - start
        own = self._own(state)
        if self.async_save and not wait:
            future = dcp.async_save(own, checkpoint_id=path, process_group=self.d.checkpoint_group,
                                    async_stager=self._stager)
            self._pending = (future, step, start, meta or {})
        else:
            try:
                dcp.save(own, checkpoint_id=path, process_group=self.d.checkpoint_group)
            except (Exception, dcp.CheckpointException) as exc:
                self._failed(step, exc)
                raise NoRoomForCheckpoint(f"the final checkpoint {self.step_dir(step)} could not be written "
                                          f"({self._why_not_written(exc)}); "
                                          f"`latest` still names step {self.latest_step()}") from None
            self._commit(step, start, meta or {})
        return time.perf_counter() - start

    def _own(self, state: dict) -> dict:
        """The part of ``state`` this rank reads and writes itself: all of it, except on HSDP replicas
        other than 0, which keep only their per-rank items and ``step`` (replica 0 has the same shards)."""
        if self.replica == 0:
            return state
        return {k: v for k, v in state.items() if k not in REPLICATED}

    def _no_room(self, step: int, state: dict) -> str:
        """Why ``state`` does not fit in the checkpoint file system ('' if it does); the same on every rank.

        Rank 0 is in replica 0, so it sizes the whole state: each tensor once, at its global size."""
        numbers = torch.zeros(2, dtype=torch.float64)
        if self.d.is_main:
            usage = shutil.disk_usage(self.dir)
            numbers[0], numbers[1] = state_bytes(state) * SPACE_MARGIN, usage.free
        dist.broadcast(numbers, src=0, group=self.d.checkpoint_group)
        needed, free = numbers.tolist()
        if free >= needed:
            return ""
        return (f"checkpoint step {step} needs {needed / 2**30:.2f} GiB but {self.dir} has {free / 2**30:.2f} GiB free")

    def _why_not_written(self, exc: BaseException) -> str:
        """What stopped a save, in one line: the model's quota or a full file system (and the fix), else the error."""
        code = _errno(exc)
        if code == errno.EDQUOT:
            owner = self.dir.stat().st_uid  # the model's user, whose uid is its project id (fsx_quotas.sh)
            return (f"{self.dir} is over its model's quota (Disk quota exceeded): project {owner}'s quota on the "
                    f"checkpoint file system, sized from the plan for checkpoint.keep + 2 checkpoints. Only this "
                    f"model's saves stop. See it with `lfs quota -h -p {owner} {self.dir}`; make room (remove old "
                    "exports under export/, lower checkpoint.keep) or have root raise it (`lfs setquota -p "
                    f"{owner} -B <size> <mount>`)")
        if code == errno.ENOSPC:
            return (f"the checkpoint file system of {self.dir} is full (No space left on device): free space there "
                    "or raise storage.checkpoints.storage_capacity_gib")
        return f"{type(exc).__name__}: {_first_line(exc)}"

    def _failed(self, step: int, exc: BaseException) -> None:
        log.error("checkpoint step %d could not be written (%s); `latest` still names step %d",
                  step, self._why_not_written(exc), self.latest_step())
        if self.d.is_main:
            shutil.rmtree(self.partial_dir(step), ignore_errors=True)

    def poll(self) -> None:
        """Commit the in-flight save if it has finished; never blocks."""
        if self._pending and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        """Block until the in-flight save (if any) is written and committed."""
        if self._pending:
            future, step, start, meta = self._pending
            self._pending = None
            try:
                future.result()
            except (Exception, dcp.CheckpointException) as exc:  # a full disk, a lost file system: go on
                self._failed(step, exc)
                return
            self._commit(step, start, meta)

    def close(self) -> None:
        self.wait()
        if self._stager is not None:
            self._stager.close()
        if self._cleaner is not None:
            self._cleaner.shutdown(wait=True)
        if self.holder is not None:
            lease.release(self.dir, self.holder)

    def _commit(self, step: int, start: float, meta: dict) -> None:
        """Make the written save ``step_<N>`` and name it in ``latest`` (rank 0; every rank's data and DCP's
        ``.metadata`` are on disk once rank 0's save has returned)."""
        if not self.d.is_main:
            return
        partial, path = self.partial_dir(step), self.step_dir(step)
        if not lease.holds(self.dir, self.holder):
            raise CheckpointInUse(
                f"{self.dir / lease.LEASE} no longer names this run ({self.holder.describe()}): another job took "
                f"this model's checkpoints. Checkpoint step {step} is left uncommitted in {partial.name}, `latest` "
                f"untouched, and this run stops")
        latest = self.latest_step()
        if step < latest:
            raise CheckpointInUse(
                f"'{LATEST}' in {self.dir} names step {latest}, newer than this run's checkpoint step {step}: "
                f"another job has written this model's checkpoints since this run started. '{LATEST}' stays at "
                f"step {latest}, checkpoint step {step} is left uncommitted in {partial.name}, and this run stops")
        write_atomic(partial / META, json.dumps({"step": step, "world_size": self.d.world_size, **self.identity,
                                                 **meta}, indent=1))
        if path.exists():  # saved before by a run that did not commit it, or resumed from an older step
            replaced = self.deleting_dir(step)
            path.rename(replaced)
            self._in_cleaner(shutil.rmtree, replaced, ignore_errors=True)
        partial.rename(path)
        write_atomic(self.dir / LATEST, path.name + "\n")
        log.info("checkpoint step %d complete in %s (%.1f s after the save started)", step, path, time.perf_counter() - start)
        self._in_cleaner(self._prune, step)

    def _in_cleaner(self, work, *args, **kwargs) -> None:
        if self._cleaner is None:
            self._cleaner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-cleaner")
        self._cleaner.submit(work, *args, **kwargs)

    def _prune(self, committed: int) -> None:
        """Keep the newest ``keep`` complete checkpoints up to ``committed`` (just named by ``latest``).

        Runs on the cleaner thread. Only ``step_<N>`` folders older than ``committed`` are candidates,
        so neither a save being written (a temporary name) nor the checkpoint just committed (nor one
        loaded at start, until ``keep`` newer ones are complete) is ever removed. Each is renamed
        before it is deleted: a crash in between leaves a ``.deleting-`` folder, which is no checkpoint.
        """
        try:
            older = [s for s in self.steps() if s < committed]
            complete = [s for s in older if self.is_complete(s)]
            doomed = complete[: max(len(complete) - (self.keep - 1), 0)] + [s for s in older if not self.is_complete(s)]
            for step in sorted(doomed):
                doomed_path = self.deleting_dir(step)
                self.step_dir(step).rename(doomed_path)
                shutil.rmtree(doomed_path, ignore_errors=True)
        except Exception:  # a failed clean-up must not end the run; the next commit tries again
            log.exception("pruning old checkpoints in %s failed", self.dir)

    def _clear_leftovers(self) -> None:
        """Delete the temporary folders of crashed runs: unfinished saves and deletions (on the cleaner thread).

        Only the lease holder calls this, so none of them belongs to a live writer."""
        for path in sorted(self.dir.iterdir()):
            if LEFTOVER.fullmatch(path.name):
                log.info("removing %s, left by a run that ended before finishing it", path.name)
                self._in_cleaner(shutil.rmtree, path, ignore_errors=True)

    # --- finding and loading --------------------------------------------------------------------
    def step_dir(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}"

    def partial_dir(self, step: int) -> Path:
        """Where this run writes ``step`` until it commits it."""
        return self.dir / f"step_{step:08d}{PARTIAL}{self.writer}"

    def deleting_dir(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}{DELETING}{self.writer}"

    def steps(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := STEP_DIR.fullmatch(p.name)))

    def latest_step(self) -> int:
        """Step named by ``latest``; -1 if there is none."""
        try:
            m = STEP_DIR.fullmatch((self.dir / LATEST).read_text().strip())
        except OSError:
            return -1
        return int(m.group(1)) if m else -1

    def is_complete(self, step: int) -> bool:
        path = self.step_dir(step)
        return (path / ".metadata").is_file() and (path / META).is_file()

    def load(self, state) -> int | None:
        """Load the newest loadable checkpoint into a state dict in place; its step, or None (no checkpoint).

        ``state`` is the dict to fill, or a function of the checkpoint's ``train_meta.json`` that
        builds it (what a resume on another world size loads differs). A newer checkpoint that
        cannot be used is skipped with a warning and moved aside to ``unreadable_step_*`` (kept for
        inspection, never loaded, pruned or overwritten by a later save). If ``latest`` exists and
        nothing loads, ``NothingLoadable`` names every checkpoint and why: the run must not quietly
        start again from step 0 and then prune good checkpoints it could not read.

        Every rank reaches the same answer: DCP raises on every rank if any rank fails to read
        (under HSDP only replica 0 reads model and optimizer; a failure there skips the checkpoint
        on every rank too).
        """
        latest = self.latest_step()
        if latest < 0:
            complete = [s for s in self.steps() if self.is_complete(s)]
            if complete:
                raise NothingLoadable(
                    f"{self.dir} holds complete checkpoints ({', '.join(self.step_dir(s).name for s in complete)}) "
                    f"but no readable '{LATEST}' pointer; write the newest one's name into {self.dir / LATEST} "
                    f"to resume from it, or move the folders away to start again")
            log.info("no checkpoint in %s: starting from step 0", self.dir)
            return None
        failures: list[tuple[int, str]] = []
        start = time.perf_counter()
        for step in reversed([s for s in self.steps() if s <= latest]):
            path = self.step_dir(step)
            saved = self._read_meta(step)
            if not self.is_complete(step):
                why = f"is incomplete (no .metadata or {META})"
            elif saved is None:
                why = f"has an unreadable {META}"
            else:
                self._check_identity(step, saved)
                target = state(saved) if callable(state) else state
                why = self._read(target, path)
            if why:
                log.warning("checkpoint %s %s; trying the previous one", path, why)
                failures.append((step, why))
                continue
            # Outside _read: a failed broadcast is a broken job (requeue), not an unreadable checkpoint.
            self._from_replica_0(target)
            log.info("resumed from %s in %.1f s", path, time.perf_counter() - start)
            if step > 0 and saved.get("verified") is not True:  # step 0: released weights, no training yet
                log.warning("checkpoint %s is not verified (%s has no `verified: true`: saved with "
                            "train.replica_check_every 0, or by an older version): its parameters and optimizer "
                            "state were not checked for silent corruption when it was saved", path, META)
            self._set_aside([s for s, _ in failures])
            if step != latest and self.d.is_main:  # this run's commits follow the checkpoint it resumed from
                write_atomic(self.dir / LATEST, path.name + "\n")
                log.warning("'%s' set back from step %d to %s, the checkpoint resumed from", LATEST, latest, path.name)
            return step
        detail = "; ".join(f"{self.step_dir(s).name}: {why}" for s, why in failures) or "no step folders"
        raise NothingLoadable(
            f"'{LATEST}' in {self.dir} names step {latest} but no checkpoint loads ({detail}). Nothing was "
            f"changed. Fix or restore a checkpoint (e.g. from the S3 backup), or move the folder away to "
            f"start again from step 0")

    def _read(self, state: dict, path: Path) -> str:
        """Read this rank's part of ``state`` from ``path``; why it could not ('' if it could)."""
        own = self._own(state)
        try:
            dcp.load(own, checkpoint_id=path, process_group=self.d.checkpoint_group)
        # DCP reports a failed read on any rank as CheckpointException (a BaseException) on every rank.
        except (Exception, dcp.CheckpointException) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return f"could not be read ({type(exc).__name__}: {first})"
        state.update(own)  # DCP puts non-tensor values (``step``) into the dict it is given, a copy on replicas > 0
        return ""

    def _from_replica_0(self, state: dict) -> None:
        """Give the other HSDP replicas replica 0's model and optimizer state, just read from disk.

        Each rank receives from the rank of replica 0 that holds its shard: one broadcast per tensor
        over the ``dp_replicate`` group, in place (DTensors: their local shard). The optimizer's
        hyperparameters (param groups) follow in one message, so every replica resumes with the
        checkpoint's, as replica 0 does.
        """
        if self.replicate_group is None:
            return
        start = time.perf_counter()
        leaves = [leaf for key in REPLICATED if key in state for leaf in _leaves(state[key])]
        with torch.no_grad():
            for _, _, value in leaves:
                if isinstance(value, torch.Tensor):
                    self._broadcast(value.to_local() if isinstance(value, DTensor) else value)
        others = [(tree, key) for tree, key, value in leaves if not isinstance(value, torch.Tensor)]
        values = [[tree[key] for tree, key in others]]
        dist.broadcast_object_list(values, group=self.replicate_group, group_src=0)
        for (tree, key), value in zip(others, values[0]):
            tree[key] = value
        log.info("model and optimizer state sent from replica 0 to the other %d replica(s) in %.1f s",
                 dist.get_world_size(self.replicate_group) - 1, time.perf_counter() - start)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        """Replica 0's ``tensor`` into this rank's, in place. Through a copy where needed: collectives take
        contiguous tensors, and on GPU the mesh's groups are NCCL only (Adam's ``step`` is on the CPU)."""
        buffer = tensor.to(self.d.device).contiguous()  # ``tensor`` itself when it already is both
        dist.broadcast(buffer, group=self.replicate_group, group_src=0)
        if buffer is not tensor:
            tensor.copy_(buffer)

    def _set_aside(self, steps: list[int]) -> None:
        """Rename skipped newer checkpoints so a later save of the same step does not overwrite them."""
        dist.barrier(group=self.d.checkpoint_group)  # every rank has finished reading before renames
        if not self.d.is_main:
            return
        for step in steps:
            path = self.step_dir(step)
            aside = self.dir / f"unreadable_{path.name}_{time.strftime('%Y%m%dT%H%M%S')}"
            path.rename(aside)
            log.warning("moved the unusable checkpoint %s to %s", path, aside.name)

    def _read_meta(self, step: int) -> dict | None:
        try:
            return json.loads((self.step_dir(step) / META).read_text())
        except (OSError, ValueError):
            return None

    def _check_identity(self, step: int, saved: dict) -> None:
        diff = {k: (saved.get(k), v) for k, v in self.identity.items() if saved.get(k) != v}
        if diff:
            detail = "; ".join(f"{k}: checkpoint has {a!r}, config has {b!r}" for k, (a, b) in diff.items())
            raise CheckpointMismatch(
                f"checkpoint {self.step_dir(step)} was written for a different model or data order ({detail}). "
                f"Use a new checkpoint.dir (or model name) for this model, or set the config back."
            )


def state_bytes(state) -> int:
    """Bytes of every tensor in a (nested) state dict; a sharded DTensor counts at its full size, once."""
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    if isinstance(state, (torch.Tensor, DTensor)):
        return state.numel() * state.element_size()
    return 0


def _leaves(tree: dict | list):
    """(container, key, value) of each leaf of nested dicts and lists, in the same order on every rank."""
    for key, value in tree.items() if isinstance(tree, dict) else enumerate(tree):
        if isinstance(value, dict | list):
            yield from _leaves(value)
        else:
            yield tree, key, value


def _errno(exc: BaseException) -> int | None:
    """The errno of the OSError behind ``exc``: itself, its cause or context, or a rank's failure that DCP
    wrapped (CheckpointException.failures)."""
    seen: list[BaseException] = []
    pending = [exc]
    while pending:
        current = pending.pop()
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        if isinstance(current, OSError) and current.errno:
            return current.errno
        pending += [current.__cause__, current.__context__]
        pending += [failure[0] for failure in getattr(current, "failures", {}).values()]
    return None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

