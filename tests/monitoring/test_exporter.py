"""`python -m monitoring.exporter` on a cluster's worth of runs: logs and checkpoints as the trainer and
training/resilience/recovery.py leave them, and stand-ins for Slurm's commands printing Slurm 22.05's output
(tests/monitoring/fixtures/). Every metric of docs/monitoring.md's contract is checked by name."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monitoring import exporter
from training.resilience import recovery
from training.cluster import load_cluster

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).with_name("fixtures")
NOW = time.time()
HOUR, DAY = 3600.0, 86400.0
MODELS = [f"model{i}" for i in range(1, 9)]
# model1 trains; model2 runs but logged its last step an hour ago; model3 spent its retry budget;
# model4 waits to be requeued; model5 is complete; model6's loss went NaN; model7 stopped on a user
# error; model8 has not started.

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text format -> {(name, labels): value}; a sample written twice is an error."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, labels, value = SAMPLE.match(line).groups()
            key = (name, frozenset(LABEL.findall(labels or "")))
            assert key not in samples, line
            samples[key] = float(value)
    return samples


def value(samples: dict, metric: str, /, **labels: str) -> float | None:
    return samples.get((metric, frozenset(labels.items())))


def family(samples: dict, name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


# --- what the trainer and the batch script write -------------------------------------------------

def append(log_dir: Path, *records: dict) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def launch(log_dir: Path, job: str, t: float, step: int = 0) -> None:
    """The batch script's launch event (training.resilience.recovery start) and the trainer's start."""
    append(log_dir, {"event": "launch", "time": t, "job": job, "restart_count": 0, "nodes": "gpu-st-p5e-[1-2]",
                     "gloo_socket_ifname": ""},
           {"event": "start", "time": t + 30, "step": step, "world_size": 16, "resumed": step > 0})


def train(log_dir: Path, steps: range, t_end: float, *, step_time: float = 1.0, loss=lambda step: 5.0 - step / 1000,
          mfu: bool = False, times: list[float] = (), slowest: tuple[int, float] = (0, 2.0)) -> None:
    """A record every ``steps.step`` steps, the last one at ``t_end``, like training/components/metrics.py emits;
    ``slowest``: the rank timing's slowest rank and its excess in percent."""
    records = []
    for i, step in enumerate(steps):
        t = times[i - len(steps)] if i >= len(steps) - len(times) else step_time
        record = {"step": step, "loss": loss(step), "lr": 3e-4, "grad_norm": 1.0, "tokens_per_s": 65536 / t,
                  "tokens_per_s_per_device": 4096 / t, "step_time_s": t, "data_wait_pct": 1.0,
                  "checkpoint_block_s": 0.0, "memory_gib": 60.0, "samples_crc": 12345,
                  "slowest_rank": slowest[0], "slowest_excess_pct": slowest[1],
                  "time": t_end - (len(steps) - 1 - i) * steps.step * step_time}
        if mfu:
            record["mfu_pct"] = 41.5
        records.append(record)
    append(log_dir, *records)


