"""Preflight before allocation: a run that would fail on its nodes is refused on the head node."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from training import config, preflight

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "jobs/training/configs/tiny.yaml"


@pytest.fixture
def run_check(tmp_path, monkeypatch):
    """model1's preflight, model1 being tiny.yaml on a dataset: a cluster of one model, whose own config (what the
    preflight, as the trainer, takes a model's data from) is written here, its folders under ``ckpt``."""
    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setattr(config, "MODEL_CONFIGS", models)
    monkeypatch.delenv("TRAIN_CONFIG", raising=False)

    def run(data: Path, ckpt: Path, *overrides: str) -> list[str]:
        own = yaml.safe_load(TINY.read_text())
        own["data"]["path"] = str(data)
        (models / "model1.yaml").write_text(yaml.safe_dump(own))
        monkeypatch.setenv("FSX_CHECKPOINTS", str(ckpt))
        monkeypatch.setenv("FSX_LOGS", f"{ckpt}.logs")
        return preflight.check("model1", None, list(overrides))

    return run


def test_a_matching_dataset_passes(run_check, tiny_data, tmp_path, capsys):
    assert run_check(tiny_data, tmp_path / "ckpt") == []
    out = capsys.readouterr().out
    assert "ok: dataset" in out and "ok: tokenizer" in out and "ok: checkpoint folder" in out


def test_seq_len_mismatch_is_refused_naming_both_values(run_check, tiny_data, tmp_path):
    problems = run_check(tiny_data, tmp_path / "ckpt", "data.seq_len=4096")
    assert len(problems) == 1
    assert "seq_len: dataset has 128, training config has 4096" in problems[0]


def test_too_small_vocabulary_is_refused(run_check, tiny_data, tmp_path):
    problems = run_check(tiny_data, tmp_path / "ckpt", "model.vocab_size=64")
    assert any("vocab_size" in p and "model has 64" in p for p in problems), problems


def test_an_architecture_whose_vocabulary_is_smaller_than_the_datasets_is_refused(run_check, tiny_data, tmp_path):
    """A config.json fixes the vocabulary (train.py builds the embeddings at it): the dataset's ids must fit it."""
    arch = tmp_path / "arch"
    arch.mkdir()
    (arch / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 192,
        "num_hidden_layers": 2, "num_attention_heads": 4}))
    problems = run_check(tiny_data, tmp_path / "ckpt", f"model.preset={arch / 'config.json'}")
    assert any("vocab_size" in p and "model has 64" in p for p in problems), problems


def test_missing_dataset_says_how_to_make_it(run_check, tmp_path):
    problems = run_check(tmp_path / "nothing", tmp_path / "ckpt")
    assert len(problems) == 1 and "run jobs/preprocess.sh for model1" in problems[0]


