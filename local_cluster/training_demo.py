"""Demo on the local Slurm cluster: dev's two models side by side on their shares, each submitted by its own
user as the runbook has it, one interrupted and resumed, then each model's node-hours from the accounting
database.

    .venv/bin/python -m local_cluster.training_demo      (from the repository root, cluster up, as root)

1. builds dev's dataset on the stand-in FSx (/fsx/data/tokenized/sample, its tokenizer beside it) and
   empties the stand-in's checkpoints and metrics of model1 and model2 for a fresh run (the folders, their
   model users', stay);
2. every submission is typed into a Session Manager-like login (``local_cluster/cluster.sh login``, as
   ssm-user), after ``sudo su - <model>`` and ``cd /opt/llm-jobs/bundle``, with two local departures typed
   where they apply: ``SBATCH_GPUS_PER_NODE=0`` (no GPUs here) and ``CLUSTER_ENV=/dev/null`` (no deployment
   buckets: no backup is queued);
3. a submission its preflight refuses (model1 at seq_len 256; the data holds 128): no node is taken;
4. ``bash jobs/submit.sh model1`` (2 nodes) and ``model2`` (1 node), each as its own user: each passes its
   preflight and runs on its share, under its own Slurm account and QOS, at the same time;
5. a second model1 job pends (QOSGrpJobsLimit) and a 3-node model1 job is refused at submission;
6. at step 20 sends model1 SIGUSR1, as ``--signal=USR1@600`` does before the time limit: the
   workers save, the job requeues itself and resumes from that checkpoint;
7. writes each loss curve to /fsx/logs/<model>/loss.png and prints ``jobs/usage.sh``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from cli import ArgumentParser
from training import plot
from training.status import read_metrics

from . import demo_data
from . import client
from .client import REPO, job_records, submitted, wait_for_job

SHARE_LIMITS = ("QOSGrpJobsLimit", "QOSGrpNodeLimit", "QOSMaxJobsPerUserLimit")


# Typed before each submission: the local departures (module docstring).
LOCAL = "SBATCH_GPUS_PER_NODE=0 CLUSTER_ENV=/dev/null"


def as_user(user: str, typed: str, check: bool = True) -> subprocess.CompletedProcess:
    """``typed`` in a login on the head node after ``sudo su - <user>`` and ``cd /opt/llm-jobs/bundle``;
    shows what was typed and what the shell printed."""
    print(f"[{user}@head /opt/llm-jobs/bundle]$ {typed}")
    result = client.as_user(user, typed)
    shown = result.stderr.strip().splitlines()[1:]  # after the prompt line as_user.sh prints
    for line in result.stdout.strip().splitlines() + shown:
        print("  " + line)
    if check and result.returncode != 0:
        raise RuntimeError(f"{user}: {typed} failed (exit {result.returncode})")
    return result


def submit(model: str, *overrides: str) -> str:
    """``bash jobs/submit.sh`` as the model's user: the preflight, then sbatch; returns the job id."""
    return submitted(as_user(model, " ".join([LOCAL, "bash jobs/submit.sh", model, *overrides])))


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
        for entry in (fsx / "checkpoints" / model).glob("*"):  # the local stand-in only; the folder is the model's
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        (fsx / "logs" / model / "metrics.jsonl").unlink(missing_ok=True)
        # What root's runs left in the model's folders (the alert drills, an earlier demo's) becomes the model's,
        # as the head node's boot does with an earlier release's files: its jobs write there as its user.
        subprocess.run(["chown", "-R", f"{model}:{model}", fsx / "checkpoints" / model, fsx / "logs" / model], check=True)
    ok = True

    print("\n-- a submission its preflight refuses: no node is taken")
    refused = as_user("model1", f"{LOCAL} bash jobs/submit.sh model1 data.seq_len=256", check=False)
    ok &= refused.returncode == 2

    print("\n-- model1 (2 nodes) and model2 (1 node), each by its own user, on its share")
    model1 = submit("model1", f"train.steps={args.steps}", "log.interval=1")
    model2 = submit("model2", f"train.steps={args.steps // 2}", "log.interval=1")

    print("\n-- a second model1 job waits for the first; more nodes than model1's share are refused")
    duplicate = submit("model1")
    reason = pending_reason(duplicate)
    oversize = as_user("model1", f"{LOCAL} sbatch --nodes=3 jobs/train_model1.sh", check=False)
    print(subprocess.run(["squeue", "-o", "%.6i %.8u %.8a %.8q %.3D %.9T %r"], capture_output=True, text=True).stdout.rstrip())
    as_user("model1", f"scancel {duplicate}")
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
              f"user {fields.get('UserId', '').split('(')[0]}, account {fields.get('Account')}")
        if losses:
            first, last = min(losses), max(losses)
            print(f"  loss {losses[first]:.3f} at step {first} -> {losses[last]:.3f} at step {last}")
        print(f"  training log (progress, stderr): {fsx}/logs/{model}/{model}_{job}.err; the job's start and end: .out; "
              f"checkpoints: {fsx}/checkpoints/{model}")
        print(f"  loss curve: {png}")
        ok &= fields["JobState"] == "COMPLETED"

    print("\n-- usage per model, from the accounting database")
    as_user(client.CLUSTER_USER, "bash jobs/usage.sh -t minutes")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