def decide(log_dir: Path, job: str, t: float, *, exit_code: int = 1, status: str = "none", reason: str = "",
           relaunch: bool = False) -> str:
    """training.resilience.recovery's decision after the trainer ended (it writes the recovery event);
    ``relaunch``: the job's nodes are all healthy, and it may start the step again itself."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLURM_JOB_ID", job)
        env.setenv("SLURM_JOB_NODELIST", "gpu-st-p5e-[1-2]")
        action, _ = recovery.decide(log_dir, exit_code=exit_code, status=status, reason=reason, max_recoveries=2,
                                    window_hours=24, now=t, **({"max_relaunches": 3, "nodes_up": 2, "train_nodes": 2}
                                                               if relaunch else {}))
    return action


def checkpoint(directory: Path, step: int, shard_bytes: int, *, status: str = "") -> None:
    """A DCP checkpoint folder named by ``latest``: two rank shards and 150 bytes of metadata."""
    folder = directory / f"step_{step:08d}"
    folder.mkdir(parents=True)
    for name, size in (("__0_0.distcp", shard_bytes), ("__1_0.distcp", shard_bytes), (".metadata", 100),
                       ("train_meta.json", 50)):
        (folder / name).write_bytes(b"x" * size)
    (directory / "latest").write_text(folder.name)
    if status:
        (directory / "STATUS").write_text(status + "\n")


def logged_config(log_dir: Path, job: str, steps: int, every: int, every_minutes: float = 0) -> None:
    """The trainer's resolved-config line in the job's stderr file, among its other lines."""
    config = {"name": log_dir.name, "train": {"steps": steps}, "checkpoint": {"every": every,
                                                                             "every_minutes": every_minutes}}
    (log_dir / f"{log_dir.name}_{job}.err").write_text(
        "2026-11-20 08:00:31,000 [rank0] INFO training.train: world size 16\n"
        f"2026-11-20 08:00:31,002 [rank0] INFO training.train: config {json.dumps(config, sort_keys=True)}\n"
        "2026-11-20 08:00:40,000 [rank0] INFO training.components.metrics: step 10/1000 loss=4.99\n")


def stand_ins(bin_dir: Path, **overrides: str) -> Path:
    """squeue, sinfo, scontrol and sacctmgr printing the fixtures; ``overrides``: a command's own script body."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    scripts = {
        "squeue": f'cat "{FIXTURES}/squeue.txt"',
        "sinfo": f'cat "{FIXTURES}/sinfo.txt"',
        "sacctmgr": f'cat "{FIXTURES}/sacctmgr_show_cluster.txt"',
        "scontrol": f'case "$*" in\n  ping) cat "{FIXTURES}/scontrol_ping.txt" ;;\n'
                    f'  "-o show job") cat "{FIXTURES}/scontrol_show_job.txt" ;;\n  *) exit 1 ;;\nesac',
    } | overrides
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return bin_dir


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The jobs bundle, FSx's three file systems (folders here) and the runs on them."""
    root = tmp_path_factory.mktemp("site")
    logs, ckpts = root / "fsx/logs", root / "fsx/checkpoints"
    (root / "fsx/data").mkdir(parents=True)
    (root / "jobs/models").mkdir(parents=True)
    (root / "jobs/models/cluster.json").write_text(json.dumps({
        "generated": "by the test", "environment": "prod", "cluster_name": "llm-prod", "instance_type": "p5e.48xlarge",
        "gpu": "H200", "gpus_per_instance": 8, "gpu_memory_gib": 140.4, "price_per_instance_hour_usd": 80.0,
        "price_per_gpu_hour_usd": 10.0, "deadline_days": 14, "peak_tflops": 989, "node_link_gb_s": 450,
        "network_gb_s": 50, "plan_mfu": 0.4, "fsx_expected_mb_s": "", "stall_floor_s": 600, "spare_nodes": 1,
        "models": {m: {"nodes": 2, "gpus_per_node": 8, "world_size": 16, "config": f"models/{m}.yaml"}
                   for m in MODELS}}))
    (root / "jobs/models/model8.yaml").write_text("name: model8\ntrain:\n  steps: 3000\ncheckpoint:\n  every: 250\n")

    # model1: trains (MFU logged), checkpoints at 200, evaluated; the steps of its last 5 intervals vary.
    m1 = logs / "model1"
    launch(m1, "101", NOW - 2 * DAY)
    train(m1, range(10, 210, 10), NOW - 5, mfu=True, times=[1.0, 1.1, 0.9, 1.2, 1.0])
    append(m1, {"step": 200, "val_loss": 4.7, "perplexity": 110.0, "val_tokens": 1 << 20, "time": NOW - 4})
    logged_config(m1, "99", steps=5, every=1)  # an older job's: not this run's
    os.utime(m1 / "model1_99.err", (NOW - 3 * DAY, NOW - 3 * DAY))
    logged_config(m1, "101", steps=1000, every=100, every_minutes=1)
    checkpoint(ckpts / "model1", 200, 1000)  # 2,150 bytes

    # model2: running, but its last step was logged an hour ago (and its job restarted since).
    m2 = logs / "model2"
    launch(m2, "102", NOW - 3 * HOUR)
    # ... and its rank 5 was reported as a straggler (31 % over a 10 % margin), still the slowest since.
    append(m2, {"event": "straggler", "time": NOW - 2 * HOUR, "step": 50, "rank": 5, "node": "gpu-st-p5e-2",
                "excess_pct": 31.0, "intervals": 5, "margin_pct": 10.0})
    train(m2, range(10, 110, 10), NOW - HOUR, step_time=2.0, slowest=(5, 31.0))
    logged_config(m2, "102", steps=500, every=50)
    checkpoint(ckpts / "model2", 100, 500)  # 1,150 bytes

    # model3: two recoveries (a relaunch in the job, then a requeue), then the third failure spends the retry
    # budget (2): no job left.
    m3 = logs / "model3"
    for attempt in range(3):
        launch(m3, "103", NOW - 6 * HOUR + attempt * HOUR, step=attempt * 50)
        train(m3, range(attempt * 50 + 10, attempt * 50 + 60, 10), NOW - 6 * HOUR + attempt * HOUR + 1200)
        assert decide(m3, "103", NOW - 6 * HOUR + attempt * HOUR + 1300,
                      relaunch=attempt == 0) == ["relaunch", "requeue", "give-up"][attempt]
    checkpoint(ckpts / "model3", 100, 300)  # 750 bytes

    # model4: stopped at its time limit (planned), then failed once: requeued, its job pending.
    m4 = logs / "model4"
    launch(m4, "110", NOW - 30 * HOUR)
    train(m4, range(10, 60, 10), NOW - 7 * HOUR)
    assert decide(m4, "110", NOW - 7 * HOUR, exit_code=0, status="stopped") == "requeue"
    launch(m4, "110", NOW - 6 * HOUR, step=50)
    train(m4, range(60, 110, 10), NOW - 2 * HOUR)
    assert decide(m4, "110", NOW - 2 * HOUR + 60) == "requeue"

    # model5: complete.
    m5 = logs / "model5"
    launch(m5, "105", NOW - DAY)
    train(m5, range(10, 110, 10), NOW - 10 * HOUR)
    logged_config(m5, "105", steps=100, every=50)
    checkpoint(ckpts / "model5", 100, 200, status="complete")

    # model6: its last loss is NaN; a half-written line follows (the trainer is writing it).
    m6 = logs / "model6"
    launch(m6, "106", NOW - HOUR)
    train(m6, range(10, 260, 10), NOW - 20, loss=lambda step: math.nan if step == 250 else 3.0 + step / 1000)
    with open(m6 / "metrics.jsonl", "a") as f:
        f.write('{"step": 260, "loss": 3.2')

    # model7: a user error (bad data path): not requeued.
    m7 = logs / "model7"
    launch(m7, "107", NOW - 3 * HOUR)
    assert decide(m7, "107", NOW - 3 * HOUR + 120, exit_code=2, reason="user: /fsx/data/x has no dataset.json") == \
        "user-error"
    # model8: nothing yet.
    stand_ins(root / "bin")
    return root


