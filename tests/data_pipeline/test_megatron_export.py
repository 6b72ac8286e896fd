"""Megatron export: the .bin/.idx pair read back by megatron-core's own IndexedDataset."""

import json
import tarfile
from pathlib import Path

import warnings

import numpy as np
import pytest

with warnings.catch_warnings():  # megatron-core warns at import that Apex/TE are absent (CPU)
    warnings.simplefilter("ignore")
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder)
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import DType, IndexedDataset

from data_pipeline.megatron_export import export, main, megatron_dtype
from data_pipeline.shards import DatasetMeta, write_json_atomic, write_shard
from data_pipeline.tokenizer import load_tokenizer

from dp_helpers import record_shard_checksums, run_module


def shard_tokens(path: Path, dtype) -> np.ndarray:
    """A shard's tokens read with plain tarfile (independent of the loader's reader)."""
    with tarfile.open(path) as tar:
        return np.concatenate([np.frombuffer(tar.extractfile(m).read(), dtype) for m in tar])


def make_dataset(root: Path, docs_per_shard, *, vocab_size: int, eos_id: int, seq_len: int = 7,
                 spm: int = 2) -> DatasetMeta:
    """A dataset whose documents are known exactly: each shard packs its documents (+ EOS) into
    rows of seq_len + 1 and drops the tail that does not fill a row, as tokenize does."""
    root.mkdir()
    dtype = np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")
    shards = []
    for k, docs in enumerate(docs_per_shard):
        flat = np.concatenate([np.append(d, eos_id) for d in docs]).astype(dtype)
        n = len(flat) // (seq_len + 1)
        shards.append(write_shard(root / f"src-{k:05d}.tar",
                                  flat[:n * (seq_len + 1)].reshape(n, seq_len + 1),
                                  sequences_per_member=spm))
    meta = DatasetMeta(path=root, seq_len=seq_len, dtype=dtype.name, vocab_size=vocab_size,
                       eos_id=eos_id, tokenizer={"name": "synthetic", "sha256": "0"},
                       sequences_per_member=spm, shards=tuple(shards))
    write_json_atomic(root / "dataset.json", meta.to_json())
    return meta


def test_export_of_tokenized_dataset_reads_back_in_megatron(dp_dataset, dp_sample, tmp_path):
    meta = dp_dataset
    summary = export(meta.path, tmp_path / "out" / "wiki.v1_text_document", chunk_tokens=300)
    ds = IndexedDataset(str(tmp_path / "out" / "wiki.v1_text_document"))

    # 512-id vocabulary: uint16, Megatron's smallest dtype above uint8.
    assert ds.index.dtype is np.uint16 and summary["dtype_code"] == DType.uint16.value
    # One document per sequence, as GPTDataset expects.
    assert len(ds) == summary["documents"] and list(ds.document_indices) == list(range(len(ds) + 1))

    # Same tokens in the same order as the shards.
    source = np.concatenate([shard_tokens(meta.path / s.file, meta.np_dtype) for s in meta.shards])
    exported = np.concatenate(ds[0:len(ds)])
    assert exported.dtype == np.uint16 and np.array_equal(exported, source)
    assert summary["tokens"] == len(source) == meta.total_tokens

    # Each document ends at its EOS; only a shard's last one may lack it (cut by the shard end).
    eos = meta.eos_id
    lacking = sum(1 for i in range(len(ds)) if ds[i][-1] != eos)
    assert 0 < lacking <= len(meta.shards)
    assert all(np.count_nonzero(ds[i][:-1] == eos) == 0 for i in range(len(ds)))

    # The first documents are the first lines of the first shard's source file, tokenized.
    files, tok_dir = dp_sample
    src = next(f for f in files if f.stem == meta.shards[0].file.rsplit("-", 1)[0])
    lines = [ln for ln in src.read_text().splitlines() if ln.strip()][:5]
    tok = load_tokenizer(str(tok_dir))
    for i, enc in enumerate(tok.backend.encode_batch_fast(lines, add_special_tokens=False)):
        assert list(ds[i]) == enc.ids + [eos]
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_large_vocab_exports_int32_with_exact_documents(tmp_path):
    rng = np.random.default_rng(0)
    eos = 69_999
    docs = [[rng.integers(0, eos, n) for n in (3, 20, 1, 9)],  # 37 tokens -> 4 rows, 5 dropped
            [rng.integers(0, eos, n) for n in (15, 0, 2, 9)]]  # 30 -> 3 rows; EOS-only doc
    meta = make_dataset(tmp_path / "ds", docs, vocab_size=70_000, eos_id=eos)
    assert meta.dtype == "uint32"
    export(meta.path, tmp_path / "m")
    ds = IndexedDataset(str(tmp_path / "m"))
    assert ds.index.dtype is np.int32

    expected = []
    for shard_docs in docs:
        flat = np.concatenate([np.append(d, eos) for d in shard_docs])
        kept = len(flat) // 8 * 8
        ends = [e for e in np.flatnonzero(flat[:kept] == eos) + 1]
        expected += np.split(flat[:kept], ends)[:len(ends) + (ends[-1] < kept)]
    assert [list(ds[i]) for i in range(len(ds))] == [list(e) for e in expected]
    assert [len(e) for e in expected] == [4, 21, 2, 5, 16, 1, 3, 4]  # last of each shard is cut


