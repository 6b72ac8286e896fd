"""Training data loader over packed-token shards: deterministic, split by rank and worker, O(1) resume.

Used by training like::

    meta = read_dataset_meta(path)                       # DatasetError if missing or malformed
    check_compatible(meta, seq_len=cfg.seq_len, vocab_size=cfg.vocab_size)
    loader = TokenLoader(path, batch_size=micro_batch, seq_len=cfg.seq_len, rank=rank,
                         world_size=world_size, num_workers=2, seed=cfg.seed, pin_memory=on_cuda)
    loader.load_state_dict(checkpoint["data"])           # optional: resume
    for batch in loader:                                 # endless: epoch after epoch, reshuffled
        batch["input_ids"], batch["labels"]              # int64 [batch_size, seq_len]
        ...
        checkpoint["data"] = loader.state_dict()         # small dict, the same on every rank

Order. Epoch ``e`` is a permutation of every sequence in the dataset: the shards are shuffled
with ``(seed, e)``, and the sequences inside each shard with ``(seed, e, shard)``; the shuffled
shards are laid end to end. An epoch uses the first ``total // G * G`` sequences of that
permutation, ``G`` the global batch (sequences per optimizer step over all ranks; default
``world_size x batch_size``); the few left over change every epoch. Batch ``g`` of rank ``r`` of
``w`` (counted across epochs) is the ``b`` sequences at ``g x w x b + r x b`` of the epoch's
order: the ranks' micro-batches are interleaved, so optimizer step ``s`` always consumes
positions ``[s x G, (s + 1) x G)`` whatever the world size and accumulation. Batch ``g`` is a
pure function of ``(seed, rank, world_size, batch_size, global batch, g)``.

Workers. DataLoader worker ``i`` of ``k`` (``num_workers``, ``prefetch_factor`` batches each)
produces batches ``start + i, start + i + k, ...``; the
DataLoader hands batches out round-robin from its workers, so the rank sees them in order ``g``.
Workers live for the whole run: the stream crosses epoch boundaries without restarting them.

Resume. The state is the number of batches this rank has handed out (plus the settings that fix
the order). Loading it positions the stream in O(1): nothing consumed is read again, and the
following batches are exactly those an uninterrupted run would have produced, for any number
of workers. A state saved at another world size or micro-batch size (same global batch) is
remapped: ``batches x world_size x batch_size`` sequences were consumed, so the new rank
continues at that position, and no sequence is skipped or read twice. A position that is not
a whole number of the new layout's batches is refused.

Reading. A batch is read with one ``pread`` per sequence straight into the batch buffer (offsets
come from the fixed shard layout, see ``shards``), passed from the worker as raw bytes in the
storage dtype, viewed without a copy and widened to int64 once, into pinned memory when
``pin_memory`` (no separate pinning copy). Memory does not grow
with the dataset: one shard-order array per epoch and the in-shard permutations of the shards
being read.

Checksums. Each shard is hashed (in chunks, ``verify_shard``) and compared with the SHA-256 in
dataset.json by one reader of the job: with R readers (ranks x workers), reader ``i`` owns the shards
``i, i + R, ...`` and hashes them before its first batch. A shard rewritten in place with ids that
are still in range (same size, so the startup check passes) is refused, naming it, instead of being
trained on. The job reads the dataset once more per start this way, spread over all its readers:
every reader opens nearly every shard (the order is a global shuffle), so hashing on each reader's
first open would read the dataset once per reader, ranks x workers times.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import signal
import sys
import tarfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .shards import (SUFFIX, TAR_BLOCK, DatasetError, DatasetMeta, ShardInfo, check_compatible,
                     fingerprint, read_dataset_meta, sequence_offset)

__all__ = ["TokenLoader", "DatasetError", "DatasetMeta", "read_dataset_meta", "check_compatible"]

log = logging.getLogger(__name__)
STATE_VERSION = 2  # 2: ranks interleaved within an epoch (1: contiguous blocks)
HASH_CHUNK = 8 << 20  # bytes per read while hashing a shard: large sequential reads suit Lustre

# Shards this process has hashed and found intact, as (device, inode, expected SHA-256). Kept per
# process, not per reader: a reader is made per iteration and keeps only a few shards open, and a
# hash reads the whole shard. By inode, so a shard replaced under its name is hashed again.
_verified: set[tuple[int, int, str]] = set()


def verify_shard(fd: int, path: Path, expected: str) -> None:
    """Refuse the shard open at ``fd`` unless its SHA-256 is ``expected``; once per process."""
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino, expected)
    if key in _verified:
        return
    sha, buf = hashlib.sha256(), bytearray(HASH_CHUNK)
    view, offset = memoryview(buf), 0
    while n := os.preadv(fd, [buf], offset):
        sha.update(view[:n])
        offset += n
    actual = sha.hexdigest()
    if actual != expected:
        raise DatasetError(f"shard {path}: SHA-256 is {actual}, dataset.json says {expected}: "
                           "its bytes changed after tokenizing. Re-run preprocessing for its source "
                           "(jobs/preprocess.sh) or re-sync the dataset from S3 (`python -m "
                           "data_pipeline.upload restore`); `python -m data_pipeline.validate "
                           f"{path.parent}` lists every bad shard")
    _verified.add(key)
    log.debug("shard %s: SHA-256 verified", path)


class EpochPlan:
    """Maps (epoch, batch) of one rank to (shard, sequence) pairs. Cheap to pickle to workers."""

    def __init__(self, counts: list[int], *, seed: int, rank: int, world_size: int,
                 batch_size: int, global_batch: int = 0):
        self.counts = np.asarray(counts, dtype=np.int64)
        self.seed, self.rank, self.world_size, self.batch_size = seed, rank, world_size, batch_size
        self.stride = world_size * batch_size  # sequences per batch over all ranks
        self.global_batch = global_batch or self.stride
        if self.global_batch % self.stride:
            raise ValueError(f"global batch {self.global_batch} is not a multiple of world_size x batch_size "
                             f"= {world_size} x {batch_size}")
        used = int(self.counts.sum()) // self.global_batch * self.global_batch
        self.batches_per_epoch = used // self.stride
        self._epoch = None
        self._perms: OrderedDict[int, np.ndarray] = OrderedDict()

    def _set_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:
            self._epoch = epoch
            self._order = np.random.default_rng([self.seed, epoch]).permutation(len(self.counts))
            self._ends = np.cumsum(self.counts[self._order])
            self._perms.clear()

    def _in_shard(self, shard: int) -> np.ndarray:
        perm = self._perms.get(shard)
        if perm is None:
            rng = np.random.default_rng([self.seed, self._epoch, shard, 1])
            perm = self._perms[shard] = rng.permutation(int(self.counts[shard]))
            while len(self._perms) > 4:  # a batch spans at most a few shards
                self._perms.popitem(last=False)
        return perm

    def locate(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """Shard indices and in-shard sequence indices of batch ``g`` of this rank."""
        epoch, j = divmod(g, self.batches_per_epoch)
        self._set_epoch(epoch)
        first = j * self.stride + self.rank * self.batch_size
        pos = np.arange(first, first + self.batch_size)
        k = np.searchsorted(self._ends, pos, side="right")
        shards = self._order[k]
        within = pos - (self._ends[k] - self.counts[shards])
        seqs = np.empty_like(within)
        for s in np.unique(shards):
            sel = shards == s
            seqs[sel] = self._in_shard(int(s))[within[sel]]
        return shards, seqs


class ShardReader:
    """Reads sequences from shard files with pread; checks the SHA-256 of the shards it owns on first
    open (all of them, alone) and each member's tar header once."""

    def __init__(self, meta: DatasetMeta, shards: list[ShardInfo], *, reader: int = 0, readers: int = 1):
        self.root, self.shards = meta.path, shards
        self.owned = range(reader, len(shards), readers)  # the shards this reader hashes
        self.files = [s.file for s in shards]
        self.spm, self.sample_bytes = meta.sequences_per_member, meta.sample_bytes
        self.suffix = SUFFIX[meta.dtype]
        self._fds: OrderedDict[int, tuple[int, set]] = OrderedDict()

    def _open(self, shard: int):
        entry = self._fds.get(shard)
        if entry is None:
            path = self.root / self.files[shard]
            fd = os.open(path, os.O_RDONLY)
            if shard in self.owned:
                try:
                    verify_shard(fd, path, self.shards[shard].sha256)
                except Exception:  # a mismatch or a failed read: the descriptor is not ours to keep yet
                    os.close(fd)
                    raise
            entry = self._fds[shard] = (fd, set())
            while len(self._fds) > 8:
                os.close(self._fds.popitem(last=False)[1][0])
        else:
            self._fds.move_to_end(shard)
        return entry

    def _check_member(self, shard: int, fd: int, member: int) -> None:
        name = self.files[shard]
        header = os.pread(fd, TAR_BLOCK, int(sequence_offset(member * self.spm, self.spm,
                                                             self.sample_bytes)) - TAR_BLOCK)
        want = f"{Path(name).name.removesuffix('.tar')}/{member:06d}.tokens.{self.suffix}"
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.TarError as e:
            raise DatasetError(f"shard {self.root / name}: member {member} has a corrupt tar "
                               f"header ({e}); run `python -m data_pipeline.validate "
                               f"{self.root}`") from None
        if info.name != want:
            raise DatasetError(f"shard {self.root / name}: member {member} is {info.name!r}, "
                               f"expected {want!r} (corrupt or not built with this dataset.json)")

    def read(self, shards: np.ndarray, seqs: np.ndarray, out: np.ndarray) -> None:
        for i, (shard, seq) in enumerate(zip(shards.tolist(), seqs.tolist())):
            fd, checked = self._open(shard)
            member = seq // self.spm
            if member not in checked:
                self._check_member(shard, fd, member)
                checked.add(member)
            offset = int(sequence_offset(seq, self.spm, self.sample_bytes))
            n = os.preadv(fd, [memoryview(out[i]).cast("B")], offset)
            if n != self.sample_bytes:
                raise DatasetError(f"shard {self.root / self.files[shard]}: short read at byte "
                                   f"{offset} (truncated after the loader started?)")

    def verify_owned(self) -> None:
        """Hash every shard this reader owns (the others' owners hash theirs)."""
        for shard in self.owned:
            self._open(shard)

    def close(self) -> None:
        for fd, _ in self._fds.values():
            os.close(fd)
        self._fds.clear()


