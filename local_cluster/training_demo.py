"""Demo on the local Slurm cluster: dev's two models side by side on their shares, one interrupted and
resumed, then each model's node-hours from the accounting database.

    .venv/bin/python -m local_cluster.training_demo      (from the repository root, cluster up)

1. builds dev's dataset on the stand-in FSx (/fsx/data/tokenized/sample, its tokenizer beside it) and
   clears the stand-in's checkpoints and metrics of model1 and model2 for a fresh run;
2. a submission its preflight refuses (model1 at seq_len 256; the data holds 128): no node is taken;
3. ``bash jobs/submit.sh model1`` (2 nodes) and ``model2`` (1 node): each passes its preflight and
   runs on its share, under its own Slurm account and QOS, at the same time;
4. a second model1 job pends (QOSGrpJobsLimit) and a 3-node model1 job is refused at submission;
5. at step 20 sends model1 SIGUSR1, as ``--signal=USR1@600`` does before the time limit: the
   workers save, the job requeues itself and resumes from that checkpoint;
6. writes each loss curve to /fsx/logs/<model>/loss.png and prints ``jobs/usage.sh``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cli import ArgumentParser
from training import plot
from training.status import read_metrics

from . import demo_data
from .client import HARNESS_ENV, REPO, job_records, wait_for_job

SHARE_LIMITS = ("QOSGrpJobsLimit", "QOSGrpNodeLimit", "QOSMaxJobsPerUserLimit")


def run(cmd: list[str], env: dict, check: bool = True) -> subprocess.CompletedProcess:
    print("$", " ".join(cmd))
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {result.returncode}): {result.stderr.strip()}")
    return result


def submit(model: str, *overrides: str, env: dict) -> str:
    """``bash jobs/submit.sh``: the preflight, then sbatch; returns the job id."""
    result = run(["bash", "jobs/submit.sh", model, *overrides], env)
    print("  " + result.stdout.strip().replace("\n", "\n  "))
    return re.search(r"Submitted batch job (\d+)", result.stdout).group(1)


def pending_reason(job: str, timeout: float = 30) -> str:
    """The reason Slurm gives for holding ``job`` back, once its scheduler has looked at it."""
    deadline = time.monotonic() + timeout
    reason = ""
    while time.monotonic() < deadline:
        reason = job_records(job)[0].get("Reason", "")
        if reason in SHARE_LIMITS:
            break
        time.sleep(0.5)
    return reason


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m local_cluster.training_demo", description=__doc__.splitlines()[0])
    parser.add_argument("--fsx", default=str(REPO / ".local_cluster/fsx"), help="host folder mounted on /fsx in the nodes")
    parser.add_argument("--steps", type=int, default=60, help="model1's steps (model2 trains half as many)")
    parser.add_argument("--interrupt-at", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    fsx = Path(args.fsx)

    demo_data.build(fsx / "data/tokenized/sample")
    for model in ("model1", "model2"):
        shutil.rmtree(fsx / "checkpoints" / model, ignore_errors=True)  # the local stand-in only
        (fsx / "logs" / model).mkdir(parents=True, exist_ok=True)  # Slurm does not create it
        (fsx / "logs" / model / "metrics.jsonl").unlink(missing_ok=True)
    # What the head node has: the file systems at their paths (here the stand-in's host paths, which the
    # nodes see too), the jobs' venv; no GPUs on these nodes.
    env = {**os.environ, **HARNESS_ENV, "JOBS_VENV": os.environ.get("JOBS_VENV", str(REPO / ".venv")),
           "FSX_DATA": str(fsx / "data"), "FSX_CHECKPOINTS": str(fsx / "checkpoints"), "FSX_LOGS": str(fsx / "logs"),
           "SBATCH_GPUS_PER_NODE": "0"}
    ok = True

    print("\n-- a submission its preflight refuses: no node is taken")
    refused = run(["bash", "jobs/submit.sh", "model1", "data.seq_len=256"], env, check=False)
    print("  " + refused.stderr.strip().replace("\n", "\n  "))
    ok &= refused.returncode == 2

    print("\n-- model1 (2 nodes) and model2 (1 node), each on its share")
    model1 = submit("model1", f"train.steps={args.steps}", "log.interval=1", env=env)
    model2 = submit("model2", f"train.steps={args.steps // 2}", "log.interval=1", env=env)

    print("\n-- a second model1 job waits for the first; more nodes than model1's share are refused")
    duplicate = submit("model1", env=env)
    reason = pending_reason(duplicate)
    oversize = run(["sbatch", "--nodes=3", "jobs/train_model1.sh"], env, check=False)
    print(run(["squeue", "-o", "%.6i %.8a %.8q %.3D %.9T %r"], env).stdout.rstrip())
    print(f"sbatch --nodes=3 jobs/train_model1.sh: {oversize.stderr.strip()}")
    run(["scancel", duplicate], env)
    ok &= reason in SHARE_LIMITS and oversize.returncode != 0

    metrics = fsx / "logs/model1/metrics.jsonl"
    interrupted = False

    def interrupt_once_at_step() -> None:
        nonlocal interrupted
        steps = [r["step"] for r in read_metrics(metrics) if "loss" in r]
        if not interrupted and steps and max(steps) >= args.interrupt_at:
            print(f"\nstep {max(steps)}: scancel --signal=USR1 {model1}  (what --signal=USR1@600 does before the time limit)")
            subprocess.run(["scancel", "--signal=USR1", model1], check=True)
            interrupted = True

    try:
        wait_for_job(model1, args.timeout, on_poll=interrupt_once_at_step)
        wait_for_job(model2, args.timeout)
    except TimeoutError as exc:
        print(f"problem: {exc}", file=sys.stderr)
        return 1
    for model, job in (("model1", model1), ("model2", model2)):
        fields = job_records(job)[0]
        losses = {r["step"]: r["loss"] for r in read_metrics(fsx / f"logs/{model}/metrics.jsonl") if "loss" in r}
        png = plot.plot(fsx / f"logs/{model}/metrics.jsonl", fsx / f"logs/{model}/loss.png",
                        title=f"{model} (dev, tiny preset), {fields['NumNodes']} node(s), job {job}")
        print(f"\n{model} job {job}: {fields['JobState']} exit {fields.get('ExitCode')}, restarts {fields.get('Restarts')}, "
              f"account {fields.get('Account')}")
        if losses:
            first, last = min(losses), max(losses)
            print(f"  loss {losses[first]:.3f} at step {first} -> {losses[last]:.3f} at step {last}")
        print(f"  training log (progress, stderr): {fsx}/logs/{model}/{model}_{job}.err; the job's start and end: .out; "
              f"checkpoints: {fsx}/checkpoints/{model}")
        print(f"  loss curve: {png}")
        ok &= fields["JobState"] == "COMPLETED"

    print("\n-- usage per model, from the accounting database")
    print(run(["bash", "jobs/usage.sh", "-t", "minutes"], env).stdout.rstrip())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
