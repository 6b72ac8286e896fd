"""Tokenize: raw text -> packed shards (format, packing, resume, bad input)."""

import json

import numpy as np
import pytest
import webdataset as wds
from tokenizers import Tokenizer, models, pre_tokenizers

from data_pipeline.shards import read_dataset_meta
from data_pipeline.tokenize import TokenizeError, finalize, tokenize_file, tokenize_files, PackSettings
from data_pipeline.tokenizer import TokenizerError, load_tokenizer
from dp_helpers import SEQ_LEN, SMALL, run_module


def shard_tokens(meta, shard):
    """All token ids of one shard, read with plain webdataset (the shards are ordinary tars)."""
    ds = wds.WebDataset(str(meta.path / shard.file), shardshuffle=False)
    parts = [np.frombuffer(s["tokens.u16"], np.uint16) for s in ds]
    return np.concatenate(parts).reshape(-1, meta.sample_tokens)


def test_packs_documents_back_to_back_with_eos_and_no_padding(dp_sample, dp_dataset):
    files, tok_dir = dp_sample
    tok = load_tokenizer(str(tok_dir))
    meta = dp_dataset
    assert (meta.dtype, meta.seq_len, meta.eos_id, meta.vocab_size) == ("uint16", SEQ_LEN, tok.eos_id, 512)
    raw = files[0].read_bytes()
    shards = [s for s in meta.shards if s.file.startswith(files[0].stem + "-")]
    assert len(shards) > 1
    for shard in shards:
        # A shard holds the documents of one byte range of its source, each followed by EOS,
        # packed with no padding; only the tail that does not fill a sequence is dropped.
        src = json.loads((meta.path / shard.file.replace(".tar", ".idx.json")).read_text())["source"]
        docs = [ln for ln in raw[src["byte_start"]:src["byte_end"]].decode().split("\n") if ln.strip()]
        expected = np.concatenate([np.array(e.ids + [tok.eos_id]) for e in
                                   tok.backend.encode_batch(docs, add_special_tokens=False)])
        got = shard_tokens(meta, shard).ravel()
        assert 0 <= len(expected) - len(got) < meta.sample_tokens
        assert np.array_equal(got, expected[:len(got)])
    assert src["byte_end"] == len(raw)


def test_several_shards_per_file_and_totals_add_up(dp_dataset):
    meta = dp_dataset
    assert len(meta.shards) > len(meta.sources)  # shard_bytes is small in the fixture
    for s in meta.shards:
        arr = shard_tokens(meta, s)
        assert arr.shape == (s.sequences, meta.sample_tokens)
        assert s.tokens == arr.size
    raw = json.loads((meta.path / "dataset.json").read_text())
    assert raw["total_tokens"] == sum(s.tokens for s in meta.shards)
    assert raw["total_sequences"] == sum(s.sequences for s in meta.shards)


def test_disk_overhead_is_only_one_tar_header_per_member(dp_sample, tmp_path):
    files, tok = dp_sample
    meta = tokenize_files(files, tok, tmp_path, 256)  # default 1 MiB members
    for s in meta.shards:
        members = -(-s.sequences // meta.sequences_per_member)
        overhead = (tmp_path / s.file).stat().st_size - 2 * s.tokens
        # header + padding to 512 per member, two zero blocks at the end
        assert 0 <= overhead <= members * 1023 + 1024


def test_large_vocabulary_is_stored_as_uint32(tmp_path):
    words = [f"w{i}" for i in range(70_000)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words + ["<eos>"])}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.txt").write_text("\n".join(" ".join(words[i:i + 50]) for i in range(0, 70_000, 50)))
    meta = tokenize_files([raw / "a.txt"], str(tmp_path / "tokenizer.json"), tmp_path / "out", 32)
    assert meta.dtype == "uint32" and meta.eos_id == 70_000
    arr = np.frombuffer((meta.path / meta.shards[0].file).read_bytes()[512:512 + 33 * 4], "<u4")
    assert arr.tolist() == list(range(33))  # "w0".."w49" then the next line's ids


