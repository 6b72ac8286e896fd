"""`python -m training.status` on a real (resumed) training run's logs and checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, Run

from cluster_config.model_jobs import bundled_cluster
from training.status import ModelStatus, collect, format_table, summarize_metrics

RUN = ("checkpoint.every=4", "log.interval=2", "train.micro_batch_size=8", "optim.warmup_steps=2")


@pytest.fixture(scope="module")
def resumed(tiny_data, tmp_path_factory) -> Run:
    """8 steps, then the same run extended to 12: it resumes from the step-8 checkpoint."""
    run = Run(tmp_path_factory.mktemp("status"))
    assert run.run(tiny_data, *RUN, "train.steps=8") == 0, run.output[-3000:]
    assert run.run(tiny_data, *RUN, "train.steps=12") == 0, run.output[-3000:]
    # Where the Slurm job's output goes (jobs/train_model1.sh): the run's own log, config line included.
    (run.logs / "model1_1001.err").write_text(run.output)
    return run


def test_status_reports_progress_losses_checkpoint_and_recoveries(resumed):
    [status] = collect(["model1"], resumed.root / "logs", resumed.root / "checkpoints", price_per_gpu_hour=2.0)
    records = [r for r in resumed.records() if "loss" in r]
    assert (status.step, status.total_steps) == (12, 12)  # total from the config the run logged
    assert status.loss == records[-1]["loss"]
    assert status.tokens_per_s == records[-1]["tokens_per_s"]
    assert status.resumes == 1
    assert status.checkpoint == "step_00000012" and 0 <= status.checkpoint_age_s < 600
    assert status.run_status == "complete" and status.eta_s is None
    assert status.backup == "not yet"  # complete, no backup job has run
    backups = resumed.root / "logs/backups/model1"  # the model user's own folder (directory_setup.sh)
    backups.mkdir(parents=True, exist_ok=True)
    line = "INFO backed up and verified 3 files (3 uploaded, 0 already in S3): s3://b/model1/step_{:08d}/\n"
    # A log in the shared folder above it (where a neighbour could have written one) is not read.
    (backups.parent / "backup-model1_9.out").write_text(line.format(12))
    assert collect(["model1"], resumed.root / "logs", resumed.root / "checkpoints")[0].backup == "not yet"
    (backups.parent / "backup-model1_9.out").unlink()
    (backups / "backup-model1_7.out").write_text(line.format(8))
    assert collect(["model1"], resumed.root / "logs", resumed.root / "checkpoints")[0].backup == "older: step_00000008"
    (backups / "backup-model1_8.out").write_text(line.format(12))
    assert collect(["model1"], resumed.root / "logs", resumed.root / "checkpoints")[0].backup == "verified"
    for path in backups.iterdir():
        path.unlink()
    assert status.device_hours > 0 and status.dollars == pytest.approx(2.0 * status.device_hours)
    table = format_table([status])
    assert "12/12" in table and "step_00000012" in table


def test_device_hours_add_up_the_intervals_of_every_run():
    status = ModelStatus("m")
    summarize_metrics(status, [
        {"event": "start", "step": 0, "world_size": 4},
        {"step": 10, "loss": 3.0, "step_time_s": 36.0, "checkpoint_block_s": 0.0},
        {"step": 20, "loss": 2.5, "step_time_s": 36.0, "checkpoint_block_s": 360.0},
        {"event": "start", "step": 20, "world_size": 8, "resumed": True},
        {"step": 30, "loss": 2.0, "step_time_s": 18.0, "checkpoint_block_s": 0.0},
        {"step": 30, "val_loss": 2.2, "perplexity": 9.0},
    ])
    # (10 x 36 + 10 x 36 + 360) x 4 ranks + 10 x 18 x 8 ranks = 4,320 + 1,440 device-seconds = 1.6 h
    assert status.device_hours == pytest.approx(1.6)
    assert (status.step, status.loss, status.val_loss, status.resumes) == (30, 2.0, 2.2, 1)


def test_in_job_relaunches_are_told_apart_from_requeues():
    status = ModelStatus("m", job="41 RUNNING", restarts=1)  # Slurm requeued job 41 once
    summarize_metrics(status, [
        {"event": "start", "step": 0},
        {"event": "recovery", "action": "relaunch", "recovery": 1, "relaunch": 1},
        {"event": "start", "step": 6, "resumed": True},
        {"event": "recovery", "action": "requeue", "recovery": 2},
        {"event": "start", "step": 12, "resumed": True},
        {"event": "recovery", "action": "relaunch", "recovery": 3, "relaunch": 1},
        {"event": "start", "step": 18, "resumed": True},
    ])
    assert (status.recoveries, status.relaunches) == (3, 2)
    header, row = format_table([status]).splitlines()
    assert header.split()[-4:-2] == ["recov", "in-job"] and row.split()[-4:-2] == ["3", "2"]


def test_cli_table_json_and_picture(resumed, tmp_path):
    dev = bundled_cluster("dev")  # dev's models/cluster.json, as the local cluster's jobs/ holds it
    # JOBS_DIR: where the cluster file is looked for by default (the head node's shell sets it).
    env = {**resumed.env(), "PYTHONPATH": str(REPO / "jobs"), "JOBS_DIR": str(dev.jobs_dir)}
    png = tmp_path / "status.png"
    out = subprocess.run([sys.executable, "-m", "training.status", "--env", "dev", "--png", str(png)],
                         env=env, capture_output=True, text=True, check=True).stdout
    assert [line.split()[0] for line in out.splitlines()[1:3]] == ["model1", "model2"]  # the cluster file's models
    assert png.stat().st_size > 10_000
    data = json.loads(subprocess.run([sys.executable, "-m", "training.status", "model1", "--json"], env=env,
                                     capture_output=True, text=True, check=True).stdout)
    assert data[0]["checkpoint"] == "step_00000012"
    assert data[0]["dollars"] == pytest.approx(data[0]["device_hours"] * dev.price_per_gpu_hour_usd)
    # No cluster file: the runs in --logs, without dollars; none there either: nothing to show.
    no_file = {**env, "JOBS_DIR": str(tmp_path)}
    data = json.loads(subprocess.run([sys.executable, "-m", "training.status", "--json"], env=no_file,
                                     capture_output=True, text=True, check=True).stdout)
    assert [s["name"] for s in data] == ["model1"] and data[0]["dollars"] is None
    bad = subprocess.run([sys.executable, "-m", "training.status", "--logs", str(tmp_path)], env=no_file,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "error: no models" in bad.stderr
    asked = subprocess.run([sys.executable, "-m", "training.status", "--env", "prod"], env=no_file,
                           capture_output=True, text=True)
    assert asked.returncode == 2 and f"error: no {tmp_path}/models/cluster.json — write prod's with" in asked.stderr


def _statuses(now: float) -> list[ModelStatus]:
    """Two GPU runs: one on time, one whose ETA falls after its deadline."""
    statuses = []
    for name, step, step_time in (("model1", 600, 1.0), ("model2", 100, 120.0)):
        status = ModelStatus(name, step=step, total_steps=1000, step_time_s=step_time, started_at=now - 13 * 86400)
        status.history = [{"step": s, "loss": 5 - s / 500, "tokens_per_s": 1e5, "mfu_pct": 40.0}
                          for s in range(10, step + 1, 10)]
        status.evals = [{"step": step, "val_loss": 4.0}]
        statuses.append(status)
    return statuses


def test_the_picture_shows_the_dashboards_panels(tmp_path):
    from monitoring.filesystems import usage
    from monitoring.slurm import parse_nodes
    from training.status import figure, plot

    now = 1.8e9
    nodes = parse_nodes("gpu-1|allocated|none\ngpu-2|drained|Kill task failed\ngpu-2|drained|Kill task failed\n")
    fig = figure(_statuses(now), now=now, deadline_days=14, nodes=nodes, usage=[usage(str(tmp_path))])
    assert [ax.get_title() for ax in fig.axes] == ["training loss", "validation loss", "tokens/s", "MFU %", "progress",
                                                    "nodes by state", "file systems: free"]
    progress = {t.get_text(): t.get_color() for t in fig.axes[4].texts}
    # Both deadlines are a day away (14 days after the start); model1 has 400 steps x 1 s left, model2 900 x 120 s.
    assert progress == {"600/1000, ETA 01-15 08:06 UTC, deadline 01-16 08:00 UTC": "black",
                        "100/1000, ETA 01-16 14:00 UTC, deadline 01-16 08:00 UTC": "tab:red"}
    nodes_panel = fig.axes[5]
    assert [t.get_text() for t in nodes_panel.get_xticklabels()] == ["allocated", "drained"]
    assert [bar.get_height() for bar in nodes_panel.patches] == [1, 1]  # gpu-2 once, though in two partitions
    out = plot(_statuses(now), tmp_path / "status.png", now=now, nodes=nodes)
    assert out.stat().st_size > 10_000


def test_without_slurm_the_nodes_panel_is_left_out_with_a_note(tmp_path, monkeypatch):
    from training.status import cluster_views, figure

    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo
    views = cluster_views([str(tmp_path), str(tmp_path / "not-mounted")])
    assert views["nodes"] is None and [u.path for u in views["usage"]] == [str(tmp_path)]
    assert views["notes"] == ["nodes by state left out: Slurm not reachable (sinfo: No such file or directory)",
                              f"file system {tmp_path}/not-mounted left out: No such file or directory"]
    statuses = _statuses(1.8e9)
    for status in statuses:  # a CPU run: no MFU
        status.history = [{k: v for k, v in r.items() if k != "mfu_pct"} for r in status.history]
    fig = figure(statuses, **views)
    assert [ax.get_title() for ax in fig.axes] == ["training loss", "validation loss", "tokens/s", "progress",
                                                    "file systems: free"]
    assert fig.texts[0].get_text() == "\n".join(views["notes"])
