"""`sbatch jobs/train_model1.sh` on the real local two-node Slurm cluster (CPU, tiny preset).

Each job gets its own checkpoint and metrics folders under /fsx/tests/ (FSX_CHECKPOINTS and
FSX_LOGS from a cluster.env of root's: local_cluster/client.py job_folders); Slurm's own output goes to /fsx/logs/model1/ as in
production, which the test creates first because Slurm does not.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import boto3
import pytest

from tests.s3_server import FAKE_AWS_ENV, s3_server
from local_cluster import demo_data
from local_cluster.client import controller_address, give_to, hostnames, job_folders
from local_cluster.training_job import worker_pids

pytestmark = [pytest.mark.slurm, pytest.mark.any_cluster]

# 24 steps of the tiny config on 2 nodes; every step logged, so runs compare step by step. Enough for the
# interrupted run: USR1 after step 8 (it stops a step or two later), a rank killed 6 steps after the resume,
# the relaunch from the step-10 or step-20 checkpoint, and steps after it. The killed rank's peer may wait in
# its collective (gloo does not always see a peer vanish) until the watchdog's floor: 8 s, not the preset's 30.
STEPS = 24
OVERRIDES = ("--config", "jobs/training/configs/tiny.yaml", f"train.steps={STEPS}", "checkpoint.every=10",
             "log.interval=1", "optim.warmup_steps=5", "train.watchdog_floor_s=8")
OPTIONS = ["--nodes=2", "--gpus-per-node=0"]  # the local nodes have CPUs only


SUBMITTED: list[str] = []  # cancelled at the end of the module, so a failed test leaves no job behind


class Job:
    def __init__(self, cluster, name: str):
        self.cluster = cluster
        self.root = f"tests/training/{name}-{uuid.uuid4().hex[:8]}"
        self.host_root = cluster.fsx / self.root
        self.id = ""

    def submit(self, **extra_env: str) -> "Job":
        self.env = env = {**job_folders(self.cluster.fsx, self.root), "OMP_NUM_THREADS": "1", **extra_env}
        self.host_root.mkdir(parents=True)  # the job's folder, its user's as the node setup makes model1's
        give_to("model1", self.host_root)
        self.id = self.cluster.sbatch("jobs/train_model1.sh", *OVERRIDES, env=env, options=OPTIONS, user="model1")
        SUBMITTED.append(self.id)
        return self

    def wait(self, timeout: float = 600) -> tuple[str, int]:
        return self.cluster.wait(self.id, timeout=timeout)

    @property
    def metrics(self) -> Path:
        return self.host_root / "logs/model1/metrics.jsonl"

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.metrics.read_text().splitlines()] if self.metrics.exists() else []

    def losses(self) -> dict[int, tuple[float, int]]:
        return {r["step"]: (r["loss"], r["samples_crc"]) for r in self.records() if "loss" in r}

    def log(self, ext: str) -> str:
        """The job's Slurm ``out`` (stdout) or ``err`` (stderr) file, as train_model1.sh names them."""
        path = self.cluster.fsx / f"logs/model1/model1_{self.id}.{ext}"
        return path.read_text() if path.exists() else ""

    def output(self) -> str:
        """The job's Slurm stdout then stderr (training logs go to stderr)."""
        return self.log("out") + self.log("err")

    def wait_until(self, what: str, done, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.records()):
            if time.monotonic() > deadline:
                pytest.fail(f"job {self.id}: no {what} within {timeout} s:\n{self.output()[-3000:]}")
            time.sleep(0.2)

    def wait_for_step(self, step: int) -> None:
        self.wait_until(f"step {step}", lambda records: any(r.get("step", 0) >= step and "loss" in r for r in records))

    def worker_pids(self) -> list[int]:
        return worker_pids(self.id)


@pytest.fixture(scope="module")
def fsx(slurm_cluster):
    demo_data.build(slurm_cluster.fsx / "data/tokenized/sample")
    (slurm_cluster.fsx / "logs/model1").mkdir(parents=True, exist_ok=True)  # Slurm won't create it
    yield slurm_cluster.fsx
    if SUBMITTED:
        subprocess.run(["scancel", *SUBMITTED], check=False)
    shutil.rmtree(slurm_cluster.fsx / "tests/training", ignore_errors=True)


