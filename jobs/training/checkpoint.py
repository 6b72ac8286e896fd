"""Checkpoints with torch.distributed.checkpoint: asynchronous saves, a ``latest`` pointer, fallback.

Layout of a model's checkpoint directory::

    step_00000500/          one checkpoint: DCP shards (*.distcp), .metadata, train_meta.json
    step_00001000/
    latest                  "step_00001000": the newest complete checkpoint, written last

A checkpoint counts only once it is complete: DCP writes ``.metadata`` after every rank's data,
then rank 0 writes ``train_meta.json`` (what the checkpoint holds) and only then replaces
``latest`` atomically. A folder newer than ``latest`` is an unfinished save and is ignored.

At most one save is in flight: the state is copied to CPU memory (the only time training
waits), written by a background thread, and the next save first waits for the previous one.
Old checkpoints are deleted by a cleaner thread on rank 0, never in the training loop: removing
a 70B checkpoint's folder on Lustre takes long enough to stall every rank at the next collective.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from .distributed import Dist

log = logging.getLogger(__name__)
LATEST = "latest"
META = "train_meta.json"
STEP_DIR = re.compile(r"step_(\d{8})")


class CheckpointMismatch(RuntimeError):
    """The checkpoint was written for a different model than the one configured."""


class Checkpointer:
    def __init__(self, directory: str | os.PathLike, *, keep: int, async_save: bool, d: Dist, identity: dict):
        self.dir = Path(directory)
        self.keep, self.async_save, self.d = keep, async_save, d
        self.identity = identity  # what must match to resume: preset, shape, vocabulary
        self._pending: tuple[Future, int, float] | None = None
        # One stager for the whole run, so pinned CPU buffers are allocated once (GPU only).
        self._stager = DefaultStager(StagingOptions(d.on_gpu, False, False, False)) if async_save else None
        self._cleaner: ThreadPoolExecutor | None = None  # rank 0's pruning thread, started at the first commit
        if d.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)

    # --- saving ---------------------------------------------------------------------------------
    def save(self, step: int, state: dict, *, wait: bool = False) -> float:
        """Save ``state`` as step ``step``; returns the seconds training was blocked."""
        start = time.perf_counter()
        self.wait()
        path = self.step_dir(step)
        if self.async_save and not wait:
            future = dcp.async_save(state, checkpoint_id=path, process_group=self.d.checkpoint_group,
                                    async_stager=self._stager)
            self._pending = (future, step, start)
        else:
            dcp.save(state, checkpoint_id=path, process_group=self.d.checkpoint_group)
            self._commit(step, start)
        return time.perf_counter() - start

    def poll(self) -> None:
        """Commit the in-flight save if it has finished; never blocks."""
        if self._pending and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        """Block until the in-flight save (if any) is written and committed."""
        if self._pending:
            future, step, start = self._pending
            self._pending = None
            future.result()
            self._commit(step, start)

    def close(self) -> None:
        self.wait()
        if self._stager is not None:
            self._stager.close()
        if self._cleaner is not None:
            self._cleaner.shutdown(wait=True)

    def _commit(self, step: int, start: float) -> None:
        if not self.d.is_main:
            return
        path = self.step_dir(step)
        write_atomic(path / META, json.dumps({"step": step, "world_size": self.d.world_size, **self.identity}, indent=1))
        write_atomic(self.dir / LATEST, path.name + "\n")
        log.info("checkpoint step %d complete in %s (%.1f s after the save started)", step, path, time.perf_counter() - start)
        if self._cleaner is None:
            self._cleaner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-cleaner")
        self._cleaner.submit(self._prune, step)

    def _prune(self, committed: int) -> None:
        """Keep the newest ``keep`` complete checkpoints up to ``committed`` (just named by ``latest``).

        Runs on the cleaner thread. Only folders older than ``committed`` are candidates, so neither
        the checkpoint being written nor the one just committed (nor one loaded at start, until
        ``keep`` newer ones are complete) is ever removed.
        """
        try:
            older = [s for s in self.steps() if s < committed]
            complete = [s for s in older if self.is_complete(s)]
            doomed = complete[: max(len(complete) - (self.keep - 1), 0)] + [s for s in older if not self.is_complete(s)]
            for step in sorted(doomed):
                shutil.rmtree(self.step_dir(step), ignore_errors=True)
        except Exception:  # a failed clean-up must not end the run; the next commit tries again
            log.exception("pruning old checkpoints in %s failed", self.dir)

    # --- finding and loading --------------------------------------------------------------------
    def step_dir(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}"

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

    def load(self, state: dict) -> int | None:
        """Load the newest loadable checkpoint into ``state`` in place; its step, or None (fresh start).

        Every rank reaches the same answer: DCP raises on every rank if any rank fails to read.
        """
        latest = self.latest_step()
        if latest < 0:
            log.info("no checkpoint in %s: starting from step 0", self.dir)
            return None
        for step in reversed([s for s in self.steps() if s <= latest]):
            path = self.step_dir(step)
            if not self.is_complete(step):
                log.warning("checkpoint %s is incomplete (no .metadata or %s); trying the previous one", path, META)
                continue
            saved = self._read_meta(step)
            if saved is None:
                log.warning("checkpoint %s has an unreadable %s; trying the previous one", path, META)
                continue
            self._check_identity(step, saved)
            try:
                dcp.load(state, checkpoint_id=path, process_group=self.d.checkpoint_group)
            # DCP reports a failed read on any rank as CheckpointException (a BaseException) on every rank.
            except (Exception, dcp.CheckpointException) as exc:
                log.warning("checkpoint %s could not be read (%s: %s); trying the previous one",
                            path, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
                continue
            log.info("resumed from %s", path)
            return step
        log.warning("no readable checkpoint in %s (latest names step %d): starting from step 0", self.dir, latest)
        return None

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
                f"checkpoint {self.step_dir(step)} was written for a different model ({detail}). "
                f"Use a new checkpoint.dir (or model name) for this model, or set the config back."
            )


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
