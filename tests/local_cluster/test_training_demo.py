"""make demo's training step on the local cluster (local_cluster/training_demo.py): dev's model1 and model2, each
submitted by its own user through a Session Manager-like login, side by side on their shares, model1 interrupted
once by the time-limit signal and resumed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from local_cluster.client import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_each_model_is_submitted_by_its_user_requeues_and_writes_its_loss_curve(slurm_cluster):
    fsx = slurm_cluster.fsx
    result = subprocess.run([sys.executable, "-m", "local_cluster.training_demo", "--steps", "30", "--interrupt-at", "10"],
                            cwd=REPO, env={**slurm_cluster.env, "PYTHONPATH": str(REPO / "jobs")},
                            capture_output=True, text=True, timeout=900)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    # Typed as each model's user, from the folder the runbook names; refused, held and refused again as that user.
    assert "[model1@head /opt/llm-jobs/bundle]$ SBATCH_GPUS_PER_NODE=0 CLUSTER_ENV=/dev/null bash jobs/submit.sh model1 train.steps=30" in out
    assert "[model2@head /opt/llm-jobs/bundle]$ SBATCH_GPUS_PER_NODE=0 CLUSTER_ENV=/dev/null bash jobs/submit.sh model2" in out
    assert "data.seq_len=256" in out and "error:" in out  # the preflight's refusal, printed
    jobs = dict(re.findall(r"\n(model[12]) job (\d+): COMPLETED exit 0:0", out))
    assert set(jobs) == {"model1", "model2"}, out
    assert re.search(r"model1 job \d+: COMPLETED exit 0:0, restarts 1, user model1, account model1", out), out
    assert re.search(r"model2 job \d+: COMPLETED exit 0:0, restarts 0, user model2, account model2", out), out
    for model, job in jobs.items():  # the accounting database agrees: each ran as its model's user, under its account
        record = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "--format=User,Account"], capture_output=True,
                                text=True, check=True).stdout.split()[0]
        assert record == f"{model}|{model}", record
        assert (fsx / f"checkpoints/{model}/STATUS").owner() == model
    png = fsx / "logs/model1/loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
