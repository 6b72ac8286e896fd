"""Tokenize raw text files into packed-token shards (see ``shards`` for the format).

One Slurm array task per raw file (``jobs/preprocess.sh``)::

    python -m data_pipeline.tokenize run --input-dir RAW --out DIR --tokenizer TOK --seq-len 2048
        # the task index (--task-index or $SLURM_ARRAY_TASK_ID) picks the file; without one,
        # every file is done in turn
    python -m data_pipeline.tokenize finalize DIR   # write dataset.json (the last task does it)

Each task reads its file in large batches (``--batch-mb``) of whole lines, tokenizes a batch in
one call with the Rust tokenizer on all allotted cores, appends EOS to every document and packs the
ids back to back into sequences of ``seq_len + 1`` tokens. Once a shard's worth (``--shard-mb``)
is buffered it writes the shard (temp + rename) and its index, which records the input byte offset
where the next shard starts; the part of a sequence left over at a shard cut (< seq_len + 1 tokens)
is dropped and counted. A rerun resumes after the last finished shard of its file without
re-reading what came before, and a file whose ``<source>.done.json`` exists is skipped.

Inputs: ``*.txt`` (one document per line) or ``*.jsonl`` (one JSON object per line, document in
``--text-field``). Empty lines are dropped; invalid UTF-8 is replaced with U+FFFD and counted.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np
from cli import ArgumentParser, fail

from .shards import (DTYPES, META_FILE, DatasetMeta, ShardInfo, read_index, token_dtype_name,
                     write_json_atomic, write_shard)
from .tokenizer import LoadedTokenizer, TokenizerError, load_tokenizer

log = logging.getLogger("data_pipeline.tokenize")
INPUT_SUFFIXES = (".txt", ".jsonl")


class TokenizeError(ValueError):
    pass


@dataclass(frozen=True)
class PackSettings:
    seq_len: int
    shard_bytes: int = 256 << 20
    member_bytes: int = 1 << 20
    batch_bytes: int = 4 << 20
    text_field: str = "text"
    log_every: float = 30.0  # seconds between progress lines when not on a terminal


def list_inputs(input_dir) -> list[Path]:
    input_dir = Path(input_dir)
    if not input_dir.is_dir():
        raise TokenizeError(f"input folder {input_dir} does not exist")
    files = sorted(p for p in input_dir.iterdir() if p.suffix in INPUT_SUFFIXES and p.is_file())
    if not files:
        raise TokenizeError(f"no {' or '.join(INPUT_SUFFIXES)} files in {input_dir}")
    stems = [p.stem for p in files]
    if len(set(stems)) != len(stems):
        raise TokenizeError(f"input files in {input_dir} share a name stem: {stems}")
    return files


def _read_batches(path: Path, start: int, batch_bytes: int, jsonl: bool, field: str, stats: dict):
    """Yield (documents, end_offset) for batches of whole lines from byte ``start``.

    A batch is the whole lines within ``batch_bytes`` from its start (or one longer line), so
    batch (and shard) boundaries depend only on the start offset: a resumed run cuts the same.
    """
    with open(path, "rb") as f:
        offset, line_no = start, 0
        while True:
            f.seek(offset)
            data = f.read(batch_bytes)
            cut = data.rfind(b"\n")
            while cut < 0:
                more = f.read(batch_bytes)
                if not more:
                    cut = len(data) - 1  # last line without a newline
                    break
                cut = more.find(b"\n")
                cut = cut + len(data) if cut >= 0 else -1
                data += more
            body = data[:cut + 1]
            if not body:
                return
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                text = body.decode("utf-8", errors="replace")
                stats["replaced_chars"] += text.count("\ufffd") - body.count("\ufffd".encode())
            lines = text.split("\n")
            if jsonl:
                docs = []
                for i, line in enumerate(lines):
                    if line.strip():
                        try:
                            docs.append(json.loads(line)[field])
                        except (ValueError, KeyError, TypeError) as e:
                            where = f" counting from byte {start}" if start else ""
                            raise TokenizeError(f"{path}: line {line_no + i + 1}{where} is not "
                                                f"a JSON object with a {field!r} string "
                                                f"({e})") from None
            else:
                docs = [ln.rstrip("\r") for ln in lines]
            kept = [d for d in docs if d.strip()]
            stats["documents"] += len(kept)
            # split() leaves one "" after the final newline: not a line of the file.
            stats["empty_dropped"] += sum(1 for ln in lines if not ln.strip()) - text.endswith("\n")
            line_no += body.count(b"\n")
            offset += len(body)
            yield kept, offset


def _encode(tok: LoadedTokenizer, docs: list[str], dtype) -> np.ndarray:
    """Token ids of ``docs`` back to back, each followed by EOS."""
    encodings = tok.backend.encode_batch_fast(docs, add_special_tokens=False)
    eos = (tok.eos_id,)
    ids = chain.from_iterable(chain(e.ids, eos) for e in encodings)
    return np.fromiter(ids, dtype=dtype)


class _Progress:
    """tqdm on a terminal; a log line every ``every`` seconds otherwise (Slurm logs)."""

    def __init__(self, total: int, done: int, label: str, every: float = 30.0):
        self.tty = sys.stderr.isatty()
        self.total, self.done, self.label, self.every = total, done, label, every
        self.t0 = self.last = time.monotonic()
        self.start = done
        self.tokens = 0
        if self.tty:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=done, unit="B", unit_scale=True, desc=label)

    def update(self, offset: int, tokens: int) -> None:
        step, self.done = offset - self.done, offset
        self.tokens += tokens
        if self.tty:
            self.bar.update(step)
            return
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            rate = self.tokens / (now - self.t0)
            log.info("%s: %.1f%% (%d/%d bytes), %.0f tokens/s", self.label,
                     100 * self.done / max(self.total, 1), self.done, self.total, rate)

    def close(self) -> None:
        if self.tty:
            self.bar.close()


def _resume_point(src: Path, out_dir: Path, tok_sha: str, settings: PackSettings, dtype: str):
    """Finished shards of ``src`` (a consecutive run from 0) and the counters they carry."""
    shards, counters, offset = [], _new_stats(), 0
    for n in range(1_000_000):
        shard = out_dir / f"{src.stem}-{n:05d}.tar"
        index = read_index(shard)
        if index is None:
            break
        made_with = (index["seq_len"], index["dtype"], index["tokenizer_sha256"])
        if made_with != (settings.seq_len, dtype, tok_sha):
            raise TokenizeError(
                f"{shard} was made with seq_len={index['seq_len']}, dtype={index['dtype']}, "
                f"tokenizer {index['tokenizer_sha256'][:12]}; this run has seq_len="
                f"{settings.seq_len}, dtype={dtype}, tokenizer {tok_sha[:12]}: write to a new "
                "--out folder or delete the old shards")
        shards.append(ShardInfo(**{k: index[k] for k in ShardInfo.__dataclass_fields__}))
        for k in counters:
            counters[k] = index["source"][k]
        offset = index["source"]["byte_end"]
    # Anything of this source beyond the finished run is a leftover of an interrupted task.
    for stale in out_dir.glob(f"{src.stem}-[0-9][0-9][0-9][0-9][0-9].*"):
        if stale.name.endswith(".tmp") or (stale.suffix == ".tar" and stale.name not in
                                           {s.file for s in shards}):
            stale.unlink()
    return shards, counters, offset


def _new_stats() -> dict:
    return {"documents": 0, "empty_dropped": 0, "tokens": 0, "dropped_tokens": 0,
            "replaced_chars": 0}


def tokenize_file(src, tok: LoadedTokenizer, out_dir, settings: PackSettings) -> dict:
    """Tokenize one raw file into ``out_dir/<stem>-NNNNN.tar`` shards; resumable. Returns a summary."""
    src, out_dir = Path(src), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done_file = out_dir / f"{src.stem}.done.json"
    if done_file.is_file():
        summary = json.loads(done_file.read_text())
        if all(read_index(out_dir / s["file"]) for s in summary["shards"]):
            log.info("%s: already done (%s), skipping", src.name, done_file.name)
            return summary
    dtype_name = token_dtype_name(tok.vocab_size)
    dtype = DTYPES[dtype_name]
    sample = settings.seq_len + 1
    spm = max(1, settings.member_bytes // (sample * dtype.itemsize))
    shard_tokens = max(sample, settings.shard_bytes // dtype.itemsize)
    identity = tok.identity
    shards, stats, offset = _resume_point(src, out_dir, identity["sha256"], settings, dtype_name)
    if offset:
        log.info("%s: resuming after %d finished shard(s) at byte %d", src.name, len(shards), offset)
    size = src.stat().st_size
    if size == 0:
        raise TokenizeError(f"{src} is empty")
    progress = _Progress(size, offset, src.name, settings.log_every)
    buffer, buffered, shard_start = [], 0, offset

    def flush(end: int) -> None:
        nonlocal buffer, buffered, shard_start
        flat = np.concatenate(buffer) if buffer else np.empty(0, dtype)
        n = len(flat) // sample
        stats["dropped_tokens"] += len(flat) - n * sample
        if n:
            path = out_dir / f"{src.stem}-{len(shards):05d}.tar"
            extra = {"tokenizer_sha256": identity["sha256"],
                     "source": {"file": src.name, "byte_start": shard_start, "byte_end": end,
                                **stats}}
            shards.append(write_shard(path, flat[:n * sample].reshape(n, sample),
                                      sequences_per_member=spm, extra_index=extra))
        buffer, buffered, shard_start = [], 0, end

    try:
        for docs, end in _read_batches(src, offset, settings.batch_bytes,
                                       src.suffix == ".jsonl", settings.text_field, stats):
            ids = _encode(tok, docs, dtype) if docs else np.empty(0, dtype)
            buffer.append(ids)
            buffered += len(ids)
            stats["tokens"] += len(ids)
            if buffered >= shard_tokens:
                flush(end)
            progress.update(end, len(ids))
        if buffer or not shards:
            flush(size)
    finally:
        progress.close()
    if stats["documents"] == 0 and not shards:
        raise TokenizeError(f"{src} has no non-empty documents")
    if not shards:
        log.warning("%s: %d tokens, fewer than one sequence of %d: no shard written",
                    src.name, stats["tokens"], sample)
    summary = {"source": src.name, **stats, "seq_len": settings.seq_len, "dtype": dtype_name,
               "sequences_per_member": spm, "tokenizer": identity,
               "shards": [s.__dict__ for s in shards]}
    write_json_atomic(done_file, summary)
    log.info("%s: %d documents, %d tokens, %d shards, %d tokens dropped at shard ends, "
             "%d invalid UTF-8 sequences replaced", src.name, stats["documents"], stats["tokens"],
             len(shards), stats["dropped_tokens"], stats["replaced_chars"])
    return summary


def finalize(out_dir, sources: list[str] | None = None) -> DatasetMeta | None:
    """Write dataset.json once every source is done; None (and nothing written) while some are not.

    ``sources``: the input file names expected; default: every ``*.done.json`` present.
    Safe to call from several tasks at once: each writes the same file atomically.
    """
    out_dir = Path(out_dir)
    done = {p.name.removesuffix(".done.json"): json.loads(p.read_text())
            for p in sorted(out_dir.glob("*.done.json"))}
    if not done:
        raise TokenizeError(f"no finished sources (*.done.json) in {out_dir}")
    if sources is not None:
        missing = [s for s in sources if Path(s).stem not in done]
        if missing:
            log.info("dataset.json not written yet: %d source(s) still running (%s)",
                     len(missing), ", ".join(missing[:5]))
            return None
    summaries = [done[k] for k in sorted(done)]
    first = summaries[0]
    for s in summaries[1:]:
        for key in ("seq_len", "dtype", "sequences_per_member"):
            if s[key] != first[key]:
                raise TokenizeError(f"{out_dir}: {s['source']} has {key}={s[key]} but "
                                    f"{first['source']} has {first[key]}")
        if s["tokenizer"]["sha256"] != first["tokenizer"]["sha256"]:
            raise TokenizeError(f"{out_dir}: {s['source']} and {first['source']} were tokenized "
                                "with different tokenizers")
    shards = tuple(ShardInfo(**sh) for s in summaries for sh in s["shards"])
    if not shards:
        raise TokenizeError(f"{out_dir}: no sequences at all; the corpus is smaller than one "
                            f"sequence of seq_len + 1 = {first['seq_len'] + 1} tokens")
    tok = first["tokenizer"]
    meta = DatasetMeta(
        path=out_dir, seq_len=first["seq_len"], dtype=first["dtype"],
        vocab_size=tok["vocab_size"], eos_id=tok["eos_id"],
        tokenizer={"name": tok["name"], "sha256": tok["sha256"]},
        sequences_per_member=first["sequences_per_member"], shards=shards,
        sources=tuple({k: s[k] for k in ("source", "documents", "tokens", "dropped_tokens",
                                         "empty_dropped", "replaced_chars")}
                      | {"shards": len(s["shards"])} for s in summaries))
    write_json_atomic(out_dir / META_FILE, meta.to_json())
    log.info("wrote %s: %d shards, %d sequences, %d tokens", out_dir / META_FILE, len(shards),
             meta.total_sequences, meta.total_tokens)
    return meta


def tokenize_files(files, tokenizer, out_dir, seq_len: int, **settings) -> DatasetMeta:
    """Tokenize ``files`` into ``out_dir`` and write dataset.json (tests, demo, small corpora).

    ``tokenizer``: a LoadedTokenizer or anything ``load_tokenizer`` accepts. ``settings``: the
    other PackSettings fields (shard_bytes, member_bytes, batch_bytes, text_field).
    """
    tok = tokenizer if isinstance(tokenizer, LoadedTokenizer) else load_tokenizer(str(tokenizer))
    pack = PackSettings(seq_len=seq_len, **settings)
    for f in files:
        tokenize_file(f, tok, out_dir, pack)
    return finalize(out_dir, [Path(f).name for f in files])


def _allotted_cores() -> int:
    for var in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return len(os.sched_getaffinity(0))


def _task_index(arg: int | None) -> int | None:
    if arg is not None:
        return arg
    env = os.environ.get("SLURM_ARRAY_TASK_ID")
    return int(env) if env is not None else None


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    p = ArgumentParser(prog="python -m data_pipeline.tokenize", description="Tokenize raw text into packed-token shards.")
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="tokenize one input file (array task) or all of them")
    run.add_argument("--input-dir", required=True, help="folder of *.txt / *.jsonl raw files")
    run.add_argument("--out", required=True, help="dataset folder for the shards")
    run.add_argument("--tokenizer", required=True,
                     help="folder with tokenizer.json, a tokenizer.json file, or a hub model id")
    run.add_argument("--eos-token", help="EOS token string, if the tokenizer config lacks one")
    run.add_argument("--seq-len", type=int, required=True, help="training sequence length")
    run.add_argument("--task-index", type=int,
                     help="which input file (sorted order); default $SLURM_ARRAY_TASK_ID, else all")
    run.add_argument("--shard-mb", type=float, default=256, help="target shard size (MiB)")
    run.add_argument("--member-kb", type=float, default=1024, help="bytes per tar member (KiB)")
    run.add_argument("--batch-mb", type=float, default=4, help="text per tokenizer call (MiB)")
    run.add_argument("--text-field", default="text", help="JSONL field holding the document")
    run.add_argument("--log-every", type=float, default=30,
                     help="seconds between progress lines in logs (no terminal)")
    fin = sub.add_parser("finalize", help="write dataset.json from the finished sources")
    fin.add_argument("out")
    fin.add_argument("--input-dir", help="require every file of this folder to be done")
    a = p.parse_args(argv)
    # The Rust tokenizer sizes its thread pool on first use: match it to the cores Slurm gave us.
    os.environ.setdefault("RAYON_NUM_THREADS", str(_allotted_cores()))
    try:
        if a.cmd == "finalize":
            sources = [f.name for f in list_inputs(a.input_dir)] if a.input_dir else None
            return 0 if finalize(a.out, sources) else 1
        files = list_inputs(a.input_dir)
        task = _task_index(a.task_index)
        if task is not None and not 0 <= task < len(files):
            raise TokenizeError(f"task index {task} out of range: {a.input_dir} has "
                                f"{len(files)} input files (submit with --array=0-{len(files) - 1})")
        tok = load_tokenizer(a.tokenizer, a.eos_token)
        settings = PackSettings(seq_len=a.seq_len, shard_bytes=int(a.shard_mb * 2**20),
                                member_bytes=int(a.member_kb * 2**10),
                                batch_bytes=int(a.batch_mb * 2**20), text_field=a.text_field,
                                log_every=a.log_every)
        log.info("tokenizer %s (vocab %d, eos %d), seq_len %d, %s threads", tok.name,
                 tok.vocab_size, tok.eos_id, a.seq_len, os.environ["RAYON_NUM_THREADS"])
        for f in files if task is None else [files[task]]:
            tokenize_file(f, tok, a.out, settings)
        # Whichever task finishes last sees every source done and writes dataset.json.
        finalize(a.out, [f.name for f in files])
        return 0
    except (TokenizeError, TokenizerError) as e:
        return fail(e)


if __name__ == "__main__":
    sys.exit(main())