class _BatchStream(IterableDataset):
    """Endless stream of this rank's batches from ``start``, split round-robin across workers."""

    def __init__(self, meta: DatasetMeta, shards: list[ShardInfo], plan: EpochPlan, start: int):
        self.meta, self.shards, self.plan, self.start = meta, shards, plan, start

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        reader = ShardReader(self.meta, self.shards, reader=self.plan.rank * workers + worker,
                             readers=self.plan.world_size * workers)
        buf_shape = (self.plan.batch_size, self.meta.sample_tokens)
        vocab = self.meta.vocab_size
        try:
            reader.verify_owned()
            g = self.start + worker
            while True:
                shards, seqs = self.plan.locate(g)
                tokens = np.empty(buf_shape, dtype=self.meta.np_dtype)
                reader.read(shards, seqs, tokens)
                top = int(tokens.max())
                if top >= vocab:
                    bad = sorted({reader.files[s] for s, row in zip(shards, tokens) if row.max() >= vocab})
                    raise DatasetError(f"token id {top} >= vocab_size {vocab} in shard(s) {bad} "
                                       f"of {self.meta.path}: corrupt data")
                # Plain bytes cross the worker pipe in one copy; tensors would each need a
                # shared-memory segment, several times slower for batches this size.
                yield tokens.tobytes()
                g += workers
        except DatasetError as exc:
            # Handed over as a value: raised here, torch would re-raise it in the training process
            # with this worker's traceback as its message, and that message is the job's failure reason.
            yield exc
        finally:
            reader.close()


