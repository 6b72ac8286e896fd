"""A model's token shards as Megatron-LM's indexed datasets, ready for ``pretrain_gpt.py``:

    python -m megatron_lm.preprocess /fsx/data/tokenized/model8

writes ``<dataset>/megatron/train_text_document.{bin,idx}`` from the dataset and, when the dataset
holds a validation split (``<dataset>/val``, tokenize ``--val-fraction``),
``<dataset>/megatron/valid_text_document.{bin,idx}``. The tokens are the shards' own: the model's
tokenizer made them (jobs/preprocess.sh MODEL=<model>), and Megatron-LM is given the same tokenizer
folder (``--tokenizer-type HuggingFaceTokenizer``), so its vocabulary and end-of-document id are the
dataset's. Each split is exported by data_pipeline.megatron_export (documents cut at EOS, written
atomically, .idx last). Prints one JSON line per split.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cli import ArgumentParser, fail
from data_pipeline.megatron_export import export
from data_pipeline.shards import DatasetError
from data_pipeline.tokenize import VAL_DIR

FOLDER = "megatron"  # inside the dataset's folder: the model's own


def prefixes(dataset: str | Path) -> dict[str, Path]:
    """Megatron's ``--train-data-path`` / ``--valid-data-path`` prefixes of a dataset folder."""
    root = Path(dataset) / FOLDER
    return {"train": root / "train_text_document", "valid": root / "valid_text_document"}


def preprocess(dataset: str | Path) -> list[dict]:
    """Export the dataset (and its validation split, if any); the export summaries."""
    dataset, out = Path(dataset), prefixes(dataset)
    summaries = [dict(split="train", **export(dataset, out["train"]))]
    if (dataset / VAL_DIR / "dataset.json").is_file():
        summaries.append(dict(split="valid", **export(dataset / VAL_DIR, out["valid"])))
    return summaries


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m megatron_lm.preprocess",
                       description="Export a model's token shards as Megatron-LM indexed datasets "
                                   "(<dataset>/megatron/{train,valid}_text_document).")
    p.add_argument("dataset", help="the model's dataset folder (holding dataset.json)")
    a = p.parse_args(argv)
    try:
        summaries = preprocess(a.dataset)
    except (DatasetError, OSError) as e:
        return fail(e)
    for summary in summaries:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
