"""The GPU capacity's end on the real local Slurm cluster, with times compressed to minutes.

node_scripts/slurm_capacity_end.sh makes the maintenance reservation a few minutes ahead, on the one node the
test uses (never over every node: other jobs may run beside it). A job already running there gets its limit
cut to the reservation's start; dev's model1 (1 node, CPUs) then starts with its limit shortened by
--time-min to fit before it, gets USR1, saves, stops (STATUS stopped), and its planned requeue pends on the
reservation; no job starts into the window; the model's backup (jobs/backup.sh, cpu queue, outside the
reservation) runs once every save is over, into a stand-in S3 (moto) the nodes reach over the cluster bridge.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import boto3
import pytest

from local_cluster import demo_data
from local_cluster.client import controller_address, job_folders, wait_for
from local_cluster.cpu_limit import CpuLimit
from local_cluster.training_job import TrainingJob
from tests.s3_server import FAKE_AWS_ENV, s3_server

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.drill]
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "node_scripts" / "slurm_capacity_end.sh"
NODE = "node3"  # the test's only node: reserved, and the model job's
# The reservation starts this far ahead: the job, started seconds later, fits --time-min with a minute and a
# half to spare (backfill plans in whole minutes, bf_resolution; with 200 s it sometimes did not start).
AHEAD_S = 270
TIME_MIN = 3  # minutes: the requeue (after USR1, a minute before the limit) cannot fit again before the start
BACKUPS_AFTER_S = 40  # the local KillWait (30 s) + margin, as capacity_end.py computes it for a cluster


def slurm(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, check=True).stdout


def record(job_id: str) -> dict[str, str]:
    out = slurm("scontrol", "-o", "show", "job", job_id)
    return dict(re.findall(r"(\w+)=(\S*)", out))


def local_epoch(slurm_time: str) -> float:
    return datetime.strptime(slurm_time, "%Y-%m-%dT%H:%M:%S").timestamp()  # Slurm prints local time


def utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    demo_data.build(slurm_cluster.fsx / "data/tokenized/sample")
    state = slurm("sinfo", "-h", "-n", NODE, "-p", "gpu", "-o", "%T").strip()
    if state not in ("idle", "mixed", "allocated"):
        pytest.skip(f"{NODE} is {state}: the test reserves it and runs on it")
    return slurm_cluster


@pytest.fixture(scope="module")
def s3(slurm_cluster):
    """moto_server on the controller's address, which the nodes reach over the cluster bridge."""
    with s3_server(controller_address()) as url:
        client = boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                              region_name="us-east-1")
        client.create_bucket(Bucket="capacity-end-test")
        yield client, {**FAKE_AWS_ENV, "AWS_ENDPOINT_URL_S3": url}


