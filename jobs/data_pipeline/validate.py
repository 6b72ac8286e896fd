"""Check a shard folder end to end: ``python -m data_pipeline.validate DIR [--seq-len N]``.

Every shard listed in dataset.json must exist, match its size and SHA-256, agree with its index,
decode as a tar whose members follow the fixed layout, hold the listed number of sequences, and
contain only ids below vocab_size; the totals must add up. Prints a JSON summary; exits 1 and names
each bad shard (``problem: ...``, one line each) when anything is wrong, 2 when dataset.json itself
is unusable (docs/cli.md). Shows progress while it hashes: a bar on a terminal, a percent/rate/ETA
line every 30 s in logs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from cli import ArgumentParser, fail
from cli.progress import Progress

from .shards import (SUFFIX, DatasetError, DatasetMeta, ShardInfo, check_compatible, index_path,
                     read_dataset_meta, sequence_offset)


class _HashingReader:
    """File wrapper that hashes everything read through it (one pass for tar parse + SHA-256)."""

    def __init__(self, f):
        self.f, self.sha = f, hashlib.sha256()

    def read(self, n=-1):
        data = self.f.read(n)
        self.sha.update(data)
        return data


def check_shard(meta: DatasetMeta, shard: ShardInfo) -> list[str]:
    """Problems with one shard (empty list when it is good)."""
    path = meta.path / shard.file
    if not path.is_file():
        return [f"{shard.file}: missing"]
    problems = []
    size = path.stat().st_size
    if size != shard.bytes:
        problems.append(f"{shard.file}: {size} bytes, dataset.json says {shard.bytes} (truncated?)")
    try:
        index = json.loads(index_path(path).read_text())
        for key in ("sequences", "tokens", "bytes", "sha256"):
            if index[key] != getattr(shard, key):
                problems.append(f"{shard.file}: index {key}={index[key]!r}, dataset.json "
                                f"{getattr(shard, key)!r}")
    except (OSError, ValueError, KeyError) as e:
        problems.append(f"{shard.file}: index {index_path(path).name} unreadable ({e})")
    stem, suffix = path.name.removesuffix(".tar"), SUFFIX[meta.dtype]
    sequences, top = 0, -1
    with open(path, "rb") as f:
        reader = _HashingReader(f)
        try:
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                for m, member in enumerate(tar):
                    want = f"{stem}/{m:06d}.tokens.{suffix}"
                    offset = sequence_offset(m * meta.sequences_per_member,
                                             meta.sequences_per_member, meta.sample_bytes)
                    if member.name != want or member.offset_data != offset:
                        problems.append(f"{shard.file}: member {m} is {member.name!r} at byte "
                                        f"{member.offset_data}, expected {want!r} at {offset}")
                        break
                    data = tar.extractfile(member).read()
                    if len(data) != member.size or member.size % meta.sample_bytes:
                        problems.append(f"{shard.file}: member {m} holds {len(data)} bytes, "
                                        f"not whole sequences of {meta.sample_bytes} bytes")
                        break
                    sequences += member.size // meta.sample_bytes
                    if data:
                        top = max(top, int(np.frombuffer(data, meta.np_dtype).max()))
        except (tarfile.TarError, EOFError, OSError) as e:
            problems.append(f"{shard.file}: does not decode as a tar ({type(e).__name__}: {e})")
        while reader.read(1 << 20):
            pass
    if reader.sha.hexdigest() != shard.sha256:
        problems.append(f"{shard.file}: SHA-256 {reader.sha.hexdigest()[:16]}... does not match "
                        f"dataset.json {shard.sha256[:16]}...")
    if sequences != shard.sequences:
        problems.append(f"{shard.file}: decodes to {sequences} sequences, dataset.json says "
                        f"{shard.sequences}")
    if top >= meta.vocab_size:
        problems.append(f"{shard.file}: token id {top} >= vocab_size {meta.vocab_size}")
    return problems


def validate(path, *, seq_len: int | None = None, vocab_size: int | None = None,
             threads: int | None = None) -> tuple[DatasetMeta, list[str]]:
    """(meta, problems). Raises DatasetError when dataset.json is missing or does not fit."""
    meta = read_dataset_meta(path)
    if seq_len is not None:
        check_compatible(meta, seq_len=seq_len, vocab_size=vocab_size)
    def check(shard: ShardInfo) -> list[str]:
        try:
            return check_shard(meta, shard)
        finally:
            progress.update(shard.bytes)

    with Progress(sum(s.bytes for s in meta.shards), f"validate {meta.path}") as progress, \
            ThreadPoolExecutor(threads or len(os.sched_getaffinity(0))) as pool:
        problems = [p for ps in pool.map(check, meta.shards) for p in ps]
    for shard in meta.shards:
        if shard.tokens != shard.sequences * meta.sample_tokens:
            problems.append(f"{shard.file}: {shard.tokens} tokens is not {shard.sequences} "
                            f"sequences x {meta.sample_tokens}")
    return meta, problems


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m data_pipeline.validate", description=__doc__.splitlines()[0])
    p.add_argument("path", help="dataset folder (holding dataset.json)")
    p.add_argument("--seq-len", type=int, help="also require this seq_len")
    p.add_argument("--vocab-size", type=int, help="also require ids to fit this model vocab")
    a = p.parse_args(argv)
    try:
        meta, problems = validate(a.path, seq_len=a.seq_len, vocab_size=a.vocab_size)
    except DatasetError as e:
        return fail(e)
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    bad = sorted({p.split(":", 1)[0] for p in problems})
    print(json.dumps({"path": str(meta.path), "ok": not problems, "shards": len(meta.shards),
                      "bad_shards": bad, "sequences": meta.total_sequences,
                      "tokens": meta.total_tokens, "seq_len": meta.seq_len, "dtype": meta.dtype}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