def test_rerun_skips_finished_shards_and_resumes_after_the_last(dp_sample, tmp_path):
    files, tok = dp_sample
    settings = SMALL
    first = tokenize_files(files[:1], tok, tmp_path, SEQ_LEN, **settings)
    assert len(first.shards) >= 3
    kept = [tmp_path / s.file for s in first.shards[:2]]
    stamps = [p.stat().st_mtime_ns for p in kept]
    # Simulate a task killed while writing its third shard.
    (tmp_path / f"{files[0].stem}.done.json").unlink()
    (tmp_path / "dataset.json").unlink()
    for s in first.shards[2:]:
        (tmp_path / s.file).unlink()
    (tmp_path / (first.shards[2].file + ".tmp")).write_bytes(b"half a shard")
    again = tokenize_files(files[:1], tok, tmp_path, SEQ_LEN, **settings)
    assert again.shards == first.shards  # identical bytes, checksums, counts
    assert [p.stat().st_mtime_ns for p in kept] == stamps  # not rewritten
    assert not list(tmp_path.glob("*.tmp"))
    # A finished source is skipped entirely.
    stamp = (tmp_path / first.shards[-1].file).stat().st_mtime_ns
    tokenize_files(files[:1], tok, tmp_path, SEQ_LEN, **settings)
    assert (tmp_path / first.shards[-1].file).stat().st_mtime_ns == stamp


def test_rerun_with_other_settings_is_refused(dp_sample, tmp_path):
    files, tok = dp_sample
    tokenize_files(files[:1], tok, tmp_path, SEQ_LEN, **SMALL)
    (tmp_path / f"{files[0].stem}.done.json").unlink()
    with pytest.raises(TokenizeError, match=r"seq_len=64.*seq_len=32"):
        tokenize_files(files[:1], tok, tmp_path, 32, **SMALL)


def test_invalid_utf8_is_replaced_and_counted(dp_sample, tmp_path):
    _, tok = dp_sample
    src = tmp_path / "bad.txt"
    src.write_bytes(b"the cat sees the dog.\nthe \xff\xfe owl \xc3 meets\n\n\nthe fox.\n" * 40)
    out = tmp_path / "out"
    summary = tokenize_file(src, load_tokenizer(str(tok)), out, PackSettings(seq_len=16))
    assert summary["replaced_chars"] == 120  # \xff, \xfe and a lone \xc3 per repeat
    assert summary["documents"] == 120 and summary["empty_dropped"] == 80
    assert summary["shards"]


def test_jsonl_documents_keep_their_newlines(dp_sample, tmp_path):
    _, tok_dir = dp_sample
    tok = load_tokenizer(str(tok_dir))
    src = tmp_path / "docs.jsonl"
    docs = ["the cat\nsees the dog.", "1 plus 2 is 3."] * 30
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    meta = tokenize_files([src], tok, tmp_path / "out", 8)
    got = shard_tokens(meta, meta.shards[0]).ravel()
    expected = np.concatenate([np.array(tok.backend.encode(d, add_special_tokens=False).ids
                                        + [tok.eos_id]) for d in docs])
    assert np.array_equal(got, expected[:len(got)])


