"""A model's Megatron preprocessing: its shards, tokenized with its tokenizer, exported to Megatron's indexed
format and read by megatron-core's own classes (GPTDataset, its HuggingFaceTokenizer); and the job's arguments
and status read from what that leaves on disk."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

with warnings.catch_warnings():  # megatron-core warns at import that Apex/TE are absent (CPU)
    warnings.simplefilter("ignore")
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import HuggingFaceTokenizer

from data_pipeline.sample_data import make_sample
from data_pipeline.tokenize import tokenize_files
from megatron_lm import args as megatron_args
from megatron_lm import status
from megatron_lm.preprocess import prefixes, preprocess
from training import config

SEQ_LEN = 64


@pytest.fixture(scope="module")
def preprocessed(tmp_path_factory):
    """A sample corpus tokenized with its own tokenizer (a train and a validation split), then preprocessed for
    Megatron-LM as jobs/megatron_lm/preprocess_megatron.sh does (python -m megatron_lm.preprocess)."""
    root = tmp_path_factory.mktemp("megatron")
    files, tokenizer = make_sample(root / "sample", num_files=2, total_bytes=40_000)
    dataset = tokenize_files(files, tokenizer, root / "tokenized" / "model8", SEQ_LEN, val_fraction=0.1,
                             shard_bytes=16 << 10, member_bytes=2 << 10, batch_bytes=8 << 10)
    summaries = {s["split"]: s for s in preprocess(dataset.path)}
    return dataset, Path(tokenizer), files, summaries


class _MegatronTokenizer:
    """What GPTDataset reads of the tokenizer Megatron-LM builds (--tokenizer-type HuggingFaceTokenizer)."""

    def __init__(self, folder: Path):
        self.hf = HuggingFaceTokenizer(str(folder))
        self.eod, self.pad, self.vocab_size = self.hf.eod, -1, self.hf.vocab_size
        self.unique_identifiers = {"class": "HuggingFaceTokenizer", "path": str(folder)}


def test_megatron_reads_the_preprocessed_splits_with_the_models_tokenizer(preprocessed, tmp_path):
    dataset, tokenizer_folder, files, summaries = preprocessed
    tokenizer = _MegatronTokenizer(tokenizer_folder)
    # Megatron's tokenizer is the dataset's: same vocabulary and end-of-document id.
    assert (tokenizer.vocab_size, tokenizer.eod) == (dataset.vocab_size, dataset.eos_id)
    paths = prefixes(dataset.path)
    train_docs, valid_docs = IndexedDataset(str(paths["train"])), IndexedDataset(str(paths["valid"]))
    assert (len(train_docs), len(valid_docs)) == (summaries["train"]["documents"], summaries["valid"]["documents"])
    assert len(valid_docs) > 0 and len(train_docs) > 5 * len(valid_docs)  # --val-fraction 0.1
    # A whole document reads back as one of the corpus' lines (documents end in EOS).
    lines = {line for f in files for line in Path(f).read_text().splitlines()}
    first = train_docs[0]
    assert first[-1] == tokenizer.eod and tokenizer.hf.ids_to_text(first[:-1].tolist()) in lines

    # pretrain_gpt.py's datasets: --train-data-path and --valid-data-path, sampled at --seq-length.
    cfg = GPTDatasetConfig(random_seed=1234, sequence_length=SEQ_LEN, blend_per_split=[
        ([str(paths["train"])], None), ([str(paths["valid"])], None), None], tokenizer=tokenizer,
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False, path_to_cache=str(tmp_path))
    train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, [20, 4, 0], lambda: True, cfg).build()
    for split in (train, valid):
        sample = split[0]
        tokens, labels = sample["tokens"].numpy(), sample["labels"].numpy()
        assert len(tokens) == SEQ_LEN and np.array_equal(labels[:-1], tokens[1:])
        assert tokens.max() < dataset.vocab_size


def test_the_jobs_arguments_name_the_preprocessed_data_and_the_models_folders(preprocessed, tmp_path, monkeypatch):
    dataset, tokenizer_folder, _, _ = preprocessed
    models = tmp_path / "models"
    models.mkdir()
    (models / "model8.yaml").write_text(json.dumps({"name": "model8", "model": {"preset": "tiny"}, "data": {
        "path": str(dataset.path), "tokenizer": str(tokenizer_folder), "seq_len": SEQ_LEN}}))
    (models / "model8.megatron.args").write_text("# generated\n--num-layers\n2\n--train-iters\n60\n")
    monkeypatch.setattr(config, "MODEL_CONFIGS", models)
    monkeypatch.setenv("FSX_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("FSX_LOGS", str(tmp_path / "logs"))
    args = megatron_args.model_arguments("model8")
    value = {flag: args[i + 1] for i, flag in enumerate(args[:-1]) if flag.startswith("--")}
    assert args[:4] == ["--num-layers", "2", "--train-iters", "60"]  # the bundle's, then the cluster's paths
    assert value["--train-data-path"] == str(prefixes(dataset.path)["train"])
    assert value["--valid-data-path"] == str(prefixes(dataset.path)["valid"])
    assert value["--tokenizer-model"] == str(tokenizer_folder)
    assert value["--save"] == value["--load"] == str(tmp_path / "checkpoints" / "model8")

    (models / "model9.yaml").write_text(json.dumps({"name": "model9", "model": {"preset": "tiny"},
                                                    "data": {"path": str(tmp_path / "none")}}))
    with pytest.raises(ValueError, match="model model9 has no megatron: entry"):
        megatron_args.model_arguments("model9")
    (models / "model9.megatron.args").write_text("--num-layers\n2\n")
    with pytest.raises(ValueError, match="no Megatron dataset at .* run: MODEL=model9 sbatch "
                                         "jobs/megatron_lm/preprocess_megatron.sh"):
        megatron_args.model_arguments("model9")


def test_status_reads_megatrons_tracker(tmp_path, monkeypatch, capsys):
    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setattr(config, "MODEL_CONFIGS", models)
    monkeypatch.setenv("FSX_CHECKPOINTS", str(tmp_path))
    assert status.main(["model8"]) == 2  # no Megatron arguments: not a Megatron model
    assert "model model8: no Megatron-LM arguments in" in capsys.readouterr().err
    (models / "model8.megatron.args").write_text("--train-iters\n60\n")
    (tmp_path / "model8").mkdir()
    assert status.main(["model8", "--verdict"]) == 0 and capsys.readouterr().out == "stopped\n"
    (tmp_path / "model8" / "latest_checkpointed_iteration.txt").write_text("50\n")
    assert status.main(["model8"]) == 0
    assert capsys.readouterr().out.startswith("model8: iteration 50 of 60 (83.3%)")
    (tmp_path / "model8" / "latest_checkpointed_iteration.txt").write_text("60\n")
    assert status.main(["model8", "--verdict"]) == 0 and capsys.readouterr().out == "complete\n"
