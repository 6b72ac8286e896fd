"""Tokens/s and data-wait share of the tiny CPU config on two nodes of the local Slurm cluster.

Submits ``jobs/train_model1.sh`` exactly as a user would (2 nodes, no GPUs) when the local cluster
is up; otherwise runs the same training with torchrun as two processes on this host and says so.
Figures are the medians over the log intervals after the first (start-up excluded).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOG_INTERVAL = 10
MIN_STEPS = 2 * LOG_INTERVAL  # the first log interval (start-up) is left out: at least one more


def overrides(steps: int) -> list[str]:
    """The tiny config for ``steps`` steps, with a checkpoint halfway."""
    return ["--config", "jobs/training/configs/tiny.yaml", f"train.steps={steps}", f"log.interval={LOG_INTERVAL}",
            f"checkpoint.every={steps // 2}"]


def _summary(records: list[dict], setup: str) -> dict:
    intervals = [r for r in records if "loss" in r][1:]
    data_wait_pct = round(statistics.median(r["data_wait_pct"] for r in intervals), 3)  # the verdict reads it as reported
    return {
        "setup": setup,
        "intervals": len(intervals),
        "tokens_per_s_total": round(statistics.median(r["tokens_per_s"] for r in intervals)),
        "tokens_per_s_per_device": round(statistics.median(r["tokens_per_s_per_device"] for r in intervals)),
        "step_time_s": round(statistics.median(r["step_time_s"] for r in intervals), 4),
        "data_wait_pct_median": data_wait_pct,
        "data_wait_pct_max": round(max(r["data_wait_pct"] for r in intervals), 3),
        "target_data_wait_pct": 2.0,
        "meets_target": data_wait_pct <= 2.0,
        "first_loss": records[[i for i, r in enumerate(records) if "loss" in r][0]]["loss"],
        "last_loss": [r for r in records if "loss" in r][-1]["loss"],
    }


def _on_slurm(steps: int) -> dict | None:
    sys.path.insert(0, str(REPO))
    from local_cluster.client import LocalCluster, give_to, job_folders, unsupported_reason

    if unsupported_reason():
        return None
    cluster = LocalCluster()
    if not cluster.is_up():
        return None
    from local_cluster import demo_data

    demo_data.build(cluster.fsx / "data/tokenized/sample")
    root = f"benchmarks/training-{uuid.uuid4().hex[:8]}"
    (cluster.fsx / root).mkdir(parents=True)  # model1's, as the node setup makes its folders: its job runs as model1
    give_to("model1", cluster.fsx / root)
    # The two local "nodes" share this machine's cores: one thread per worker, as torchrun sets
    # on the host fallback, instead of each node's worker using every core.
    env = {**job_folders(cluster.fsx, root), "OMP_NUM_THREADS": "1"}  # a model's job takes FSX_* from cluster.env
    job = cluster.sbatch("jobs/train_model1.sh", *overrides(steps), env=env, options=["--nodes=2", "--gpus-per-node=0"],
                         user="model1")
    try:
        state, code = cluster.wait(job, timeout=900)
        if (state, code) != ("COMPLETED", 0):
            raise RuntimeError(f"benchmark job {job} ended {state} (exit {code}); see /fsx/logs/model1/model1_{job}.err")
        metrics = cluster.fsx / root / "logs/model1/metrics.jsonl"
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
    finally:
        subprocess.run(["scancel", job], check=False)
        shutil.rmtree(cluster.fsx / root, ignore_errors=True)
    return _summary(records, f"local Slurm cluster, sbatch jobs/train_model1.sh, 2 nodes x 1 worker (job {job})")


def _on_host(tmp: Path, steps: int) -> dict:
    from local_cluster import demo_data

    data = demo_data.build(tmp / "data/tokenized/sample").path
    env = {**os.environ, "PYTHONPATH": str(REPO / "jobs"), "FSX_DATA": str(tmp / "data"),
           "FSX_CHECKPOINTS": str(tmp / "checkpoints"), "FSX_LOGS": str(tmp / "logs")}
    subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node=2",
                    "-m", "training.train", *overrides(steps), f"data.path={data}"], env=env, cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = [json.loads(line) for line in (tmp / "logs/model1/metrics.jsonl").read_text().splitlines()]
    return _summary(records, "torchrun, 2 processes on this host (the local Slurm cluster was not up)")


def run(tmp: Path, steps: int) -> dict:
    return _on_slurm(steps) or _on_host(tmp, steps)
