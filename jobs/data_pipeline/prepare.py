"""Prepare raw text files: a Hugging Face dataset or local text/JSONL -> N raw files.

    python -m data_pipeline.prepare --out RAW --num-files 10 --input a.txt b.jsonl ...
    python -m data_pipeline.prepare --out RAW --num-files 10 \\
        --hf-dataset wikitext --hf-config wikitext-2-raw-v1 --split train

Documents are split into ``--num-files`` contiguous, nearly equal parts named
``part-NNNNN.txt`` (one document per line: every non-empty line of the input is a document, as
in wikitext) or ``part-NNNNN.jsonl`` (``--format jsonl``: one JSON record per document, so
documents keep their inner newlines; the default for JSONL input). Empty lines are dropped and
invalid UTF-8 is replaced; counts are printed as JSON. Local files need no network; the hub path
imports ``datasets`` only when used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from atomic_file import atomic_open
from cli import ArgumentParser, fail


class PrepareError(ValueError):
    pass


def _local_documents(paths: list[Path], fmt: str, field: str, stats: dict):
    for path in paths:
        if not path.is_file():
            raise PrepareError(f"input {path} does not exist")
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                line = raw.decode("utf-8", errors="replace")
                stats["replaced_chars"] += line.count("\ufffd") - raw.count("\ufffd".encode())
                if not line.strip():
                    stats["empty_dropped"] += 1
                    continue
                if path.suffix == ".jsonl":
                    try:
                        text = json.loads(line)[field]
                    except (ValueError, KeyError, TypeError) as e:
                        raise PrepareError(f"{path}: line {n} is not a JSON object with a "
                                           f"{field!r} string ({e})") from None
                    yield from _split(text, fmt, stats)
                else:
                    yield line.rstrip("\r\n")


def _split(text: str, fmt: str, stats: dict):
    """One record -> documents: itself (jsonl) or its non-empty lines (txt)."""
    if fmt == "jsonl":
        if text.strip():
            yield text
        else:
            stats["empty_dropped"] += 1
        return
    for line in text.split("\n"):
        if line.strip():
            yield line.rstrip("\r")
        else:
            stats["empty_dropped"] += 1


def _hf_documents(name: str, config: str | None, split: str, field: str, fmt: str, stats: dict):
    try:
        import datasets
    except ImportError:
        raise PrepareError("--hf-dataset needs the `datasets` package: `pip install datasets` "
                           "into the jobs venv, or pass local files with --input") from None
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # the hub client raises many types; the message is what matters
        raise PrepareError(f"cannot load dataset {name!r} (config {config!r}, split {split!r}): "
                           f"{e}") from None
    for record in ds:
        yield from _split(record[field], fmt, stats)


def write_parts(documents, out_dir, num_files: int, fmt: str, total: int) -> list[dict]:
    """Write ``total`` documents as ``num_files`` contiguous parts, each atomically."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts, docs = [], iter(documents)
    for i in range(num_files):
        count = total // num_files + (i < total % num_files)
        path = out_dir / f"part-{i:05d}.{fmt}"
        with atomic_open(path, "w", encoding="utf-8") as f:
            for _ in range(count):
                doc = next(docs)
                f.write((json.dumps({"text": doc}) if fmt == "jsonl" else doc) + "\n")
        parts.append({"file": path.name, "documents": count, "bytes": path.stat().st_size})
    return parts


def prepare(out_dir, num_files: int = 10, *, inputs=None, hf_dataset=None, hf_config=None,
            split="train", text_field="text", fmt=None) -> dict:
    if bool(inputs) == bool(hf_dataset):
        raise PrepareError("give either --input files or --hf-dataset")
    if num_files < 1:
        raise PrepareError(f"--num-files must be >= 1 (got {num_files})")
    inputs = [Path(p) for p in inputs or []]
    fmt = fmt or ("jsonl" if any(p.suffix == ".jsonl" for p in inputs) else "txt")

    def documents(stats):
        if hf_dataset:
            return _hf_documents(hf_dataset, hf_config, split, text_field, fmt, stats)
        return _local_documents(inputs, fmt, text_field, stats)

    # Count first, then write contiguous parts: a second pass is cheap next to tokenizing.
    stats = {"empty_dropped": 0, "replaced_chars": 0}
    total = sum(1 for _ in documents(stats))
    if total == 0:
        raise PrepareError(f"no non-empty documents in {inputs or hf_dataset}")
    if total < num_files:
        raise PrepareError(f"only {total} documents, fewer than --num-files {num_files}")
    parts = write_parts(documents({"empty_dropped": 0, "replaced_chars": 0}), out_dir, num_files,
                        fmt, total)
    return {"out": str(out_dir), "documents": total, **stats, "format": fmt, "files": parts}


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m data_pipeline.prepare", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the raw files")
    p.add_argument("--num-files", type=int, default=10, help="how many raw files (array tasks)")
    p.add_argument("--input", nargs="+", help="local .txt (line = document) or .jsonl files")
    p.add_argument("--hf-dataset", help="Hugging Face dataset name, e.g. wikitext")
    p.add_argument("--hf-config", help="dataset config, e.g. wikitext-2-raw-v1")
    p.add_argument("--split", default="train")
    p.add_argument("--text-field", default="text", help="field holding the text")
    p.add_argument("--format", choices=["txt", "jsonl"], help="output format (see above)")
    a = p.parse_args(argv)
    try:
        report = prepare(a.out, a.num_files, inputs=a.input, hf_dataset=a.hf_dataset,
                         hf_config=a.hf_config, split=a.split, text_field=a.text_field,
                         fmt=a.format)
    except PrepareError as e:
        return fail(e)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