WORKER_SIGTERM_GRACE_S = 30


PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def _init_worker(worker_id: int) -> None:
    """Workers outlive a SIGTERM (scancel, the time limit; Slurm signals every process of the step)
    for a while: torch makes it kill them at once, and the trainer would then die on its next batch
    instead of finishing the step and saving. They still end: SIGALRM's default action, 30 s later.
    And they die with the trainer (Linux's parent-death signal): a trainer that fails leaves with
    ``os._exit``, and torch's own check of the parent, every 5 s, kept the node's launcher waiting that long
    before it could report the failure and the job relaunch the step (docs/training.md)."""
    trainer = os.getppid()
    signal.signal(signal.SIGTERM, lambda signum, frame: signal.alarm(WORKER_SIGTERM_GRACE_S))
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != trainer:  # the trainer died before the call: do not outlive it
            os._exit(1)


class TokenLoader:
    """Endless, deterministic, resumable loader of ``batch_size`` x ``seq_len`` token batches."""

    def __init__(self, path, *, batch_size: int, seq_len: int, rank: int = 0, world_size: int = 1,
                 num_workers: int = 2, seed: int = 0, pin_memory: bool = False,
                 prefetch_factor: int = 4, vocab_size: int | None = None,
                 skip_bad_shards: bool = False, timeout_s: float = 0, global_batch_size: int = 0):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in [0, world_size={world_size})")
        if batch_size < 1 or num_workers < 0:
            raise ValueError(f"batch_size must be >= 1 (got {batch_size}), num_workers >= 0 "
                             f"(got {num_workers})")
        self.meta = read_dataset_meta(path)
        check_compatible(self.meta, seq_len=seq_len, vocab_size=vocab_size)
        self.skipped_shards = self._check_shards(skip_bad_shards)
        shards = [s for s in self.meta.shards if s.file not in self.skipped_shards]
        self._shards = shards
        self.plan = EpochPlan([s.sequences for s in shards], seed=seed, rank=rank,
                              world_size=world_size, batch_size=batch_size, global_batch=global_batch_size)
        if self.plan.batches_per_epoch < 1:
            raise DatasetError(f"dataset {self.meta.path} has {self.plan.counts.sum()} sequences, "
                               f"fewer than one global batch ({self.plan.global_batch})")
        self.rank, self.world_size, self.batch_size, self.seed = rank, world_size, batch_size, seed
        self.num_workers, self.pin_memory, self.prefetch_factor = num_workers, pin_memory, prefetch_factor
        # With workers: a batch that takes longer than this (a stalled file system read) raises in
        # the training loop instead of waiting silently; 0 waits forever.
        self.timeout_s = timeout_s
        self._fingerprint = fingerprint(shards)
        self._next = 0  # batches handed out by this rank so far, across epochs

    def _check_shards(self, skip: bool) -> list[str]:
        """Cheap startup check (exists, size); full checks are `python -m data_pipeline.validate`."""
        bad = {}
        for s in self.meta.shards:
            try:
                size = (self.meta.path / s.file).stat().st_size
            except FileNotFoundError:
                bad[s.file] = "missing"
                continue
            if size != s.bytes:
                bad[s.file] = f"{size} bytes, dataset.json says {s.bytes} (truncated or rewritten)"
        if bad and not skip:
            detail = "; ".join(f"{k}: {v}" for k, v in list(bad.items())[:5])
            raise DatasetError(f"{len(bad)} bad shard(s) in {self.meta.path}: {detail}. Run "
                               f"`python -m data_pipeline.validate {self.meta.path}`, rebuild them, "
                               f"or pass skip_bad_shards=True to train without them")
        for name, why in bad.items():
            log.warning("skipping shard %s: %s", name, why)
        return sorted(bad)

    @property
    def batches_per_epoch(self) -> int:
        return self.plan.batches_per_epoch

    @property
    def epoch(self) -> int:
        """Epoch of the next batch."""
        return self._next // self.plan.batches_per_epoch

    def __iter__(self):
        stream = _BatchStream(self.meta, self._shards, self.plan, self._next)
        extra = {"prefetch_factor": self.prefetch_factor, "timeout": self.timeout_s,
                 "worker_init_fn": _init_worker} if self.num_workers else {}
        loader = DataLoader(stream, batch_size=None, num_workers=self.num_workers, **extra)
        shape = (self.batch_size, self.meta.sample_tokens)
        for raw in loader:
            if isinstance(raw, DatasetError):
                raise raw
            tokens = np.frombuffer(raw, self.meta.np_dtype).reshape(shape)
            batch = {"input_ids": self._widen(tokens[:, :-1]), "labels": self._widen(tokens[:, 1:])}
            self._next += 1
            yield batch

    def _widen(self, ids: np.ndarray) -> torch.Tensor:
        """int64 copy of ``ids``, written straight into pinned memory when pinning."""
        out = torch.empty(ids.shape, dtype=torch.int64, pin_memory=self.pin_memory)
        out.numpy()[:] = ids
        return out

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "batches": self._next, "seed": self.seed,
                "world_size": self.world_size, "batch_size": self.batch_size,
                "global_batch": self.plan.global_batch, "seq_len": self.meta.seq_len,
                "dataset": self._fingerprint}

    def load_state_dict(self, state: dict) -> None:
        """Continue after ``state["batches"]`` batches; refuse a state from a different setup."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')!r}, "
                             f"expected {STATE_VERSION}")
        mine = self.state_dict()
        diff = [f"{k}: checkpoint {state.get(k)!r}, now {mine[k]!r}"
                for k in ("seed", "global_batch", "seq_len", "dataset")
                if state.get(k) != mine[k]]
        if diff:
            raise ValueError("cannot resume the data loader, the data order would change: "
                             + "; ".join(diff))
        consumed = int(state["batches"]) * state["world_size"] * state["batch_size"]
        if consumed % self.plan.stride:
            raise ValueError(f"cannot resume the data loader: {consumed} sequences were consumed, not a whole "
                             f"number of batches of world_size x batch_size = {self.world_size} x "
                             f"{self.batch_size}; resume with the saved layout ({state['world_size']} x "
                             f"{state['batch_size']})")
        self._next = consumed // self.plan.stride