def test_bad_json_line_is_named(dp_sample, tmp_path):
    _, tok = dp_sample
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "fine"}\n{"text": broken\n')
    with pytest.raises(TokenizeError, match=r"docs.jsonl: line 2 .*not a JSON object"):
        tokenize_files([src], tok, tmp_path / "out", 8)


def test_empty_inputs_give_clear_messages(dp_sample, tmp_path):
    _, tok = dp_sample
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n  \n\n")
    with pytest.raises(TokenizeError, match="empty.txt is empty"):
        tokenize_files([tmp_path / "empty.txt"], tok, tmp_path / "o1", 8)
    with pytest.raises(TokenizeError, match="blank.txt has no non-empty documents"):
        tokenize_files([tmp_path / "blank.txt"], tok, tmp_path / "o2", 8)
    (tmp_path / "none").mkdir()
    r = run_module("data_pipeline.tokenize", "run", "--input-dir", tmp_path / "none", "--out",
                   tmp_path / "o3", "--tokenizer", tok, "--seq-len", 8)
    assert r.returncode == 2 and "no .txt or .jsonl files in" in r.stderr


def test_corpus_shorter_than_one_sequence_is_refused(dp_sample, tmp_path):
    _, tok = dp_sample
    (tmp_path / "tiny.txt").write_text("the cat.\n")
    with pytest.raises(TokenizeError, match="smaller than one sequence of seq_len \\+ 1 = 65"):
        tokenize_files([tmp_path / "tiny.txt"], tok, tmp_path / "out", 64)


def test_missing_tokenizer_says_how_to_provide_one_offline(tmp_path):
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(str(tmp_path / "nope" / "tokenizer.json"))
    (tmp_path / "folder").mkdir()
    with pytest.raises(TokenizerError, match="has no tokenizer.json"):
        load_tokenizer(str(tmp_path / "folder"))
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.txt").write_text("hello\n")
    r = run_module("data_pipeline.tokenize", "run", "--input-dir", tmp_path / "raw", "--out",
                   tmp_path / "out", "--tokenizer", "no-such-org/no-such-model", "--seq-len", 8,
                   env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2, r.stderr
    assert "cannot load tokenizer 'no-such-org/no-such-model'" in r.stderr
    assert "save_pretrained('DIR')" in r.stderr and "Traceback" not in r.stderr


def test_array_tasks_each_take_their_file_and_the_last_writes_dataset_json(dp_sample, tmp_path):
    files, tok = dp_sample
    raw = files[0].parent
    out = tmp_path / "out"
    args = ["run", "--input-dir", raw, "--out", out, "--tokenizer", tok, "--seq-len", SEQ_LEN,
            "--log-every", "0"]
    for task in range(len(files)):
        assert not (out / "dataset.json").exists()
        r = run_module("data_pipeline.tokenize", *args, env={"SLURM_ARRAY_TASK_ID": str(task)})
        assert r.returncode == 0, r.stderr
        assert f"{files[task].name}: 100.0%" in r.stderr  # progress line for Slurm logs
        assert (out / f"{files[task].stem}.done.json").exists()
    meta = read_dataset_meta(out)
    assert [s["source"] for s in meta.sources] == [f.name for f in files]
    r = run_module("data_pipeline.tokenize", *args, env={"SLURM_ARRAY_TASK_ID": "4"})
    assert r.returncode == 2 and "task index 4 out of range" in r.stderr and "--array=0-3" in r.stderr


def test_finalize_waits_for_every_source(dp_sample, tmp_path):
    files, tok = dp_sample
    tokenize_file(files[0], load_tokenizer(str(tok)), tmp_path, PackSettings(seq_len=SEQ_LEN))
    assert finalize(tmp_path, [f.name for f in files]) is None
    assert not (tmp_path / "dataset.json").exists()
    assert finalize(tmp_path).total_sequences > 0  # only the sources present


# --- the held-out validation split ----------------------------------------------------------------

def test_validation_split_holds_out_whole_documents_by_their_text(dp_sample, tmp_path):
    from data_pipeline.tokenize import VAL_DIR, held_out

    files, tok_dir = dp_sample
    tok = load_tokenizer(str(tok_dir))
    meta = tokenize_files(files, tok, tmp_path / "ds", SEQ_LEN, val_fraction=0.1, **SMALL)
    val = read_dataset_meta(tmp_path / "ds" / VAL_DIR)
    docs = [ln for f in files for ln in f.read_text().split("\n") if ln.strip()]
    expected_val = [d for d in docs if held_out(d, 0.1)]
    assert 0.05 < len(expected_val) / len(docs) < 0.15
    # Every document is on exactly one side, and the held-out side is exactly the hashed-out set.
    assert sum(s["documents"] for s in val.sources) == len(expected_val)
    assert sum(s["documents"] for s in meta.sources) == len(docs) - len(expected_val)
    # The held-out shards are those documents' tokens, back to back with EOS, in file order.
    first = [d for d in files[0].read_text().split("\n") if d.strip() and held_out(d, 0.1)]
    want = np.concatenate([np.array(e.ids + [tok.eos_id]) for e in
                           tok.backend.encode_batch(first, add_special_tokens=False)])
    got = np.concatenate([shard_tokens(val, s).ravel() for s in val.shards if s.file.startswith(files[0].stem + "-")])
    assert np.array_equal(got, want[:len(got)])
    assert not any(held_out(d, 0.0) for d in docs) and all(held_out(d, 1.0) for d in docs)


def test_resume_refuses_a_different_validation_fraction(dp_sample, tmp_path):
    files, tok_dir = dp_sample
    tokenize_files(files[:1], str(tok_dir), tmp_path / "ds", SEQ_LEN, val_fraction=0.1, **SMALL)
    for done in (tmp_path / "ds").glob("*.done.json"):
        done.unlink()  # as if the task had been interrupted after its shards
    with pytest.raises(TokenizeError, match=r"val_fraction=0.1; this run has .* val_fraction=0.2"):
        tokenize_files(files[:1], str(tok_dir), tmp_path / "ds", SEQ_LEN, val_fraction=0.2, **SMALL)