class _Tokenizer:
    """The tokenizer fields GPTDataset reads (EOD id, padding id, identity for its cache)."""
    eod, pad, vocab_size, unique_identifiers = 0, -1, 100, {"class": "synthetic"}


def test_gpt_dataset_trains_on_export(tmp_path):
    """Megatron's GPTDataset splits the export by our documents and samples across EOS."""
    rng = np.random.default_rng(1)
    docs = [[rng.integers(1, 100, rng.integers(5, 40)) for _ in range(150)] for _ in range(2)]
    meta = make_dataset(tmp_path / "ds", docs, vocab_size=100, eos_id=0, seq_len=16, spm=4)
    export(meta.path, tmp_path / "m")
    documents = IndexedDataset(str(tmp_path / "m"))
    assert documents.index.dtype is np.uint8  # 100 ids: Megatron's smallest dtype
    cfg = GPTDatasetConfig(random_seed=1, sequence_length=16, blend=([str(tmp_path / "m")], None),
                           split="90,10,0", tokenizer=_Tokenizer(), reset_position_ids=True,
                           reset_attention_mask=False, eod_mask_loss=False,
                           path_to_cache=str(tmp_path / "cache"))
    builder = BlendedMegatronDatasetBuilder(GPTDataset, [40, 5, 0], lambda: True, cfg)
    train, valid, _ = builder.build()

    # The split is by exported document: disjoint, and together every document.
    assert not set(train.indices) & set(valid.indices)
    assert sorted([*train.indices, *valid.indices]) == list(range(len(documents)))
    train_docs = {tuple(documents[int(i)]) for i in train.indices}
    for k in range(len(train)):
        sample = train[k]
        tokens, labels = sample["tokens"].numpy(), sample["labels"].numpy()
        assert np.array_equal(labels[:-1], tokens[1:])
        window = np.append(tokens, labels[-1])
        # A document wholly inside the window (between two EOS) is one of the train split's.
        ends = np.flatnonzero(window == 0)
        for a, b in zip(ends[:-1], ends[1:]):
            assert tuple(window[a + 1:b + 1]) in train_docs
        # Positions restart after each EOS: Megatron sees our document ends.
        restart = np.flatnonzero(sample["position_ids"].numpy()[1:] == 0) + 1
        assert np.array_equal(restart, np.flatnonzero(tokens[:-1] == 0) + 1)


@pytest.mark.parametrize("vocab, dtype, code", [(256, "uint8", 1), (257, "uint16", 8),
                                                (65_536, "uint16", 8), (65_537, "int32", 4),
                                                (128_256, "int32", 4)])
def test_smallest_megatron_dtype(vocab, dtype, code):
    got, got_code = megatron_dtype(vocab)
    assert (got.name, got_code) == (dtype, code)
    assert DType.code_from_dtype(getattr(np, dtype)) == code  # Megatron's own codes


def test_missing_dataset_is_one_line_error(tmp_path):
    r = run_module("data_pipeline.megatron_export", tmp_path / "nope", tmp_path / "out")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"error: no dataset.json in {tmp_path / 'nope'}")
    assert not (tmp_path / "out.bin").exists()


def test_dtype_megatron_cannot_hold_is_refused(tmp_path, capsys):
    meta = make_dataset(tmp_path / "ds", [[np.arange(5)]], vocab_size=70_000, eos_id=7)
    raw = json.loads((meta.path / "dataset.json").read_text())
    write_json_atomic(meta.path / "dataset.json", {**raw, "vocab_size": 2**31 + 1})
    assert main([str(meta.path), str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err == ("error: vocab_size 2147483649 does not fit int32, the "
                                       "widest token dtype of Megatron's indexed dataset (at "
                                       "most 2147483648 ids)\n")
    write_json_atomic(meta.path / "dataset.json", {**raw, "dtype": "float32"})
    assert main([str(meta.path), str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dtype 'float32' not one of ['uint16', 'uint32']" in err
    assert list(tmp_path.glob("m*")) == []


def test_failed_export_keeps_previous_pair(tmp_path, capsys):
    docs = [[np.arange(1, 30)], [np.arange(1, 30)]]
    meta = make_dataset(tmp_path / "ds", docs, vocab_size=100, eos_id=0)
    export(meta.path, tmp_path / "m")
    before = {p.name: p.read_bytes() for p in tmp_path.glob("m.*")}

    # A bad id in the last shard fails mid-stream, after the first shard was written.
    last = meta.path / meta.shards[-1].file
    data = bytearray(last.read_bytes())
    data[512:514] = (200).to_bytes(2, "little")
    last.write_bytes(data)
    record_shard_checksums(meta.path)
    assert main([str(meta.path), str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err == (f"error: token id 200 >= vocab_size 100 in shard {last}: "
                                       "corrupt data\n")
    # A truncated shard is refused before anything is written.
    last.write_bytes(data[:-1024])
    assert main([str(meta.path), str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: shard {last}: ") and "dataset.json says" in err
    assert {p.name: p.read_bytes() for p in tmp_path.glob("m*")} == before
