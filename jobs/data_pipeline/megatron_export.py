"""Export a packed-token dataset as a Megatron-LM indexed dataset: ``<prefix>.bin`` + ``.idx``.

    python -m data_pipeline.megatron_export /fsx/data/wiki-2048 \\
        /fsx/data/megatron/wiki_text_document

Megatron-LM then trains on it with ``--data-path /fsx/data/megatron/wiki_text_document``.

Documents. Each source document becomes one Megatron sequence ending in its EOS, and each sequence
is its own document (document indices 0, 1, ..., n): the layout Megatron's own
``tools/preprocess_data.py --append-eod`` writes, and the one ``GPTDataset`` expects. GPTDataset
splits train/valid/test by sequence and shuffles sequences before concatenating them into samples
of ``seq_length + 1`` tokens; exporting the packed ``seq_len + 1`` rows as sequences instead would
make it shuffle arbitrary cuts and could split one document between train and valid. The packed
shards are cut back into documents at EOS. A shard starts at a document start, but packing dropped
the tail that did not fill a sequence at its end, so a shard's last document is usually cut short:
it is exported as a document without EOS. The tokens are exactly the shards' tokens, in
``dataset.json`` order.

Format (Megatron's ``MMIDIDX`` index, version 1; all little-endian)::

    <prefix>.bin   every token, back to back, in the token dtype
    <prefix>.idx   b"MMIDIDX\\0\\0", u64 version 1, u8 dtype code, u64 sequence count n,
                   u64 document count n + 1, i32 lengths[n], i64 byte pointers[n],
                   i64 document indices[n + 1]

The token dtype is the smallest of Megatron's ``DType`` codes that holds every id: uint8 (code 1)
up to 256 ids, uint16 (code 8) up to 65,536, else int32 (code 4); Megatron has no uint32.

Streaming. Shards are read in chunks of whole sequences with the loader's ``ShardReader`` (which
refuses a shard whose SHA-256 differs from dataset.json's) and written straight to the ``.bin``; the document lengths go to a spill file, from which the ``.idx``
is assembled in chunks, so memory does not grow with the dataset. Both files are written under
temporary names and renamed into place, ``.idx`` last (after removing an old one): a prefix whose
``.idx`` exists has a complete pair. A failed export leaves the previous pair untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

from atomic_file import temporary_name
from cli import ArgumentParser, fail

from .loader import ShardReader
from .shards import DatasetError, DatasetMeta, read_dataset_meta

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# (ids that fit, numpy dtype, Megatron DType code), smallest first.
MEGATRON_DTYPES = ((2**8, np.dtype("u1"), 1), (2**16, np.dtype("<u2"), 8),
                   (2**31, np.dtype("<i4"), 4))
CHUNK_TOKENS = 4 << 20  # tokens per read and per index block: 8-16 MiB of memory


def megatron_dtype(vocab_size: int) -> tuple[np.dtype, int]:
    """Smallest Megatron token dtype (and its DType code) that holds ids 0 .. vocab_size - 1."""
    for limit, dtype, code in MEGATRON_DTYPES:
        if vocab_size <= limit:
            return dtype, code
    raise DatasetError(f"vocab_size {vocab_size} does not fit int32, the widest token dtype of "
                       f"Megatron's indexed dataset (at most {2**31} ids)")


def _check_shards(meta: DatasetMeta) -> None:
    """Fail before writing anything if a shard is missing or has the wrong size."""
    for s in meta.shards:
        path = meta.path / s.file
        size = path.stat().st_size if path.is_file() else None
        if size != s.bytes:
            found = "missing" if size is None else f"{size} bytes, dataset.json says {s.bytes}"
            raise DatasetError(f"shard {path}: {found}; run `python -m data_pipeline.validate "
                               f"{meta.path}` and rebuild it")


def _write_tokens(meta: DatasetMeta, out_dtype: np.dtype, bin_f, lengths_f,
                  chunk_tokens: int) -> tuple[int, int]:
    """Write every token to ``bin_f`` and each document's length (int32) to ``lengths_f``."""
    reader = ShardReader(meta, list(meta.shards))
    per_read = max(1, chunk_tokens // meta.sample_tokens)
    documents = tokens = 0
    try:
        for k, shard in enumerate(meta.shards):
            pos = doc_start = 0  # token positions within this shard
            for first in range(0, shard.sequences, per_read):
                seqs = np.arange(first, min(first + per_read, shard.sequences))
                rows = np.empty((len(seqs), meta.sample_tokens), meta.np_dtype)
                reader.read(np.full(len(seqs), k), seqs, rows)
                flat = rows.reshape(-1)
                top = int(flat.max())
                if top >= meta.vocab_size:
                    raise DatasetError(f"token id {top} >= vocab_size {meta.vocab_size} in shard "
                                       f"{meta.path / shard.file}: corrupt data")
                bin_f.write(memoryview(flat.astype(out_dtype, copy=False)).cast("B"))
                ends = pos + np.flatnonzero(flat == meta.eos_id) + 1
                if len(ends):
                    lengths_f.write(np.diff(ends, prepend=doc_start).astype("<i4").tobytes())
                    documents += len(ends)
                    doc_start = int(ends[-1])
                pos += len(flat)
            if pos > doc_start:  # cut short by the shard end: a document without EOS
                lengths_f.write(np.array([pos - doc_start], "<i4").tobytes())
                documents += 1
            tokens += pos
    finally:
        reader.close()
    return documents, tokens


def _write_index(idx_f, lengths_f, *, code: int, itemsize: int, documents: int,
                 chunk: int) -> None:
    idx_f.write(INDEX_HEADER + struct.pack("<QBQQ", INDEX_VERSION, code, documents, documents + 1))
    lengths_f.seek(0)
    shutil.copyfileobj(lengths_f, idx_f)
    lengths_f.seek(0)
    pointer = 0
    while block := lengths_f.read(chunk * 4):
        sizes = np.frombuffer(block, "<i4").astype(np.int64) * itemsize
        ends = pointer + np.cumsum(sizes)
        idx_f.write((ends - sizes).astype("<i8").tobytes())
        pointer = int(ends[-1])
    for start in range(0, documents + 1, chunk):
        idx_f.write(np.arange(start, min(start + chunk, documents + 1), dtype="<i8").tobytes())


def _fsync_close(f) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def export(dataset, prefix, *, chunk_tokens: int = CHUNK_TOKENS) -> dict:
    """Write ``<prefix>.bin`` / ``<prefix>.idx`` from the dataset folder; returns a summary."""
    meta = read_dataset_meta(dataset)
    out_dtype, code = megatron_dtype(meta.vocab_size)
    _check_shards(meta)
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    # Prefixes often hold dots (wiki.v2_text_document): append, never with_suffix.
    bin_path, idx_path = (prefix.with_name(prefix.name + ext) for ext in (".bin", ".idx"))
    # Two files renamed in order (.idx last), so not atomic_open: the same temporary names, by hand.
    bin_tmp, idx_tmp, lengths_tmp = (temporary_name(bin_path), temporary_name(idx_path),
                                     temporary_name(prefix.with_name(prefix.name + ".lengths")))
    try:
        with open(bin_tmp, "wb") as bin_f, open(lengths_tmp, "w+b") as lengths_f:
            documents, tokens = _write_tokens(meta, out_dtype, bin_f, lengths_f, chunk_tokens)
            _fsync_close(bin_f)
            with open(idx_tmp, "wb") as idx_f:
                _write_index(idx_f, lengths_f, code=code, itemsize=out_dtype.itemsize,
                             documents=documents, chunk=chunk_tokens)
                _fsync_close(idx_f)
        idx_path.unlink(missing_ok=True)  # never an old .idx beside a new .bin
        os.replace(bin_tmp, bin_path)
        os.replace(idx_tmp, idx_path)
    finally:
        for tmp in (bin_tmp, idx_tmp, lengths_tmp):
            tmp.unlink(missing_ok=True)
    return {"prefix": str(prefix), "documents": documents, "tokens": tokens,
            "dtype": out_dtype.name, "dtype_code": code, "source_sequences": meta.total_sequences,
            "bin_bytes": bin_path.stat().st_size, "idx_bytes": idx_path.stat().st_size}


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m data_pipeline.megatron_export",
                       description="Export a packed-token dataset as a Megatron-LM indexed dataset "
                                   "(<prefix>.bin + <prefix>.idx).")
    p.add_argument("dataset", help="dataset folder (holding dataset.json)")
    p.add_argument("prefix", help="output path prefix, as given to Megatron's --data-path")
    a = p.parse_args(argv)
    try:
        summary = export(a.dataset, a.prefix)
    except (DatasetError, OSError) as e:
        return fail(e)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
