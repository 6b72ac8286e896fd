"""Build the small CPU dataset that jobs/training/configs/tiny.yaml trains on: the data pipeline's
sample corpus, tokenized and packed at seq_len 128 (a few seconds, no downloads). For the local
cluster, the tests and the benchmarks; it is not part of the jobs bundle.

    .venv/bin/python -m local_cluster.demo_data .local_cluster/fsx/data/tokenized/sample
"""

from __future__ import annotations

import sys
from pathlib import Path

from cli import ArgumentParser
from data_pipeline.sample_data import make_sample
from data_pipeline.shards import DatasetMeta, read_dataset_meta
from data_pipeline.tokenize import tokenize_files

SEQ_LEN = 128
VAL_FRACTION = 0.05  # held out in <out_dir>/val for the validation loss (eval.every)


def build(out_dir: str | Path, *, seq_len: int = SEQ_LEN, size_kb: int = 400) -> DatasetMeta:
    """Shards in ``out_dir``, the held-out split in ``out_dir/val`` (corpus and tokenizer beside it in
    ``<out_dir>.src``); reused if present."""
    out_dir = Path(out_dir)
    if (out_dir / "dataset.json").is_file() and (out_dir / "val/dataset.json").is_file():
        return read_dataset_meta(out_dir)
    files, tokenizer = make_sample(out_dir.with_name(out_dir.name + ".src"), num_files=2, total_bytes=size_kb * 1000)
    return tokenize_files(files, tokenizer, out_dir, seq_len, val_fraction=VAL_FRACTION)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m local_cluster.demo_data", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seq-len", type=int, default=SEQ_LEN)
    args = parser.parse_args(argv)
    meta = build(args.out_dir, seq_len=args.seq_len)
    print(f"{meta.path}: {meta.total_sequences} sequences of {meta.seq_len} tokens, vocab {meta.vocab_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