def scrape(site: Path, out: Path, *args: str, bin_dir: Path | None = None) -> tuple[dict, str, str]:
    """One round (--once) into ``out``; (samples, the file's text, stderr)."""
    out.mkdir(exist_ok=True)
    fsx = site / "fsx"
    env = {**os.environ, "PYTHONPATH": str(REPO / "jobs"), "PATH": f"{bin_dir or site / 'bin'}:{os.environ['PATH']}"}
    result = subprocess.run(
        [sys.executable, "-m", "monitoring.exporter", "--textfile-dir", str(out), "--once", "--jobs-dir",
         str(site / "jobs"), "--logs", str(fsx / "logs"), "--checkpoints", str(fsx / "checkpoints"),
         "--filesystems", f"{fsx}/data,{fsx}/checkpoints,{fsx}/logs", *args],
        env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    text = (out / "llm.prom").read_text()
    return parse(text), text, result.stderr


@pytest.fixture(scope="module")
def scraped(site, tmp_path_factory) -> tuple[dict, str, str]:
    return scrape(site, tmp_path_factory.mktemp("textfile"))


def test_every_metric_of_the_contract_is_written_once_with_help_and_type(scraped):
    samples, text, stderr = scraped
    contract = REPO / "docs/monitoring.md"
    tables = contract.read_text().split("### Per model")[1].split("### Node and GPU")[0]
    named = re.findall(r"^\| `(llm_\w+)", tables, re.M)
    assert named == list(exporter.METRICS)  # the contract's tables, in order
    for name, (kind, _) in exporter.METRICS.items():
        assert text.count(f"# HELP {name} ") == 1 and text.count(f"# TYPE {name} {kind}\n") == 1, name
        assert family(samples, name), f"{name}: no sample"
    assert stderr == ""


def test_the_file_passes_promtool(scraped):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool is not installed (scripts/install_system_packages.sh installs it)")
    check = subprocess.run([promtool, "check", "metrics"], input=scraped[1], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_running_model(scraped, site):
    samples, _, _ = scraped
    m = {"model": "model1"}
    assert value(samples, "llm_training_step", **m) == 200
    assert value(samples, "llm_training_total_steps", **m) == 1000  # from the config job 101 logged
    assert value(samples, "llm_training_loss", **m) == pytest.approx(4.8)
    assert value(samples, "llm_training_loss_baseline", **m) == pytest.approx(4.9)  # steps 10..190: median 100
    assert value(samples, "llm_training_val_loss", **m) == 4.7
    assert value(samples, "llm_training_tokens_per_second", **m) == 65536
    assert value(samples, "llm_training_mfu_ratio", **m) == pytest.approx(0.415)
    assert value(samples, "llm_training_step_seconds", **m) == 1.0  # median of 1.0, 1.1, 0.9, 1.2, 1.0
    assert value(samples, "llm_training_last_step_timestamp_seconds", **m) == pytest.approx(NOW - 5)
    assert value(samples, "llm_training_last_progress_timestamp_seconds", **m) == pytest.approx(NOW - 5)
    assert value(samples, "llm_training_stall_floor_seconds", **m) == 600
    mtime = (site / "fsx/checkpoints/model1/step_00000200").stat().st_mtime
    assert value(samples, "llm_training_last_checkpoint_timestamp_seconds", **m) == pytest.approx(mtime)
    assert value(samples, "llm_training_last_checkpoint_step", **m) == 200
    assert value(samples, "llm_training_checkpoint_interval_seconds", **m) == 60  # every_minutes 1 < 100 steps
    assert value(samples, "llm_training_recoveries_total", **m) == 0
    assert value(samples, "llm_training_last_failure_timestamp_seconds", **m) == 0
    assert value(samples, "llm_training_job_running", **m) == 1 and value(samples, "llm_training_job_pending", **m) == 0
    assert value(samples, "llm_training_started", **m) == 1 and value(samples, "llm_training_complete", **m) == 0
    assert family(samples, "llm_training_failed") and value(samples, "llm_training_failed", reason="", **m) == 0
    eta = value(samples, "llm_training_eta_timestamp_seconds", **m)
    assert NOW + 800 <= eta <= time.time() + 800  # 800 steps left at 1 s
    assert value(samples, "llm_training_deadline_timestamp_seconds", **m) == pytest.approx(NOW - 2 * DAY + 14 * DAY)


def test_a_stalled_model_shows_its_last_progress_an_hour_ago(scraped):
    samples, _, _ = scraped
    m = {"model": "model2"}
    assert value(samples, "llm_training_last_progress_timestamp_seconds", **m) == pytest.approx(NOW - HOUR)
    assert value(samples, "llm_training_step_seconds", **m) == 2.0
    assert value(samples, "llm_training_checkpoint_interval_seconds", **m) == 100  # 50 steps x 2 s
    assert value(samples, "llm_training_job_running", **m) == 1
    assert value(samples, "llm_training_failed", reason="", **m) == 0


def test_a_spent_retry_budget_is_a_failure_a_pending_requeue_is_not(scraped):
    samples, _, _ = scraped
    failed = {"model": "model3"}
    assert value(samples, "llm_training_failed", reason="retry budget spent", **failed) == 1
    assert len([k for k in family(samples, "llm_training_failed") if ("model", "model3") in k]) == 1
    assert value(samples, "llm_training_recoveries_total", **failed) == 2
    last_failure = value(samples, "llm_training_last_failure_timestamp_seconds", **failed)
    assert last_failure == pytest.approx(NOW - 4 * HOUR + 1300)  # the give-up
    assert value(samples, "llm_training_job_running", **failed) == 0
    assert value(samples, "llm_training_job_pending", **failed) == 0

    requeued = {"model": "model4"}
    assert value(samples, "llm_training_failed", reason="", **requeued) == 0
    assert value(samples, "llm_training_job_pending", **requeued) == 1
    assert value(samples, "llm_training_recoveries_total", **requeued) == 1  # the planned stop is not one
    last_failure = value(samples, "llm_training_last_failure_timestamp_seconds", **requeued)
    assert last_failure == pytest.approx(NOW - 2 * HOUR + 60)
    # The last (re)start counts as progress: the requeued run launched 6 h ago, its last step 2 h ago.
    assert value(samples, "llm_training_last_progress_timestamp_seconds", **requeued) == pytest.approx(NOW - 2 * HOUR)
    deadline = value(samples, "llm_training_deadline_timestamp_seconds", **requeued)
    assert deadline == pytest.approx(NOW - 30 * HOUR + 14 * DAY)  # from the first launch

    user = {"model": "model7"}
    assert value(samples, "llm_training_failed", reason="user error", **user) == 1
    assert value(samples, "llm_training_recoveries_total", **user) == 0
    assert value(samples, "llm_training_last_failure_timestamp_seconds", **user) == pytest.approx(NOW - 3 * HOUR + 120)
    assert value(samples, "llm_training_last_progress_timestamp_seconds", **user) == pytest.approx(NOW - 3 * HOUR + 30)


def test_a_complete_model_and_one_not_started(scraped):
    samples, _, _ = scraped
    done = {"model": "model5"}
    assert value(samples, "llm_training_complete", **done) == 1
    assert value(samples, "llm_training_failed", reason="", **done) == 0
    assert value(samples, "llm_training_step", **done) == value(samples, "llm_training_total_steps", **done) == 100
    assert value(samples, "llm_training_eta_timestamp_seconds", **done) is None

    new = {"model": "model8"}
    assert value(samples, "llm_training_total_steps", **new) == 3000  # from the job's models/model8.yaml
    assert value(samples, "llm_training_started", **new) == 0
    assert value(samples, "llm_training_failed", reason="", **new) == 0
    assert value(samples, "llm_training_step", **new) == 0
    assert value(samples, "llm_training_last_step_timestamp_seconds", **new) == 0
    assert value(samples, "llm_training_last_checkpoint_timestamp_seconds", **new) == 0
    for absent in ("llm_training_loss", "llm_training_loss_baseline", "llm_training_step_seconds",
                   "llm_training_eta_timestamp_seconds", "llm_training_deadline_timestamp_seconds",
                   "llm_training_checkpoint_interval_seconds"):
        assert value(samples, absent, **new) is None, absent


def test_a_nan_loss_is_exported_as_nan_and_the_baseline_stays_finite(scraped):
    samples, text, _ = scraped
    assert 'llm_training_loss{model="model6"} NaN\n' in text
    assert value(samples, "llm_training_step", model="model6") == 250  # the half-written line waits
    assert value(samples, "llm_training_loss_baseline", model="model6") == pytest.approx(3.145)  # steps 50..240
    assert value(samples, "llm_training_mfu_ratio", model="model6") is None  # no MFU logged (a CPU run)


def test_slurm_nodes_jobs_and_restarts(scraped):
    samples, _, _ = scraped
    assert value(samples, "llm_slurmctld_up") == 1 and value(samples, "llm_slurmdbd_up") == 1
    nodes = {dict(k)["state"]: v for k, v in family(samples, "llm_slurm_nodes").items()}
    # Every node once, though gpu-st-p5e-3 and -8 are in two partitions.
    assert nodes == {"allocated": 3, "down": 1, "drained": 1, "draining": 1, "idle": 3, "mixed": 1}
    unavailable = {dict(k)["node"]: dict(k) for k in family(samples, "llm_slurm_node_unavailable")}
    assert unavailable["gpu-st-p5e-3"] == {"node": "gpu-st-p5e-3", "state": "drained", "reason": "Kill task failed"}
    assert unavailable["gpu-st-p5e-5"]["reason"] == "XID 79 on GPU 3: fell off the bus"
    assert unavailable["gpu-st-p5e-6"]["state"] == "not_responding"  # idle*
    assert unavailable["gpu-st-p5e-7"]["state"] == "down"
    assert set(unavailable) == {"gpu-st-p5e-3", "gpu-st-p5e-5", "gpu-st-p5e-6", "gpu-st-p5e-7"}  # not idle~ ones
    assert value(samples, "llm_slurm_spare_nodes") == 1
    assert value(samples, "llm_slurm_jobs", account="ops", qos="ops", state="PENDING", reason="Resources") == 2
    assert value(samples, "llm_slurm_jobs", account="model4", qos="model4", state="PENDING", reason="BeginTime") == 1
    assert value(samples, "llm_slurm_jobs", account="model1", qos="model1", state="RUNNING", reason="None") == 1
    assert value(samples, "llm_slurm_job_restarts", name="model4", job_id="110") == 3
    assert value(samples, "llm_slurm_job_restarts", name="model3", job_id="103") == 2  # finished, still known
    assert value(samples, "llm_slurm_job_restarts", name="backup-model5 (final)", job_id="113") == 0
    assert value(samples, "llm_exporter_last_run_timestamp_seconds") >= NOW


def test_file_systems_and_the_next_checkpoint_writes(scraped, site):
    samples, _, _ = scraped
    fsx = site / "fsx"
    stat = os.statvfs(fsx / "data")
    for mount in ("data", "checkpoints", "logs"):
        assert value(samples, "llm_fsx_size_bytes", filesystem=f"{fsx}/{mount}") == stat.f_blocks * stat.f_frsize
        assert value(samples, "llm_fsx_free_bytes", filesystem=f"{fsx}/{mount}") > 0
    # The running models' latest checkpoints (model1, model2; model6 has none yet), on checkpoints only.
    assert value(samples, "llm_fsx_next_write_bytes", filesystem=f"{fsx}/checkpoints") == 2150 + 1150
    assert value(samples, "llm_fsx_next_write_bytes", filesystem=f"{fsx}/data") == 0


def test_slurmdbd_down_times_out_and_the_rest_is_written(site, tmp_path):
    bin_dir = stand_ins(tmp_path / "bin", sacctmgr="sleep 30")  # slurmdbd down: sacctmgr hangs
    samples, _, stderr = scrape(site, tmp_path / "out", "--timeout", "1", bin_dir=bin_dir)
    assert value(samples, "llm_slurmdbd_up") == 0 and value(samples, "llm_slurmctld_up") == 1
    assert stderr == "sacctmgr: no answer in 1 s\n"
    assert value(samples, "llm_training_step", model="model1") == 200
    assert family(samples, "llm_slurm_nodes") and family(samples, "llm_fsx_free_bytes")


def test_slurmctld_down_leaves_out_what_needs_it_and_never_reports_a_failure(site, tmp_path):
    bin_dir = stand_ins(tmp_path / "bin", scontrol='echo "Slurmctld(primary) at ip-10-0-0-10 is DOWN"; exit 1')
    samples, text, stderr = scrape(site, tmp_path / "out", bin_dir=bin_dir)
    assert value(samples, "llm_slurmctld_up") == 0 and value(samples, "llm_slurmdbd_up") == 1
    assert stderr == "scontrol ping: Slurmctld(primary) at ip-10-0-0-10 is DOWN\n"
    for unknown in ("llm_slurm_nodes", "llm_slurm_jobs", "llm_training_job_running", "llm_training_failed"):
        assert unknown not in text, unknown
    assert value(samples, "llm_training_step", model="model3") == 150
    # Who writes next is unknown: every unfinished model with a checkpoint counts (model1, 2, 3).
    assert value(samples, "llm_fsx_next_write_bytes", filesystem=f"{site}/fsx/checkpoints") == 2150 + 1150 + 750


def _exporter(site: Path) -> exporter.Exporter:
    fsx = site / "fsx"
    return exporter.Exporter(jobs_dir=site / "jobs", logs=fsx / "logs", checkpoints=fsx / "checkpoints",
                             mounts=[str(fsx / "checkpoints")])


def test_no_slurm_at_all(site, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    samples = parse(exporter.render(_exporter(site).collect()))
    assert value(samples, "llm_slurmctld_up") == value(samples, "llm_slurmdbd_up") == 0
    assert value(samples, "llm_training_step", model="model1") == 200
    assert capsys.readouterr().err == "scontrol ping: No such file or directory\nsacctmgr: No such file or directory\n"


def test_a_straggler_is_exported_with_its_node_while_it_stays_the_slowest_over_its_margin(scraped, site, tmp_path,
                                                                                          monkeypatch):
    samples, _, _ = scraped
    assert value(samples, "llm_training_slowest_rank_excess_ratio", model="model1") == pytest.approx(0.02)
    assert value(samples, "llm_training_straggler", model="model2", rank="5", node="gpu-st-p5e-2") == \
        pytest.approx(0.31)
    assert [dict(labels)["model"] for labels in family(samples, "llm_training_straggler")] == ["model2"]
    monkeypatch.setenv("PATH", f"{stand_ins(tmp_path / 'bin')}:{os.environ['PATH']}")
    copy = tmp_path / "site"
    shutil.copytree(site, copy, symlinks=True)
    e, log = _exporter(copy), copy / "fsx/logs/model2"

    def straggler() -> dict:
        return family(parse(exporter.render(e.collect())), "llm_training_straggler")

    assert straggler()
    train(log, range(110, 111), NOW, slowest=(5, 8.0))  # the same rank, now under its 10 % margin
    assert not straggler()
    train(log, range(120, 121), NOW, slowest=(5, 25.0))  # slow again: still the reported straggler
    assert straggler()
    train(log, range(130, 131), NOW, slowest=(3, 25.0))  # another rank is the slowest: not yet reported
    assert not straggler()
    train(log, range(140, 141), NOW, slowest=(5, 25.0))
    launch(log, "103", NOW)  # a new run (on other nodes, after a drain) starts with no straggler
    assert not straggler()


def test_logs_are_read_incrementally_and_a_half_written_line_waits(site, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{stand_ins(tmp_path / 'bin')}:{os.environ['PATH']}")
    copy = tmp_path / "site"
    shutil.copytree(site, copy, symlinks=True)
    log = copy / "fsx/logs/model6/metrics.jsonl"
    e = _exporter(copy)
    samples = parse(exporter.render(e.collect()))
    assert value(samples, "llm_training_step", model="model6") == 250
    offset = e.runs["model6"].tail.offset
    with open(log, "a") as f:  # the trainer finishes its line, and a corrupt one (a crash) follows
        f.write(', "step_time_s": 1.0, "tokens_per_s": 1.0, "time": 1.0}\n{"step": 270, "lo\n')
    samples = parse(exporter.render(e.collect()))
    assert value(samples, "llm_training_step", model="model6") == 260
    assert value(samples, "llm_training_loss", model="model6") == 3.2
    assert e.runs["model6"].tail.offset == log.stat().st_size > offset
    log.write_text(log.read_text().splitlines()[0] + "\n")  # replaced: only the launch is left
    samples = parse(exporter.render(e.collect()))
    assert value(samples, "llm_training_step", model="model6") == 0
    assert value(samples, "llm_training_started", model="model6") == 1


def test_a_failing_source_is_reported_once_until_it_changes(site, tmp_path, monkeypatch, capsys):
    bin_dir = stand_ins(tmp_path / "bin", sinfo='echo "sinfo: error: slurm_load_node: Unable to contact slurm '
                                                 'controller (connect failure)" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    e = _exporter(site)
    for _ in range(3):
        samples = parse(exporter.render(e.collect()))
    assert not family(samples, "llm_slurm_nodes") and family(samples, "llm_slurm_jobs")
    assert capsys.readouterr().err == "sinfo: error: slurm_load_node: Unable to contact slurm controller " \
                                      "(connect failure)\n"
    stand_ins(bin_dir)
    e.collect()
    e.collect()
    assert capsys.readouterr().err == "sinfo: ok again\n"


def test_the_file_is_replaced_whole_never_seen_half_written(site, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    fsx = site / "fsx"
    env = {**os.environ, "PYTHONPATH": str(REPO / "jobs"), "PATH": f"{site / 'bin'}:{os.environ['PATH']}"}
    process = subprocess.Popen(
        [sys.executable, "-m", "monitoring.exporter", "--textfile-dir", str(out), "--interval", "0.01",
         "--jobs-dir", str(site / "jobs"), "--logs", str(fsx / "logs"), "--checkpoints", str(fsx / "checkpoints"),
         "--filesystems", str(fsx / "checkpoints")], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline, seen, rounds = time.monotonic() + 60, set(), set()
        while len(rounds) < 20 and time.monotonic() < deadline:
            seen |= {p.name for p in out.glob("*.prom")}
            try:
                text = (out / "llm.prom").read_text()
            except FileNotFoundError:
                continue  # not written yet
            assert text.endswith("\n") and "llm_slurmctld_up 1\n" in text and "llm_fsx_free_bytes{" in text
            rounds.add(re.search(r"^llm_exporter_last_run_timestamp_seconds (\S+)$", text, re.M).group(1))
        assert len(rounds) >= 20 and seen == {"llm.prom"}
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert process.stderr.read() == ""


def test_the_cluster_file_gives_the_stall_floor_and_spares_absent_spares_are_none(tmp_path):
    from cluster_config.model_jobs import bundled_cluster
    from cluster_config.settings import load_settings

    dev = bundled_cluster("dev")
    assert dev.stall_floor_s == load_settings("dev").alerts.stall_floor_s
    data = json.loads(dev.path.read_text())
    del data["spare_nodes"]
    (tmp_path / "models").mkdir()
    (tmp_path / "models/cluster.json").write_text(json.dumps(data))
    assert load_cluster(tmp_path).spare_nodes == 0


def test_a_missing_textfile_folder_is_a_usage_error(tmp_path):
    result = subprocess.run([sys.executable, "-m", "monitoring.exporter", "--textfile-dir", str(tmp_path / "no"),
                             "--once"], env={**os.environ, "PYTHONPATH": str(REPO / "jobs")}, capture_output=True,
                            text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: {tmp_path}/no is not a folder — create it, or pass " \
                                                     "the node exporter's --collector.textfile.directory"