@pytest.fixture(scope="module")
def s3(slurm_cluster):
    """moto_server on the controller's address, which the nodes reach over the cluster bridge."""
    with s3_server(controller_address()) as url:
        env = {**FAKE_AWS_ENV, "AWS_ENDPOINT_URL_S3": url}
        client = boto3.client("s3", endpoint_url=url, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        client.create_bucket(Bucket="checkpoints-test")
        yield client, env


# The nodes have no GPU: a stand-in nvidia-smi (the hardware boundary) lets the job start its GPU
# monitor, so the test can see it run on every node and stop with the job.
FAKE_NVIDIA_SMI = """#!/bin/bash
if [[ $1 == -L ]]; then echo "GPU 0: Stand-in GPU (UUID: GPU-0)"; exit 0; fi
echo "timestamp, index, utilization.gpu [%]"
while true; do echo "$(date '+%Y/%m/%d %H:%M:%S'), 0, 0 %"; sleep 1; done
"""


@pytest.fixture(scope="module")
def fake_gpu_bin(slurm_cluster):
    """A folder with the fake nvidia-smi, as the nodes see it: on /fsx, which model1's job may read (pytest's
    temporary folders are root's alone)."""
    name = f"tests/training/fake-gpu-bin-{uuid.uuid4().hex[:8]}"
    folder = slurm_cluster.fsx / name
    folder.mkdir(parents=True)
    (folder / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (folder / "nvidia-smi").chmod(0o755)
    yield f"/fsx/{name}"
    shutil.rmtree(folder)


@pytest.fixture(scope="module")
def uninterrupted(slurm_cluster, fsx, s3, fake_gpu_bin) -> Job:
    _, s3_env = s3
    path = f"{fake_gpu_bin}:{slurm_cluster.env['PATH']}"
    job = Job(slurm_cluster, "uninterrupted").submit(CHECKPOINT_S3_URI="s3://checkpoints-test/runs", PATH=path, **s3_env)
    state, code = job.wait()
    assert (state, code) == ("COMPLETED", 0), job.output()[-4000:]
    return job


def test_sbatch_trains_on_two_nodes_to_a_falling_loss(uninterrupted):
    losses = uninterrupted.losses()
    assert sorted(losses) == list(range(1, STEPS + 1))
    first, last = losses[1][0], losses[STEPS][0]
    assert last < first - 1.0, (first, last)
    out = uninterrupted.output()
    assert "model1 on 2 nodes x 1 workers" in out  # one per (stand-in) GPU
    # The start line names the config the trainer read: the copy of tiny.yaml in the job's code snapshot.
    logged = re.search(r"config (\S+), arguments: --config", out).group(1)
    snapshot = uninterrupted.host_root / f"logs/model1/code/{uninterrupted.id}"
    assert logged.startswith(f"/fsx/{uninterrupted.root}/logs/model1/code/{uninterrupted.id}/"), logged
    tiny = Path(__file__).resolve().parents[2] / "jobs/training/configs/tiny.yaml"
    assert (snapshot / Path(logged).name).read_text() == tiny.read_text()
    assert "status complete" in out
    # Where README and docs/training.md tell the user to watch: progress in .err, the job's own lines in .out.
    err, stdout = uninterrupted.log("err"), uninterrupted.log("out")
    assert f"step {STEPS}/{STEPS} (elapsed " in err and f"step {STEPS}/{STEPS}" not in stdout
    assert "model1 on 2 nodes" in stdout and "training ended: srun exit 0, status complete" in stdout
    assert (uninterrupted.host_root / "checkpoints/model1/STATUS").read_text() == "complete\n"


def test_gpu_monitor_runs_on_every_node_and_stops_with_the_job(slurm_cluster, uninterrupted, fake_gpu_bin):
    logs = uninterrupted.host_root / "logs/model1"
    # The nodes Slurm chose: after another test's drain, or a job still ending, not always node1 and node2.
    (record,) = slurm_cluster.jobs(uninterrupted.id)
    nodes = hostnames(record["NodeList"])
    assert len(nodes) == 2, record["NodeList"]
    for node in nodes:
        lines = (logs / f"gpu_{uninterrupted.id}_{node}.csv").read_text().splitlines()
        assert lines[0].startswith("timestamp") and len(lines) >= 2, lines
    assert _processes_running(str(fake_gpu_bin)) == []


def _processes_running(needle: str) -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if needle.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_final_checkpoint_is_backed_up_by_a_cpu_job_after_training_and_verified(slurm_cluster, uninterrupted, s3):
    client, _ = s3
    found = re.search(r"backup: job (\d+) ", uninterrupted.output())
    assert found, uninterrupted.output()[-3000:]
    backup_id = found.group(1)
    SUBMITTED.append(backup_id)
    state, code = slurm_cluster.wait(backup_id, timeout=300)
    backup_log = uninterrupted.host_root / f"logs/backups/model1/backup-model1_{backup_id}.out"
    assert (state, code) == ("COMPLETED", 0), backup_log.read_text()[-3000:] if backup_log.exists() else state
    (record,), (training,) = slurm_cluster.jobs(backup_id), slurm_cluster.jobs(uninterrupted.id)
    # Its own single-node job on the CPU queue, started only once the training allocation had ended.
    assert (record["Partition"], record["NumNodes"], record["JobName"]) == ("cpu", "1", "backup-model1")
    assert record["StartTime"] >= training["EndTime"], (record["StartTime"], training["EndTime"])
    assert "backed up and verified" not in uninterrupted.output()
    local = uninterrupted.host_root / f"checkpoints/model1/step_{STEPS:08d}"
    logs = [p for p in (uninterrupted.host_root / "logs/model1").rglob("*") if p.is_file()]
    n = len(list(local.iterdir())) + len(logs)
    assert f"backed up and verified {n} files ({n} uploaded, 0 already in S3)" in backup_log.read_text()
    keys = {o["Key"] for o in client.list_objects_v2(Bucket="checkpoints-test", Prefix="runs/model1/")["Contents"]}
    step_keys = {k for k in keys if k.startswith("runs/model1/step_")}
    assert step_keys == {f"runs/model1/step_{STEPS:08d}/{f.name}" for f in local.iterdir()}
    # Metrics and the training job's logs are kept as of the step, then the step is marked verified.
    assert {f"runs/model1/verified/step_{STEPS:08d}", f"runs/model1/logs/step_{STEPS:08d}/metrics.jsonl"} <= keys

    # Submitted again by hand (as after an interruption): it checks everything and sends nothing.
    rerun = slurm_cluster.sbatch("jobs/backup.sh", "model1", env=uninterrupted.env, user="model1",
                                 options=[f"--output=/fsx/{uninterrupted.root}/logs/backups/model1/rerun_%j.out"])
    SUBMITTED.append(rerun)
    rerun_log = uninterrupted.host_root / f"logs/backups/model1/rerun_{rerun}.out"
    assert slurm_cluster.wait(rerun, timeout=300) == ("COMPLETED", 0), rerun_log.read_text()[-3000:]
    assert f"backed up and verified {n} files (0 uploaded, {n} already in S3)" in rerun_log.read_text()


def test_signal_requeue_and_killed_rank_continue_exactly(slurm_cluster, uninterrupted):
    job = Job(slurm_cluster, "interrupted").submit()
    job.wait_for_step(8)
    # What Slurm does ahead of the time limit (--signal=USR1@600): SIGUSR1 to the job's steps.
    subprocess.run(["scancel", "--signal=USR1", job.id], check=True)
    job.wait_until("resumed start after the requeue",
                   lambda records: any(r.get("event") == "start" and r["resumed"] for r in records))
    stopped = [r for r in job.records() if r.get("event") == "stopped"]
    assert stopped and stopped[0]["signal"] == "SIGUSR1", job.output()[-4000:]
    assert slurm_cluster.jobs(job.id)[0]["Restarts"] == "1"

    # Now kill one rank outright: the job trains again in its own allocation (no hang, no requeue, no
    # resubmission), resumes from the latest checkpoint and finishes like the uninterrupted run.
    job.wait_for_step(stopped[0]["step"] + 6)
    pids = job.worker_pids()
    assert len(pids) == 2, pids
    subprocess.run(["kill", "-9", str(pids[-1])], check=True)
    state, code = job.wait()
    assert (state, code) == ("COMPLETED", 0), job.output()[-4000:]
    assert slurm_cluster.jobs(job.id)[0]["Restarts"] == "1"
    assert [r["action"] for r in job.records() if r.get("event") == "recovery" and not r.get("planned")] == ["relaunch"]
    assert "resumed from" in job.output()
    assert job.losses() == uninterrupted.losses()
