"""Slurm accounting on the local cluster: slurmdbd + MariaDB, one account and QOS per model.

dev's models (cluster_config/dev.yaml) give model1 two nodes and model2 one (node_scripts/slurm_accounts.sh makes
their accounts and QOS, as on the head node). Jobs are short sleeps: what is tested is Slurm's
scheduling and bookkeeping, not the payload.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections import defaultdict
from datetime import datetime, timedelta

import pytest

from cluster_config.render import models_file
from cluster_config.settings import load_settings
from local_cluster.client import CLUSTER_USER

pytestmark = pytest.mark.slurm

PENDING_ON_SHARE = {"QOSGrpJobsLimit", "QOSGrpNodeLimit", "QOSMaxJobsPerUserLimit"}


def run(*cmd: str) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{' '.join(cmd)}: {result.stderr}"
    return result.stdout


def submit(cluster, model: str, nodes: int, seconds: int) -> str:
    return cluster.sbatch("--wrap", f"sleep {seconds}", user=model, options=[
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


def sreport_node_seconds(window_start: str) -> tuple[str, str, dict[str, int]]:
    """sreport's job report for the hour from WINDOW_START: (start, end) as sreport printed them and
    node-seconds per account. Job reports read the job records, not slurmdbd's hourly roll-up.
    An hour without a job record yet (minutes after it began) is empty: sreport then stops with
    "We need a grouping list to set up the print." (exit 1)."""
    cmd = ("sreport", "-P", "-t", "seconds", "-T", "node", "job", "SizesByAccount", "FlatView",
           "grouping=individual", f"start={window_start}", "end=now")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if result.returncode == 1 and "We need a grouping list" in result.stderr:
        return window_start, time.strftime("%Y-%m-%dT%H:%M:%S"), {}
    assert result.returncode == 0, f"{' '.join(cmd)}: {result.stderr}"
    out = result.stdout
    start, last = re.search(r"^Job Sizes (\S+) - (\S+) ", out, re.M).groups()  # last: end - 1 s
    end = (datetime.fromisoformat(last) + timedelta(seconds=1)).isoformat()
    header, *rows = [line.split("|") for line in out.splitlines() if "|" in line]
    assert header[:2] == ["Cluster", "Account"] and header[-1] == "% of cluster", header
    return start, end, {row[1]: sum(int(v) for v in row[2:-1]) for row in rows}


def sacct_node_seconds(start: str, end: str) -> dict[str, int]:
    # -T: each job cut to the window, as sreport does; -D: every run of a requeued job, as sreport
    # counts them (without it sacct shows only the last run). Finished jobs only, so "now" does not move.
    out = run("sacct", "-X", "-D", "-a", "-n", "-P", "-T", "-S", start, "-E", end, "--format=Account,NNodes,ElapsedRaw,State")
    usage: dict[str, int] = defaultdict(int)
    for account, nodes, elapsed, job_state in (line.split("|") for line in out.splitlines()):
        assert job_state not in ("RUNNING", "PENDING"), out
        usage[account] += int(nodes) * int(elapsed)
    # sreport lists no account whose jobs add up to 0 s (an srun that ended within the second).
    return {account: seconds for account, seconds in usage.items() if seconds}


def test_sreport_shows_each_models_node_time_of_this_hour_as_sacct_does(slurm_cluster):
    # model1's job is requeued once (as recovery does): sreport counts both runs, and so must sacct.
    now = time.localtime()
    if now.tm_min >= 58:  # the jobs must run within one hour
        time.sleep((60 - now.tm_min) * 60 - now.tm_sec + 1)
    hour = time.strftime("%Y-%m-%dT%H:00:00")
    before = sreport_node_seconds(hour)[2]
    model1 = submit(slurm_cluster, "model1", 2, 8)
    model2 = submit(slurm_cluster, "model2", 1, 8)
    wait_state(model1, "RUNNING")
    time.sleep(3)
    run("scontrol", "requeue", model1)
    for job in (model1, model2):
        assert slurm_cluster.wait(job, timeout=90) == ("COMPLETED", 0)
    deadline = time.monotonic() + 30
    while True:  # the controller sends the end records to slurmdbd asynchronously
        start, end, by_sreport = sreport_node_seconds(hour)
        by_sacct = sacct_node_seconds(start, end)
        grown = all(by_sreport.get(m, 0) - before.get(m, 0) >= 8 * n for m, n in (("model1", 2), ("model2", 1)))
        if grown and by_sreport == by_sacct:
            break
        assert time.monotonic() < deadline, f"sreport {start}-{end}: {by_sreport}, before {before}; sacct: {by_sacct}"
        time.sleep(1)
    print(f"node-seconds {start} - {end}: sreport {by_sreport}, sacct {by_sacct}")
    runs = run("sacct", "-X", "-D", "-n", "-P", "-j", model1, "--format=JobID,State").split()
    assert len(runs) == 2 and runs[0].endswith("|REQUEUED"), runs  # the first run, kept by -D
    # usage.sh prints both, and says the roll-up (sreport cluster ...) has complete hours only;
    # from the previous hour, so that its window holds one complete hour.
    previous = (datetime.fromisoformat(hour) - timedelta(hours=1)).isoformat()
    usage = run("bash", str(slurm_cluster.repo / "jobs" / "usage.sh"), "-t", "minutes", previous)
    print(usage)
    sacct_part, rollup_part, job_part = usage.split("\n\n")
    assert re.search(r"^  model1 +\d+ +\d+\.\d{4}$", sacct_part, re.M), usage
    assert "complete hours only" in rollup_part and "Cluster/Account/User Utilization" in rollup_part, usage
    assert "Job Sizes" in job_part and "TRES type is node" in job_part, usage
    assert re.search(r"^ *\S+ +model1 ", job_part, re.M) and re.search(r"^ *\S+ +model2 ", job_part, re.M), usage


def test_cluster_sh_rollup_puts_this_hours_usage_into_sreports_cluster_report(slurm_cluster):
    # sreport cluster AccountUtilizationByUser reads slurmdbd's hourly roll-up: nothing of the hour in
    # progress until `cluster.sh rollup` runs that roll-up over it.
    now = time.localtime()
    if now.tm_min == 59 and now.tm_sec > 15:  # the jobs and the roll-up must fall in one hour
        time.sleep(61 - now.tm_sec)
    hour = time.strftime("%Y-%m-%dT%H:00:00")
    jobs = {model: submit(slurm_cluster, model, nodes, 5) for model, nodes in (("model1", 2), ("model2", 1))}
    for job in jobs.values():
        assert slurm_cluster.wait(job, timeout=60) == ("COMPLETED", 0)
    deadline = time.monotonic() + 30
    while run("sacct", "-X", "-n", "-P", "-j", ",".join(jobs.values()), "--format=State").split() != ["COMPLETED"] * 2:
        assert time.monotonic() < deadline, "the end records did not reach slurmdbd"  # sent asynchronously
        time.sleep(1)
    assert not run("squeue", "-h", "-t", "running,completing"), "a running job would count to the hour's end"
    rolled = run(str(slurm_cluster.repo / "local_cluster" / "cluster.sh"), "rollup")
    assert f"rolled up {hour} to now" in rolled, rolled
    out = run("sreport", "-P", "-t", "seconds", "-T", "node", "cluster", "AccountUtilizationByUser",
              f"start={hour}", "end=now")
    print(out)
    start, last = re.search(r"^Cluster/Account/User Utilization (\S+) - (\S+) ", out, re.M).groups()
    end = (datetime.fromisoformat(last) + timedelta(seconds=1)).isoformat()
    # Account lines have no login; user lines repeat the account with a login.
    by_rollup = {r[1]: int(r[5]) for r in (line.split("|") for line in out.splitlines())
                 if len(r) == 6 and r[0] != "Cluster" and not r[2] and r[1] != "root"}
    by_sacct = sacct_node_seconds(start, end)
    for model in jobs:
        assert by_rollup.get(model) == by_sacct[model] and by_sacct[model] >= 5, (model, by_rollup, by_sacct)


def test_a_job_beyond_the_models_share_is_refused_at_submission(slurm_cluster):
    refused = sbatch_raw(slurm_cluster, "--account=model2", "--qos=model2", "--nodes=2")
    assert refused.returncode != 0
    assert "QOS" in refused.stderr or "policy" in refused.stderr, refused.stderr


def test_a_model_cannot_borrow_another_models_qos(slurm_cluster):
    refused = sbatch_raw(slurm_cluster, "--account=model2", "--qos=model1", "--nodes=1")
    assert refused.returncode != 0
    assert "qos" in refused.stderr.lower(), refused.stderr


def test_jobs_without_an_account_run_under_ops(slurm_cluster):
    job = slurm_cluster.sbatch("--wrap", "true", options=["--output=/dev/null"], user=CLUSTER_USER)
    assert slurm_cluster.wait(job, timeout=60) == ("COMPLETED", 0)
    assert slurm_cluster.jobs(job)[0]["Account"] == "ops"


def test_accounting_survives_a_cluster_restart(slurm_cluster):
    job = slurm_cluster.sbatch("--wrap", "true", options=["--account=model2", "--qos=model2", "--output=/dev/null"],
                               user="model2")
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
        run("bash", str(script), "--admin", "root", str(only_model1))
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
        dev_models = tmp_path / "dev-models"  # back to what `up` set: dev's models (cluster_config/dev.yaml)
        dev_models.write_text(models_file(load_settings("dev")))
        run("bash", str(script), "--admin", "root", str(dev_models))
    job = submit(slurm_cluster, "model2", 1, 1)
    assert slurm_cluster.wait(job, timeout=60) == ("COMPLETED", 0)
