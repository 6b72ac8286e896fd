"""Demo on the local two-node Slurm cluster: train, get interrupted, requeue, resume, plot.

    .venv/bin/python -m local_cluster.training_demo      (from the repository root, cluster up)

1. builds the tiny dataset on the stand-in FSx (/fsx/data/tokenized-sample) and the log folder
   Slurm needs (/fsx/logs/model1); clears the stand-in's /fsx/checkpoints/model1 for a fresh run;
2. ``sbatch --nodes=2 --gpus-per-node=0 jobs/train_model1.sh --config jobs/training/configs/tiny.yaml``;
3. at step 20 sends SIGUSR1 to the job's steps, as ``--signal=USR1@600`` does before the time
   limit: the workers save, the job requeues itself and resumes from that checkpoint;
4. writes the loss curve to /fsx/logs/model1/loss.png (on the host: .local_cluster/fsx/...).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from cli import ArgumentParser
from training import plot

from . import demo_data
from .client import REPO, job_records, wait_for_job


def records(metrics: Path) -> list[dict]:
    return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m local_cluster.training_demo", description=__doc__.splitlines()[0])
    parser.add_argument("--fsx", default=str(REPO / ".local_cluster/fsx"), help="host folder mounted on /fsx in the nodes")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--interrupt-at", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    fsx = Path(args.fsx)

    demo_data.build(fsx / "data/tokenized-sample")
    (fsx / "logs/model1").mkdir(parents=True, exist_ok=True)
    shutil.rmtree(fsx / "checkpoints/model1", ignore_errors=True)  # the local stand-in only
    metrics = fsx / "logs/model1/metrics.jsonl"
    metrics.unlink(missing_ok=True)

    env = {**os.environ, "JOBS_VENV": os.environ.get("JOBS_VENV", str(REPO / ".venv"))}
    cmd = ["sbatch", "--parsable", "--nodes=2", "--gpus-per-node=0", "jobs/train_model1.sh",
           "--config", "jobs/training/configs/tiny.yaml", f"train.steps={args.steps}", "log.interval=1"]
    print("$", " ".join(cmd))
    job = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.strip().split(";")[0]

    interrupted = False

    def interrupt_once_at_step() -> None:
        nonlocal interrupted
        steps = [r["step"] for r in records(metrics) if "loss" in r]
        if not interrupted and steps and max(steps) >= args.interrupt_at:
            print(f"step {max(steps)}: scancel --signal=USR1 {job}  (what --signal=USR1@600 does before the time limit)")
            subprocess.run(["scancel", "--signal=USR1", job], check=True)
            interrupted = True

    try:
        wait_for_job(job, args.timeout, on_poll=interrupt_once_at_step)
    except TimeoutError as exc:
        print(f"problem: {exc}", file=sys.stderr)
        return 1
    fields = job_records(job)[0]
    losses = {r["step"]: r["loss"] for r in records(metrics) if "loss" in r}
    png = plot.plot(metrics, fsx / "logs/model1/loss.png", title=f"model1 (tiny preset), 2 nodes, job {job}")
    print(f"job {job}: {fields['JobState']} exit {fields.get('ExitCode')}, restarts {fields.get('Restarts')}")
    if losses:
        first, last = min(losses), max(losses)
        print(f"loss {losses[first]:.3f} at step {first} -> {losses[last]:.3f} at step {last}")
    print(f"training log (progress, stderr): {fsx}/logs/model1/model1_{job}.err; the job's start and end: .out; "
          f"checkpoints: {fsx}/checkpoints/model1")
    print(f"loss curve: {png}")
    return 0 if fields["JobState"] == "COMPLETED" else 1


if __name__ == "__main__":
    sys.exit(main())