def test_nothing_runs_into_the_capacity_end_and_every_model_saves_and_is_backed_up(cluster, s3, tmp_path):
    client, s3_env = s3
    name = f"capacity_end_test_{uuid.uuid4().hex[:6]}"
    job = TrainingJob(cluster, f"capacity-end-{name[-6:]}")
    # The backup takes the job's folders from a root-owned cluster.env, as every model job does (job_folders).
    env = {**cluster.env, **s3_env, **job_folders(cluster.fsx, job.root),
           "CHECKPOINT_S3_URI": "s3://capacity-end-test/runs", "OMP_NUM_THREADS": "1"}
    submitted: list[str] = []
    try:
        # A job already on the node when the reservation is made.
        running = slurm("sbatch", "--parsable", "-w", NODE, "-p", "gpu", "--time=30", "--output=/dev/null",
                        "--wrap", "sleep 600").strip()
        submitted.append(running)
        wait_for("running job", lambda: record(running)["JobState"] == "RUNNING", 60)

        start = time.time() + AHEAD_S
        (tmp_path / "end").write_text(f"# test\nreservation={name} partition=gpu start={utc(start)} "
                                      f"end={utc(start + 360)} backups={utc(start + BACKUPS_AFTER_S)}\n")
        (tmp_path / "models").write_text("model1 2\n")
        # As the head node runs it, with /fsx mounted (the host's /fsx is an empty mount point).
        made = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "bash", "-c",
             f'mount --bind {cluster.fsx} /fsx && exec bash {SCRIPT} "$@"', "head",
             "--nodes", NODE, "--jobs-dir", str(REPO / "jobs"), "--logs", f"/fsx/{job.root}/logs", "--user", "model1",
             str(tmp_path / "end"), str(tmp_path / "models")],
            capture_output=True, text=True, env=env, timeout=60)
        assert made.returncode == 0, made.stdout + made.stderr
        print(made.stdout)
        reservation = slurm("scontrol", "show", "reservation", name)
        assert f"Nodes={NODE} " in reservation and "MAINT" in reservation and "IGNORE_JOBS" in reservation
        resv_start = local_epoch(re.search(r"StartTime=(\S+)", reservation).group(1))
        assert abs(resv_start - start) < 2
        # The running job's limit now ends by the reservation's start.
        cut = record(running)
        assert local_epoch(cut["EndTime"]) <= resv_start, cut
        slurm("scancel", running)
        wait_for(f"{NODE} free", lambda: slurm("sinfo", "-h", "-n", NODE, "-p", "gpu", "-o", "%T").strip() == "idle", 60)

        job.submit("train.steps=100000", "checkpoint.every=200", "log.interval=20", TRAIN_TIME_LIMIT="10",
                   options=("--nodes=1", f"--nodelist={NODE}", "--time=10", f"--time-min={TIME_MIN}", "--signal=USR1@60"))
        submitted.append(job.id)
        first = wait_for("the model job's start", lambda: (r := record(job.id))["JobState"] == "RUNNING" and r, 60)
        limit = first["TimeLimit"]
        began = local_epoch(first["StartTime"])
        print(f"model job {job.id}: started with TimeLimit={limit} (asked 00:10:00), {resv_start - began:.0f} s before the reservation")
        assert limit != "00:10:00" and local_epoch(first["EndTime"]) <= resv_start

        # USR1, the save, STATUS stopped, the planned requeue: pending again, on the reservation. Until USR1 the
        # worker trains for minutes, held to a tenth of a CPU, as its pace is not the subject (a step takes seconds,
        # the save too, well within the minute USR1 leaves before the limit); its exit runs at full speed.
        job.wait_until("the trainer's start", lambda records: any(r.get("event") == "start" for r in records), 120)
        with CpuLimit(job.worker_pids(), 0.1):
            job.wait_until("the stop on USR1", lambda records: any(r.get("event") == "stopped" for r in records),
                           AHEAD_S + 60)
        requeued = wait_for("the planned requeue", lambda: (r := record(job.id))["JobState"] == "PENDING"
                            and int(r["Restarts"]) >= 1 and r, 120)
        stopped_at = time.time()
        assert (job.checkpoint_dir / "STATUS").read_text() == "stopped\n"
        [stop] = job.events("stopped")
        assert stop["signal"] == "SIGUSR1" and (job.checkpoint_dir / "latest").read_text().strip() == f"step_{stop['step']:08d}"
        assert "training ended: srun exit 0, status stopped" in job.output()
        # train.sh gave the limit Slurm cut back to the requeued job (TRAIN_TIME_LIMIT): the next start cuts it anew.
        restored = wait_for("the restored limit", lambda: record(job.id)["TimeLimit"] == "00:10:00", 30, 0.2)
        print(f"stopped at step {stop['step']} on SIGUSR1, {resv_start - stopped_at:.0f} s before the reservation; "
              f"requeued with TimeLimit={requeued['TimeLimit']}, restored to 00:10:00: {restored}")

        probe = slurm("sbatch", "--parsable", "-w", NODE, "-p", "gpu", "--time=5", "--output=/dev/null", "--wrap", "true").strip()
        submitted.append(probe)
        changes: list[tuple[float, str, str]] = []  # (seconds from the reservation's start, job, squeue's new reason)
        last: dict[str, str] = {}
        backup = None
        while time.time() < resv_start + BACKUPS_AFTER_S + 90:
            for what, job_id in (("model", job.id), ("probe", probe)):
                reason = slurm("squeue", "-h", "-j", job_id, "-o", "%r").strip()
                if last.get(what) != reason:
                    changes.append((time.time() - resv_start, what, reason))
                    last[what] = reason
            if backup is None:
                found = slurm("squeue", "-h", "-n", f"backup-model1-{name}", "-o", "%i").split()
                backup = found[0] if found else None
            if backup and time.time() > resv_start + BACKUPS_AFTER_S and record(backup)["JobState"] in ("COMPLETED", "FAILED"):
                break
            time.sleep(1)
        for when, what, reason in changes:
            print(f"  {when:+6.0f} s  {what:<5} pending: {reason}")
        # Nothing started into the window: both still wait, and squeue says why (the node is reserved).
        assert record(job.id)["JobState"] == "PENDING" and int(record(job.id)["Restarts"]) == 1
        assert record(probe)["JobState"] == "PENDING"
        assert all(reason.startswith("ReqNodeNotAvail") for reason in last.values()), changes
        assert time.time() > resv_start + BACKUPS_AFTER_S  # watched well into the window

        # The backup began after every save, on the cpu queue off the reserved node, and verified.
        assert backup, "no backup job was queued"
        done = record(backup)
        log = job.host_root / "logs" / "backups" / "model1" / f"backup-model1-{name}_{backup}.out"  # model1's own folder
        assert done["JobState"] == "COMPLETED", log.read_text() if log.exists() else done
        print(f"backup job {backup}: {done['JobState']} on {done['Partition']} ({done['NodeList']}), started "
              f"{local_epoch(done['StartTime']) - resv_start:+.0f} s from the reservation's start, ran {done['RunTime']}")
        assert done["Partition"] == "cpu" and NODE not in done["NodeList"]
        assert local_epoch(done["StartTime"]) >= resv_start + BACKUPS_AFTER_S - 1
        # The step the model stopped at, marked verified once every object of it matched (training/checkpoints/backup.py).
        marker = f"runs/model1/verified/step_{stop['step']:08d}"
        client.head_object(Bucket="capacity-end-test", Key=marker)
    finally:
        subprocess.run(["scancel", *submitted], check=False)
        subprocess.run(["scancel", "-n", f"backup-model1-{name}"], check=False)
        subprocess.run(["scontrol", "delete", f"reservation={name}"], check=False)
        shutil.rmtree(job.host_root, ignore_errors=True)
        (cluster.fsx / f"{job.root}.env").unlink(missing_ok=True)
