"""Bad data is a user error (exit 2, ``FAILURE: user:``, no requeue), said in one message without a traceback."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "jobs/training/configs/tiny.yaml"
SHORT = ("train.steps=3", "optim.warmup_steps=1", "checkpoint.every=3", "log.interval=1")


@pytest.fixture
def data(tiny_data, tmp_path) -> Path:
    """A private copy of the tiny dataset that a test may damage."""
    return Path(shutil.copytree(tiny_data, tmp_path / "data"))


@pytest.fixture
def failure(run, monkeypatch) -> Path:
    """Where the trainer writes why it stopped (jobs/train.sh reads it to decide on a requeue)."""
    path = run.root / "FAILURE"
    monkeypatch.setenv("TRAIN_FAILURE_FILE", str(path))
    return path


def test_shard_rewritten_in_place_stops_training_as_a_user_error(run, data, failure):
    meta = json.loads((data / "dataset.json").read_text())
    for shard in meta["shards"]:  # same size, ids in range: whichever shard a worker opens first is refused
        with open(data / shard["file"], "r+b") as f:
            f.seek(512)
            f.write(np.full(meta["sample_tokens"], meta["eos_id"], np.uint16).tobytes())
    assert run.run(data, *SHORT, nproc=1) != 0
    reason = failure.read_text()
    assert re.match(rf"user: shard {re.escape(str(data))}/\S+\.tar: SHA-256 is [0-9a-f]{{64}}, "
                    rf"dataset\.json says [0-9a-f]{{64}}: its bytes changed after tokenizing", reason), reason
    assert "Traceback" not in reason and "training failed" not in run.output
    assert not (run.checkpoints / "latest").exists()


def test_non_integer_dataset_field_stops_training_as_a_user_error(run, data, failure):
    meta_file = data / "dataset.json"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "seq_len": "128 tokens"}))
    assert run.run(data, *SHORT, nproc=1) != 0
    assert failure.read_text().startswith(f"user: {meta_file}: field seq_len is '128 tokens', not an integer")
    assert f"error: {meta_file}: field seq_len is '128 tokens'" in run.output
    assert "training failed" not in run.output  # what the trainer logs, with a traceback, on an infrastructure failure


# The preflight's command line, for a cluster of one model, model1 (tiny.yaml on the test's dataset), whose own
# config is written beside the test: the preflight takes a model's data from its own config, as the trainer does.
PREFLIGHT = """import sys
from pathlib import Path
from training import config, preflight
config.MODEL_CONFIGS = Path(sys.argv[1])
sys.exit(preflight.main(sys.argv[2:]))
"""


def preflight(data: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    own = yaml.safe_load(TINY.read_text())
    own["data"]["path"] = str(data)
    (models / "model1.yaml").write_text(yaml.safe_dump(own))
    env = {**os.environ, "PYTHONPATH": str(REPO / "jobs"), "FSX_CHECKPOINTS": str(tmp_path / "ckpt"),
           "FSX_LOGS": str(tmp_path / "logs")}
    env.pop("TRAIN_CONFIG", None)
    return subprocess.run([sys.executable, "-c", PREFLIGHT, str(models), "model1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_corrupt_tokenizer_is_refused_by_preflight_without_a_traceback(data, tmp_path):
    meta_file = data / "dataset.json"
    meta = json.loads(meta_file.read_text())
    tokenizer = Path(shutil.copytree(meta["tokenizer"]["name"], tmp_path / "tokenizer"))
    (tokenizer / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": {"a"')  # cut short
    meta["tokenizer"]["name"] = str(tokenizer)
    meta_file.write_text(json.dumps(meta))
    result = preflight(data, tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"error: tokenizer '{tokenizer}' of the dataset does not load: tokenizer file " \
           f"{tokenizer / 'tokenizer.json'} is corrupt" in result.stderr


def test_non_integer_dataset_field_is_refused_by_preflight_naming_it(data, tmp_path):
    meta_file = data / "dataset.json"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "vocab_size": 512.5}))
    result = preflight(data, tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"error: dataset: {meta_file}: field vocab_size is 512.5, not an integer >= 1" in result.stderr
