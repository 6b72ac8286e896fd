"""Experiment tracking (W&B) cannot take training down: no network is one warning, the run goes on.

No network is reachable from the tests, which is the case that matters: a job on a cluster whose
nodes lose their way out must train on as if W&B were not configured.
"""

from __future__ import annotations

import signal

import pytest

from training.components import metrics


from training import preflight
pytest.importorskip("wandb")

# Short, and every step logged, so the tracker is called on each of them.
RUN = ("train.steps=6", "checkpoint.every=3", "log.interval=1", "eval.every=0", "optim.warmup_steps=2")
WARNING = "W&B tracking off for the rest of this run"


def keyed(monkeypatch, **env):
    """A W&B key (not a valid one: the run never gets far enough to use it) and a short start-up wait."""
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_no_network_is_one_warning_and_the_run_completes(run, tiny_data, monkeypatch):
    keyed(monkeypatch)
    assert run.run(tiny_data, *RUN) == 0, run.output[-4000:]
    assert run.output.count(WARNING) == 1, run.output[-4000:]
    assert run.status() == "complete"
    assert max(run.losses()) == 6


def test_the_run_id_is_kept_across_restarts_of_one_checkpoint_folder(tmp_path):
    first = metrics.run_id(tmp_path / "model1", "model1")
    assert first.startswith("model1-")
    assert metrics.run_id(tmp_path / "model1", "model1") == first  # the requeued job's
    assert metrics.run_id(tmp_path / "other", "model1") != first  # a new lineage is a new W&B run


def test_a_requeued_job_resumes_the_same_wandb_run(run, tiny_data, monkeypatch):
    """Two launches on one checkpoint folder, as Slurm's requeue does, log into one offline W&B run."""
    keyed(monkeypatch, WANDB_MODE="offline")
    assert run.run(tiny_data, "train.steps=3", *RUN[1:]) == 0, run.output[-4000:]
    run_id = (run.checkpoints / "wandb_run_id").read_text().strip()
    assert run.run(tiny_data, *RUN) == 0, run.output[-4000:]
    assert WARNING not in run.output
    assert (run.checkpoints / "wandb_run_id").read_text().strip() == run_id
    # One local run folder per launch, both of the same run, and only rank 0's (2 ranks ran).
    folders = sorted((run.logs / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all(f.name.endswith(f"-{run_id}") for f in folders), folders


def test_wandb_leaves_the_trainers_signal_handlers_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    tracker = metrics.Tracker(project="p", name="model1", config={}, checkpoint_dir=str(tmp_path / "ckpt"),
                              log_dir=str(tmp_path / "logs"))
    assert tracker
    tracker.log({"loss": 1.0}, step=1)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    tracker.finish()


def test_preflight_warns_and_passes_when_wandb_is_unreachable(monkeypatch, capsys):
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens: refused at once
    assert preflight._check_tracker() == []
    out = capsys.readouterr().out
    assert "ok: wandb" in out and "warning: W&B host 127.0.0.1:9 not reachable" in out


def test_preflight_says_nothing_of_wandb_without_a_key(monkeypatch, capsys):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert preflight._check_tracker() == []
    assert "W&B" not in capsys.readouterr().out