def test_changed_or_missing_tokenizer_is_refused(run_check, tiny_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    meta = (data / "dataset.json").read_text()
    (data / "dataset.json").write_text(meta.replace('"sha256": "', '"sha256": "0', 1))
    problems = run_check(data, tmp_path / "ckpt")
    assert any("tokenizer" in p and "changed since the dataset was made" in p for p in problems), problems


def test_a_missing_model_tokenizer_says_how_to_fetch_a_gated_one(run_check, tiny_data, tmp_path):
    """A Llama 3.1 model whose tokenizer was never uploaded: refused before its dataset is even made, with the
    workstation download and the upload to the data bucket that puts it under /fsx/data/tokenizers/."""
    missing = tmp_path / "fsx-data/tokenizers/llama3.1"
    for data in (tmp_path / "no-dataset-yet", tiny_data):
        problems = run_check(data, tmp_path / "ckpt", f"data.tokenizer={missing}")
        [problem] = [p for p in problems if "data.tokenizer" in p]
        assert f"the model's tokenizer {str(missing)!r} (data.tokenizer) does not load" in problem
        # hf: the command the pinned huggingface_hub installs (it no longer installs huggingface-cli)
        download = re.search(r"`(hf download [^`]+)`", problem)[1]
        assert download == 'hf download meta-llama/Llama-3.1-8B --include "tokenizer*" --local-dir llama3.1'
        assert shutil.which("hf", path=str(Path(sys.executable).parent)), "hf is not installed beside this python"
        assert "s3://<data bucket>/tokenizers/llama3.1/`: it appears as /fsx/data/tokenizers/llama3.1" in problem


def test_unwritable_checkpoint_folder_is_refused(run_check, tiny_data, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    problems = run_check(tiny_data, blocker)
    assert problems == [f"checkpoint folder {blocker / 'model1'} cannot be made: {blocker} is not a folder — ask the "
                        "cluster's admin to remove it (the node setup, node_scripts/directory_setup.sh, makes model1's "
                        "folders)"]
    assert blocker.read_text() == "not a folder"


def test_bad_config_is_refused(run_check, tiny_data, tmp_path):
    problems = run_check(tiny_data, tmp_path / "ckpt", "train.steps=-1")
    own = config.MODEL_CONFIGS / "model1.yaml"
    assert len(problems) == 1 and problems[0].startswith(f"config {own}: ") and "train.steps" in problems[0]


def test_submit_refuses_without_calling_sbatch(tmp_path, dev_jobs):
    # sbatch on PATH records any call: the refusal must happen before it.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\necho called >{tmp_path}/sbatch-called\n")
    (bin_dir / "sbatch").chmod(0o755)
    # The FSx folders of a model's job come from cluster.env (root's, as the node setup writes it), not the shell.
    cluster_env = tmp_path / "cluster.env"
    cluster_env.write_text(f"export FSX_DATA={tmp_path}/fsx-data FSX_CHECKPOINTS={tmp_path}/ckpt FSX_LOGS={tmp_path}/logs\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "JOBS_VENV": str(REPO / ".venv"),
           "CLUSTER_ENV": str(cluster_env)}
    result = subprocess.run(["bash", "jobs/submit.sh", "model1"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert f"error: dataset: no dataset.json in {tmp_path}/fsx-data/tokenized/sample" in result.stderr
    assert "NOT submitted" in result.stderr
    assert not (tmp_path / "sbatch-called").exists()
    unknown = subprocess.run(["bash", "jobs/submit.sh", "model99"], cwd=REPO, env=env, capture_output=True, text=True)
    assert unknown.returncode == 2
    assert "no job script" in unknown.stderr and "this cluster's models are: model1 model2" in unknown.stderr


def preprocess(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JOBS_VENV": str(REPO / ".venv"), "FSX_DATA": str(tmp_path / "fsx-data"),
           "CLUSTER_ENV": str(tmp_path / "none.env"), "VAL_FRACTION": "0", **env}
    return subprocess.run(["bash", "jobs/preprocess.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_preprocess_for_a_model_makes_the_data_its_preflight_accepts(tmp_path, monkeypatch, dev_jobs):
    """dev's model1: dataset tokenized/sample at seq_len 128 with the tokenizer in tokenized/sample.src."""
    from data_pipeline.sample_data import make_sample

    files, tokenizer = make_sample(tmp_path / "fsx-data/tokenized/sample.src", num_files=1, total_bytes=60_000)
    result = preprocess(tmp_path, MODEL="model1", RAW_DIR=str(files[0].parent))
    assert result.returncode == 0, result.stderr[-2000:]
    # The model's dataset, seq_len and tokenizer, not the generic defaults (tokenized, 2048, $FSX_DATA/tokenizer).
    assert f"-> {tmp_path}/fsx-data/tokenized/sample (seq_len 128)" in result.stdout
    for name, folder in (("FSX_DATA", "fsx-data"), ("FSX_CHECKPOINTS", "ckpt"), ("FSX_LOGS", "logs")):
        monkeypatch.setenv(name, str(tmp_path / folder))
    assert preflight.check("model1", None, []) == []

    unknown = preprocess(tmp_path, MODEL="model99")
    assert unknown.returncode == 2 and "cannot read the data settings of model 'model99'" in unknown.stderr


def test_data_made_with_another_tokenizer_is_refused(tmp_path, monkeypatch, dev_jobs):
    from data_pipeline.sample_data import make_sample

    make_sample(tmp_path / "fsx-data/tokenized/sample.src", num_files=1, total_bytes=60_000)  # the model's
    files, other = make_sample(tmp_path / "other", num_files=1, total_bytes=40_000, vocab_size=300)
    result = preprocess(tmp_path, MODEL="model1", RAW_DIR=str(files[0].parent), TOKENIZER=str(other))
    assert result.returncode == 0, result.stderr[-2000:]
    for name, folder in (("FSX_DATA", "fsx-data"), ("FSX_CHECKPOINTS", "ckpt"), ("FSX_LOGS", "logs")):
        monkeypatch.setenv(name, str(tmp_path / folder))
    problems = preflight.check("model1", None, [])
    assert len(problems) == 1, problems
    assert f"the dataset was made with tokenizer {str(other)!r}, not the model's" in problems[0]
    assert "re-tokenize with MODEL=<model> sbatch jobs/preprocess.sh" in problems[0]


def test_a_model_the_cluster_does_not_have_is_refused(dev_jobs):
    problems = preflight.check("model9", None, [])
    assert problems == ["model 'model9' is not one of this cluster's models (model1, model2) — add it to models: "
                        "in the settings and redeploy"]
