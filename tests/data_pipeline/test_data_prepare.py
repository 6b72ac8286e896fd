"""Prepare: local text/JSONL -> N raw files (offline; the hub path is not exercised)."""

import importlib.util
import json

import pytest

from dp_helpers import run_module


def prepare(*args):
    r = run_module("data_pipeline.prepare", *args)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else None), r.stderr


def test_text_lines_become_contiguous_parts_without_empty_lines(tmp_path):
    src = tmp_path / "in.txt"
    lines = [f"document {i} = heading =" if i % 7 == 0 else f"paragraph {i}" for i in range(103)]
    src.write_text("\n\n".join(lines) + "\n \n")
    rc, report, err = prepare("--out", tmp_path / "raw", "--num-files", "10", "--input", src)
    assert rc == 0, err
    assert report["documents"] == 103 and report["empty_dropped"] == 103
    assert [f["documents"] for f in report["files"]] == [11, 11, 11] + [10] * 7
    written = [ln for i in range(10) for ln in (tmp_path / "raw" / f"part-{i:05d}.txt").read_text().splitlines()]
    assert written == lines


def test_jsonl_records_keep_inner_newlines(tmp_path):
    src = tmp_path / "in.jsonl"
    docs = ["line one\nline two", "", "third"]
    src.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    rc, report, err = prepare("--out", tmp_path / "raw", "--num-files", "2", "--input", src,
                              "--text-field", "body")
    assert rc == 0, err
    assert report["format"] == "jsonl" and report["documents"] == 2 and report["empty_dropped"] == 1
    got = [json.loads(ln)["text"] for f in sorted((tmp_path / "raw").iterdir())
           for ln in f.read_text().splitlines()]
    assert got == ["line one\nline two", "third"]


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(b"good line\nbad \xff line\n")
    rc, report, _ = prepare("--out", tmp_path / "raw", "--num-files", "1", "--input", src)
    assert rc == 0 and report["replaced_chars"] == 1
    assert (tmp_path / "raw" / "part-00000.txt").read_text() == "good line\nbad \ufffd line\n"


def test_bad_inputs_give_one_clear_line(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    rc, _, err = prepare("--out", tmp_path / "raw", "--input", tmp_path / "empty.txt")
    assert rc == 2 and err.startswith("error: no non-empty documents")
    rc, _, err = prepare("--out", tmp_path / "raw", "--input", tmp_path / "missing.txt")
    assert rc == 2 and "missing.txt does not exist" in err
    (tmp_path / "two.txt").write_text("a\nb\n")
    rc, _, err = prepare("--out", tmp_path / "raw", "--num-files", "3", "--input", tmp_path / "two.txt")
    assert rc == 2 and "only 2 documents, fewer than --num-files 3" in err


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None,
                    reason="datasets is installed: the hub path would download")
def test_hub_path_without_datasets_package_says_how_to_install(tmp_path):
    rc, _, err = prepare("--out", tmp_path / "raw", "--hf-dataset", "wikitext", "--hf-config",
                         "wikitext-2-raw-v1")
    assert rc == 2 and "pip install datasets" in err and "Traceback" not in err
