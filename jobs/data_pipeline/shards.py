"""The packed-token shard format (version ``packed-tokens/1``).

A dataset is one folder::

    dataset.json                     the dataset: settings, tokenizer identity, shard list, totals
    <source>-<nnnnn>.tar             WebDataset tar shards (plain, uncompressed USTAR)
    <source>-<nnnnn>.idx.json        one small index per shard (counts, size, SHA-256, member offsets)
    <source>.done.json               per-source completion marker written by the tokenize task

Every sample is a fixed-length sequence of ``seq_len + 1`` token ids (inputs are the first
``seq_len``, labels the last ``seq_len``). Documents are packed back to back, each followed by
``eos_id``; there is no padding anywhere. Token ids are stored little-endian as ``uint16`` when the
vocabulary fits (``vocab_size <= 65536``), else ``uint32``.

A shard holds many members; each member holds ``sequences_per_member`` whole sequences (the last
member of a shard may hold fewer) as one raw array, named ``<shard>/<mmmmmm>.tokens.u16`` (or
``.u32``). Many tokens per member keep the 512-byte tar header negligible (about 2.0 bytes per
token for uint16). Because every member but the last has the same size, the byte offset of any
sequence follows from ``sequences_per_member`` alone::

    stride = 512 + round_up(sequences_per_member * (seq_len + 1) * itemsize, 512)
    offset(s) = (s // spm) * stride + 512 + (s % spm) * (seq_len + 1) * itemsize

which is how the loader reads any sequence with one ``pread`` and no scan. Shards stay ordinary
WebDataset tars: ``webdataset.WebDataset(url)`` yields one sample per member with the raw bytes
under ``tokens.u16``.

``dataset.json`` keys: format, seq_len, sample_tokens (= seq_len + 1), dtype, vocab_size, eos_id,
tokenizer {name, sha256}, sequences_per_member, shards [{file, sequences, tokens, bytes, sha256}],
total_sequences, total_tokens, sources [{file, documents, tokens, dropped_tokens, replaced_bytes,
shards}].

Shards and indexes are written to a temporary name and renamed into place, so a file with its
final name is complete; a shard counts as finished once its index exists and the tar's size
matches it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from atomic_file import atomic_open, write_atomic

FORMAT = "packed-tokens/1"
META_FILE = "dataset.json"
TAR_BLOCK = 512
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
SUFFIX = {"uint16": "u16", "uint32": "u32"}


class DatasetError(ValueError):
    """A dataset folder is missing, malformed, or does not fit the training settings."""


def token_dtype_name(vocab_size: int) -> str:
    """Smallest storage dtype that holds every id of a vocabulary of this size."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def round_up(n: int, block: int = TAR_BLOCK) -> int:
    return -(-n // block) * block


def member_stride(sequences_per_member: int, sample_bytes: int) -> int:
    return TAR_BLOCK + round_up(sequences_per_member * sample_bytes)


def sequence_offset(s: int | np.ndarray, sequences_per_member: int, sample_bytes: int):
    """Byte offset in a shard of sequence ``s`` (scalar or array)."""
    stride = member_stride(sequences_per_member, sample_bytes)
    return (s // sequences_per_member) * stride + TAR_BLOCK + (s % sequences_per_member) * sample_bytes


def shard_size(sequences: int, sequences_per_member: int, sample_bytes: int) -> int:
    """Exact byte size of a shard holding ``sequences`` sequences (two zero blocks end the tar)."""
    full, last = divmod(sequences, sequences_per_member)
    size = full * member_stride(sequences_per_member, sample_bytes)
    if last:
        size += member_stride(last, sample_bytes)
    return size + 2 * TAR_BLOCK


@dataclass(frozen=True)
class ShardInfo:
    file: str
    sequences: int
    tokens: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class DatasetMeta:
    path: Path
    seq_len: int
    dtype: str
    vocab_size: int
    eos_id: int
    tokenizer: dict
    sequences_per_member: int
    shards: tuple[ShardInfo, ...]
    sources: tuple[dict, ...] = field(default=())

    @property
    def sample_tokens(self) -> int:
        return self.seq_len + 1

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def sample_bytes(self) -> int:
        return self.sample_tokens * self.np_dtype.itemsize

    @property
    def total_sequences(self) -> int:
        return sum(s.sequences for s in self.shards)

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "seq_len": self.seq_len,
            "sample_tokens": self.sample_tokens,
            "dtype": self.dtype,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "tokenizer": self.tokenizer,
            "sequences_per_member": self.sequences_per_member,
            "shards": [asdict(s) for s in self.shards],
            "total_sequences": self.total_sequences,
            "total_tokens": self.total_tokens,
            "sources": list(self.sources),
        }


def fingerprint(shards) -> str:
    """Identifies exact data (shard names and checksums, in order); stored in loader state."""
    h = hashlib.sha256()
    for s in shards:
        h.update(f"{s.file}:{s.sha256}\n".encode())
    return h.hexdigest()[:16]


def read_dataset_meta(path: str | os.PathLike) -> DatasetMeta:
    """Read ``<path>/dataset.json``; raise DatasetError saying what is wrong and how to fix it."""
    path = Path(path)
    meta_file = path / META_FILE
    if not meta_file.is_file():
        hint = ""
        if path.is_dir() and any(path.glob("*.idx.json")):
            hint = (" (shard indexes exist: the tokenize array may be unfinished; run "
                    f"`python -m data_pipeline.tokenize finalize {path}` once all tasks are done)")
        raise DatasetError(f"no {META_FILE} in {path}{hint} — build the dataset with "
                           "`sbatch jobs/preprocess.sh` or `python -m data_pipeline.tokenize`")
    # dataset.json is written by the tokenize job from the shard indexes: rewriting it is the fix.
    fix = (f"rewrite it from the shard indexes with `python -m data_pipeline.tokenize finalize {path}`, "
           "or re-run preprocessing (jobs/preprocess.sh)")

    def field(obj: dict, key: str, kind: type, where: str = "", minimum: int = 0):
        """``obj[key]``, refused naming the file and the field when it is missing or of another kind."""
        if key not in obj:
            raise DatasetError(f"{meta_file}: field {where}{key} is missing — {fix}")
        value = obj[key]
        # Exact types: JSON's true is an int to Python, and int() would cut 2048.5 to 2048 silently.
        if type(value) is not kind or (kind is int and value < minimum):
            what = _KIND_NAMES[kind] + (f" >= {minimum}" if kind is int else "")
            raise DatasetError(f"{meta_file}: field {where}{key} is {value!r}, not {what} — {fix}")
        return value

    try:
        raw = json.loads(meta_file.read_text())
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise DatasetError(f"{meta_file} is unreadable ({type(e).__name__}: {e}) — {fix}") from None
    if type(raw) is not dict:
        raise DatasetError(f"{meta_file} holds {type(raw).__name__}, not a JSON object — {fix}")
    if raw.get("format") != FORMAT:
        raise DatasetError(f"{meta_file}: format {raw.get('format')!r}, expected {FORMAT!r}")
    if raw.get("dtype") not in DTYPES:
        raise DatasetError(f"{meta_file}: dtype {raw.get('dtype')!r} not one of {sorted(DTYPES)}")
    shards = []
    for i, entry in enumerate(field(raw, "shards", list)):
        if type(entry) is not dict:
            raise DatasetError(f"{meta_file}: field shards[{i}] is {entry!r}, not an object — {fix}")
        shards.append(ShardInfo(**{key: field(entry, key, kind, f"shards[{i}].")
                                   for key, kind in _SHARD_FIELDS.items()}))
    return DatasetMeta(
        path=path,
        seq_len=field(raw, "seq_len", int, minimum=1),
        dtype=raw["dtype"],
        vocab_size=field(raw, "vocab_size", int, minimum=1),
        eos_id=field(raw, "eos_id", int),
        tokenizer=field(raw, "tokenizer", dict),
        sequences_per_member=field(raw, "sequences_per_member", int, minimum=1),
        shards=tuple(shards),
        sources=tuple(raw.get("sources", ())),
    )


_SHARD_FIELDS = {"file": str, "sequences": int, "tokens": int, "bytes": int, "sha256": str}
_KIND_NAMES = {int: "an integer", str: "a string", dict: "an object", list: "a list"}


def check_compatible(meta: DatasetMeta, *, seq_len: int, vocab_size: int | None = None,
                     dtype: str | None = None) -> None:
    """Refuse a dataset that does not fit the training settings, naming both values."""
    problems = []
    if meta.seq_len != seq_len:
        problems.append(f"seq_len: dataset has {meta.seq_len}, training config has {seq_len} "
                        f"(re-tokenize with --seq-len {seq_len} or set seq_len={meta.seq_len})")
    if vocab_size is not None and vocab_size < meta.vocab_size:
        problems.append(f"vocab_size: dataset tokenizer has {meta.vocab_size} ids, model has "
                        f"{vocab_size} (model vocab_size must be >= {meta.vocab_size})")
    if dtype is not None and dtype != meta.dtype:
        problems.append(f"dtype: dataset stores {meta.dtype}, training config expects {dtype}")
    if problems:
        raise DatasetError(f"dataset {meta.path} does not match the training config: "
                           + "; ".join(problems))


def write_json_atomic(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=1))


