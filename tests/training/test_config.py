"""The typed training config: file + overrides, validation messages (per-model configs: tests/cluster_config/test_model_jobs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from training import config
from training.config import ConfigError, load_config
from training.models.llama import count_parameters, hf_config
from training.models.presets import PRESETS

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "jobs/training/configs"


@pytest.fixture(autouse=True)
def fsx_env(monkeypatch):
    monkeypatch.setenv("FSX_DATA", "/fsx/data")
    monkeypatch.setenv("FSX_CHECKPOINTS", "/fsx/checkpoints")
    monkeypatch.setenv("FSX_LOGS", "/fsx/logs")


def test_file_then_overrides_and_per_model_directories():
    cfg = load_config(CONFIGS / "tiny.yaml", ["train.steps=7", "optim.lr=1e-3", "name=model3", "optim.warmup_steps=2"])
    assert (cfg.train.steps, cfg.optim.lr, cfg.train.parallelism) == (7, 1e-3, "ddp")
    assert cfg.data.path == "/fsx/data/tokenized/sample"
    assert cfg.checkpoint.dir == "/fsx/checkpoints/model3"
    assert cfg.log.dir == "/fsx/logs/model3"
    assert cfg.log.tensorboard_dir == "/fsx/logs/model3/tensorboard"


@pytest.mark.parametrize("overrides, message", [
    (["train.stpes=5"], "unknown config key 'train.stpes'; remove it or fix the spelling (allowed here: steps, "),
    (["train.steps=many"], "train.steps: Input should be a valid integer, unable to parse string as an integer (got 'many')"),
    (["train.steps=true"], "train.steps: expected a number, got a boolean"),
    (["train.parallelism=zero3"], "train.parallelism: Input should be 'ddp', 'fsdp' or 'hsdp' (got 'zero3')"),
    (["model.preset=gpt5"], "model.preset: unknown preset 'gpt5'; choose a shorthand (tiny, small, 1.7b"),
    (["train.micro_batch_size=5"], "train.global_batch_size 32 is not a multiple of train.micro_batch_size 5"),
    (["optim.min_lr=1.0"], "optim.min_lr 1.0 is above optim.lr"),
    (["checkpoint.keep=0"], "checkpoint.keep: Input should be greater than 0 (got 0)"),
    (["train.parallelism=fsdp", "train.tensor_parallel=2", "data.seq_len=127"],
     "train.tensor_parallel 2 does not divide data.seq_len 127"),
    (["train.async_tp=true"], "train.async_tp overlaps tensor-parallel communication: set train.tensor_parallel > 1"),
    (["train.deterministic=maybe"], "train.deterministic: Input should be a valid boolean, unable to interpret input "
                                    "(got 'maybe')"),
    (["train.parallelism=fsdp", "train.tensor_parallel=2", "train.async_tp=true", "train.compile=false"],
     "train.async_tp needs train.compile"),
    (["steps"], "override 'steps' is not section.key=value"),
    (["train.steps.max=1"], "override 'train.steps.max=1': steps is not a section"),
])
def test_bad_settings_name_the_field_and_the_fix(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(CONFIGS / "tiny.yaml", overrides)
    assert message in str(err.value)


def test_grad_accumulation_needs_a_dividing_world_size():
    cfg = load_config(CONFIGS / "tiny.yaml", ["train.micro_batch_size=8"])
    assert cfg.grad_accum_steps(2) == 2
    with pytest.raises(ConfigError, match="not a multiple of train.micro_batch_size x data-parallel ranks = 8 x 3"):
        cfg.grad_accum_steps(3)


def test_unset_environment_variable_in_a_path_is_refused(monkeypatch):
    monkeypatch.delenv("FSX_DATA")
    with pytest.raises(ConfigError, match="data.path: .* uses an unset environment variable"):
        load_config(CONFIGS / "tiny.yaml")


def test_presets_have_the_published_shapes():
    sizes = {name: count_parameters(hf_config(name, 32000, 4096))[0] / 1e9 for name in PRESETS}
    assert sizes["llama2-7b"] == pytest.approx(6.74, abs=0.01)
    assert sizes["llama2-13b"] == pytest.approx(13.0, abs=0.05)
    assert sizes["llama2-70b"] == pytest.approx(69.0, abs=0.1)
    assert hf_config("llama2-70b", 32000, 4096).num_key_value_heads == 8
    for name, (layers, hidden, heads) in {"1.7b": (24, 2304, 24), "7.5b": (36, 4096, 32),
                                          "310.1b": (96, 16384, 128)}.items():
        c = hf_config(name, 32000, 4096)
        assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (layers, hidden, heads)
    # The seed's names grow with the shapes (the exact count depends on the vocabulary).
    ordered = ["1.7b", "3.6b", "7.5b", "18.4b", "39.1b", "76.1b", "145.6b", "310.1b"]
    assert [sizes[n] for n in ordered] == sorted(sizes[n] for n in ordered)


@pytest.mark.parametrize(("argument", "identity"), [
    ("name=model2", "name"), ("checkpoint.dir=/fsx/checkpoints/model2", "checkpoint.dir"), ("log.dir=/tmp/logs", "log.dir"),
    ("log.tensorboard_dir=/tmp/tb", "log.tensorboard_dir"), ("data.path=/fsx/data/tokenized/model2", "data.path"),
    ("checkpoint={dir: /fsx/checkpoints/model2}", "checkpoint.dir"),  # the whole section, its dir with it
])
def test_a_models_job_refuses_its_identity_as_an_argument(argument, identity):
    # jobs/train.sh runs the trainer with --model: name=model2 would write into model2's checkpoints,
    # and train.sh would read the run's STATUS and FAILURE from model1's folder.
    with pytest.raises(ConfigError) as refused:
        load_config(CONFIGS / "tiny.yaml", [argument], model="model1")
    assert str(refused.value).startswith(f"override {argument!r}: {identity} is model1's own")
    load_config(CONFIGS / "tiny.yaml", [argument])  # outside a model's job: any run of one's own


def test_a_models_job_takes_its_name_and_folders_from_the_model(tmp_path, monkeypatch):
    models = tmp_path / "models"  # the cluster's model configs: model3's is tiny.yaml's
    models.mkdir()
    (models / "model3.yaml").write_text((CONFIGS / "tiny.yaml").read_text())
    monkeypatch.setattr(config, "MODEL_CONFIGS", models)
    cfg = load_config(CONFIGS / "tiny.yaml", [], model="model3")  # tiny.yaml names no model
    assert (cfg.name, cfg.checkpoint.dir, cfg.log.dir) == ("model3", "/fsx/checkpoints/model3", "/fsx/logs/model3")
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text((CONFIGS / "tiny.yaml").read_text() + "checkpoint: {dir: /fsx/checkpoints/model2}\n")
    with pytest.raises(ConfigError, match=f"checkpoint.dir is set in {elsewhere}, but model3's job keeps its run"):
        load_config(elsewhere, [], model="model3")
    # Another model's config file is another model's run, whatever its data (dev's two share theirs).
    named = tmp_path / "model2.yaml"
    named.write_text((CONFIGS / "tiny.yaml").read_text() + "name: model2\n")
    with pytest.raises(ConfigError, match=f"name is 'model2' in {named}: that is model2's config, and this is model3's job"):
        load_config(named, [], model="model3")
    with pytest.raises(ConfigError, match="model 'model4' is not one of this cluster's models \\(model3\\)"):
        load_config(CONFIGS / "tiny.yaml", [], model="model4")


def test_the_trainer_reports_an_identity_argument_as_a_user_error(tmp_path, monkeypatch, capsys):
    from training import train  # torch: imported by this test only

    failure = tmp_path / "FAILURE"
    monkeypatch.setenv("TRAIN_FAILURE_FILE", str(failure))
    assert train.main(["--config", str(CONFIGS / "tiny.yaml"), "--model", "model1", "name=model2"]) == 2
    assert "error: override 'name=model2': name is model1's own" in capsys.readouterr().err
    # train.sh's recovery reads "user:": the job stops with exit 2 instead of requeueing.
    assert failure.read_text().startswith("user: config error: override 'name=model2': name is model1's own")
