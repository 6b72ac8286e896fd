"""Slurm accounting on the local cluster: slurmdbd + MariaDB, one account and QOS per model.

dev's models (cluster_config/dev.yaml) give model1 two nodes and model2 one (node_scripts/slurm_accounts.sh makes
their accounts and QOS, as on the head node). Jobs are short sleeps: what is tested is Slurm's
scheduling and bookkeeping, not the payload.
"""

from __future__ import annotations

import subprocess
import time

import pytest

pytestmark = pytest.mark.slurm

PENDING_ON_SHARE = {"QOSGrpJobsLimit", "QOSGrpNodeLimit", "QOSMaxJobsPerUserLimit"}


def run(*cmd: str) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{' '.join(cmd)}: {result.stderr}"
    return result.stdout


def submit(cluster, model: str, nodes: int, seconds: int) -> str:
    return cluster.sbatch("--wrap", f"sleep {seconds}", options=[
        f"--account={model}", f"--qos={model}", f"--nodes={nodes}", "--exclusive",
        f"--job-name={model}-sleep", "--output=/dev/null"])


def state(job: str) -> tuple[str, str]:
    out = run("squeue", "-h", "-j", job, "-o", "%T %r").split()
    return (out[0], out[1]) if out else ("GONE", "")


def wait_state(job: str, want: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while state(job)[0] != want:
        assert time.monotonic() < deadline, f"job {job} not {want} after {timeout} s: {state(job)}"
        time.sleep(0.5)


@pytest.fixture
def cancel_after(slurm_cluster):
    jobs: list[str] = []
    yield jobs
    if jobs:
        subprocess.run(["scancel", *jobs], capture_output=True)
        for job in jobs:
            slurm_cluster.wait(job, timeout=60)


def sbatch_raw(cluster, *options: str) -> subprocess.CompletedProcess:
    # sbatch itself, to see its refusal (LocalCluster.sbatch raises on any failure).
    return subprocess.run(["sbatch", "--parsable", *options, "--output=/dev/null", "--wrap", "sleep 1"],
                          cwd=cluster.repo, env=cluster.env, capture_output=True, text=True, timeout=60)


def test_a_models_second_job_waits_for_its_first(slurm_cluster, cancel_after):
    first = submit(slurm_cluster, "model1", 2, 60)
    cancel_after.append(first)
    wait_state(first, "RUNNING")
    second = submit(slurm_cluster, "model1", 1, 5)
    cancel_after.append(second)
    # One idle node is left, but the second job is model1's and model1 already runs its one job.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        job_state, reason = state(second)
        assert job_state == "PENDING", (job_state, reason)
        time.sleep(1)
    assert reason in PENDING_ON_SHARE, reason
    print(run("squeue", "-o", "%.6i %.9P %.14j %.8a %.8q %.8T %.4D %R"))


def test_two_models_run_side_by_side_on_their_shares(slurm_cluster, cancel_after):
    model1 = submit(slurm_cluster, "model1", 2, 6)
    model2 = submit(slurm_cluster, "model2", 1, 6)
    cancel_after.extend([model1, model2])
    wait_state(model1, "RUNNING")
    wait_state(model2, "RUNNING")  # both at once: 2 + 1 nodes of the 3
    for job in (model1, model2):
        assert slurm_cluster.wait(job, timeout=60) == ("COMPLETED", 0)
    # sacct reads the database: each job under its model's account and QOS, with its nodes.
    rows = {}
    deadline = time.monotonic() + 30
    while len(rows) < 2 and time.monotonic() < deadline:  # the controller sends the end record async
        out = run("sacct", "-X", "-n", "-P", "-j", f"{model1},{model2}",
                  "--format=JobID,Account,QOS,NNodes,ElapsedRaw,State")
        rows = {r.split("|")[0]: r.split("|")[1:] for r in out.splitlines() if r.endswith("|COMPLETED")}
        time.sleep(1)
    assert rows[model1][:3] == ["model1", "model1", "2"]
    assert rows[model2][:3] == ["model2", "model2", "1"]
    assert int(rows[model1][3]) >= 5 and int(rows[model2][3]) >= 5
    usage = run("bash", str(slurm_cluster.repo / "jobs" / "usage.sh"))  # node-hours per account, from sacct
    assert "model1" in usage and "model2" in usage


def test_a_job_beyond_the_models_share_is_refused_at_submission(slurm_cluster):
    refused = sbatch_raw(slurm_cluster, "--account=model2", "--qos=model2", "--nodes=2")
    assert refused.returncode != 0
    assert "QOS" in refused.stderr or "policy" in refused.stderr, refused.stderr


def test_a_model_cannot_borrow_another_models_qos(slurm_cluster):
    refused = sbatch_raw(slurm_cluster, "--account=model2", "--qos=model1", "--nodes=1")
    assert refused.returncode != 0
    assert "qos" in refused.stderr.lower(), refused.stderr


def test_jobs_without_an_account_run_under_ops(slurm_cluster):
    job = slurm_cluster.sbatch("--wrap", "true", options=["--output=/dev/null"])
    assert slurm_cluster.wait(job, timeout=60) == ("COMPLETED", 0)
    assert slurm_cluster.jobs(job)[0]["Account"] == "ops"


def test_accounting_survives_a_cluster_restart(slurm_cluster):
    job = slurm_cluster.sbatch("--wrap", "true", options=["--account=model2", "--qos=model2", "--output=/dev/null"])
    assert slurm_cluster.wait(job, timeout=60) == ("COMPLETED", 0)
    slurm_cluster.down()
    slurm_cluster.up()
    deadline = time.monotonic() + 30
    while True:
        out = run("sacct", "-X", "-n", "-P", "-j", job, "--format=JobID,Account,State")
        if out.strip():
            break
        assert time.monotonic() < deadline, "the job's record is gone after down/up"
        time.sleep(1)
    assert out.strip() == f"{job}|model2|COMPLETED"
    assert "model1" in run("sacctmgr", "-n", "-P", "show", "qos", "format=name").split()


def test_a_removed_model_is_retired_with_its_history_and_can_come_back(slurm_cluster, tmp_path):
    script = slurm_cluster.repo / "node_scripts" / "slurm_accounts.sh"
    only_model1 = tmp_path / "models"
    only_model1.write_text("model1 2\n")
    try:
        run("bash", str(script), "--user", "root", str(only_model1))
        assert run("sacctmgr", "-n", "-P", "show", "qos", "model2", "format=GrpTRES,GrpJobs,MaxTRES").strip() == \
            "node=0|0|node=0"
        deadline = time.monotonic() + 15  # slurmdbd pushes the change to slurmctld
        while (refused := sbatch_raw(slurm_cluster, "--account=model2", "--qos=model2", "--nodes=1")).returncode == 0:
            subprocess.run(["scancel", refused.stdout.strip()], capture_output=True)
            assert time.monotonic() < deadline, "a retired model's job was accepted"
            time.sleep(1)
        assert "QOS" in refused.stderr or "policy" in refused.stderr, refused.stderr
        # The account stays, so its history does: sacct still answers for it.
        assert run("sacctmgr", "-n", "-P", "show", "account", "model2", "format=Account,Descr").strip() == \
            "model2|retired: not in the model list"
    finally:
        run("bash", str(script), "--user", "root", str(slurm_cluster.repo / "local_cluster" / "models"))
    job = submit(slurm_cluster, "model2", 1, 1)
    assert slurm_cluster.wait(job, timeout=60) == ("COMPLETED", 0)