def write_shard(path: Path, sequences: np.ndarray, *, sequences_per_member: int,
                extra_index: dict | None = None) -> ShardInfo:
    """Write ``sequences`` ([n, seq_len + 1], storage dtype) as a shard + its index, atomically."""
    n, sample_tokens = sequences.shape
    dtype_name = sequences.dtype.name
    if dtype_name not in DTYPES:
        raise ValueError(f"token dtype {dtype_name} not one of {sorted(DTYPES)}")
    data = np.ascontiguousarray(sequences, dtype=DTYPES[dtype_name])
    sample_bytes = sample_tokens * data.itemsize
    stem = path.name.removesuffix(".tar")
    sha = hashlib.sha256()
    with atomic_open(path, "wb") as f:
        def put(buf):
            sha.update(buf)
            f.write(buf)

        for m, start in enumerate(range(0, n, sequences_per_member)):
            chunk = data[start:start + sequences_per_member]
            info = tarfile.TarInfo(f"{stem}/{m:06d}.tokens.{SUFFIX[dtype_name]}")
            info.size, info.mode, info.mtime = chunk.nbytes, 0o644, 0
            put(info.tobuf(format=tarfile.USTAR_FORMAT))
            put(memoryview(chunk).cast("B"))
            put(bytes(round_up(chunk.nbytes) - chunk.nbytes))
        put(bytes(2 * TAR_BLOCK))
    size = path.stat().st_size
    assert size == shard_size(n, sequences_per_member, sample_bytes), "shard layout drifted"
    shard = ShardInfo(file=path.name, sequences=n, tokens=n * sample_tokens, bytes=size,
                      sha256=sha.hexdigest())
    index = {"format": FORMAT, **asdict(shard), "seq_len": sample_tokens - 1, "dtype": dtype_name,
             "sequences_per_member": sequences_per_member, **(extra_index or {})}
    write_json_atomic(index_path(path), index)
    return shard


def index_path(shard_path: Path) -> Path:
    return shard_path.with_name(shard_path.name.removesuffix(".tar") + ".idx.json")


def read_index(shard_path: Path) -> dict | None:
    """The shard's index if the shard is finished (index present, tar size matches), else None."""
    try:
        index = json.loads(index_path(shard_path).read_text())
        if shard_path.stat().st_size == index["bytes"]:
            return index
    except (OSError, ValueError, KeyError):
        pass
    return None
