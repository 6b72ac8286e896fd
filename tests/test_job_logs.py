"""The jobs that run as a model's user and log outside its training folder (jobs/backup.sh, jobs/export.sh): their
log must be their user's, in a folder of their user's (jobs/own_log.sh), and their folders the cluster's, never the
submitting shell's FSX_*. Run as root here, with another user (nobody) as the neighbour; on the local cluster,
tests/local_cluster/test_neighbours.py tries the same as model1's job against model2's logs."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NEIGHBOUR = pwd.getpwnam("nobody")
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to make files another user owns")


def logged_to(log: Path, env: dict | None = None, script: str = "backup.sh") -> subprocess.CompletedProcess:
    """jobs/<script> model1 with its output appended to ``log``, as Slurm opens a job's --output."""
    with open(log, "a") as out:
        return subprocess.run(["bash", str(REPO / "jobs" / script), "model1"], stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, "JOBS_DIR": str(REPO / "jobs"), "JOBS_VENV": str(REPO / ".venv"),
                                   "CLUSTER_ENV": "/dev/null", "FSX_LOGS": "/fsx/logs", **(env or {})}, timeout=60)


def test_a_backup_stops_on_a_log_another_user_made_first_or_holds_the_folder_of(tmp_path):
    mine, shared = tmp_path / "mine", tmp_path / "shared"
    mine.mkdir()
    shared.mkdir(mode=0o1777)
    os.chown(shared, NEIGHBOUR.pw_uid, NEIGHBOUR.pw_gid)
    squatted = mine / "backup-model1_7.out"  # a neighbour's file under the next job's name
    squatted.write_text("backed up and verified 3 files: s3://b/model1/step_00000012/\n")
    os.chown(squatted, NEIGHBOUR.pw_uid, NEIGHBOUR.pw_gid)
    result = logged_to(squatted)
    assert result.returncode == 1
    assert (f"error: this job's log {squatted} is nobody's, not root's: another user made it first and can rewrite "
            "it; submit with the script's own --output, in /fsx/logs/backups/root/") in squatted.read_text()
    assert "backup of model1" not in squatted.read_text()
    exported = mine / "export_7.out"  # export.sh: the same check, before it reads anything
    exported.touch()
    os.chown(exported, NEIGHBOUR.pw_uid, NEIGHBOUR.pw_gid)
    assert logged_to(exported, script="export.sh").returncode == 1
    assert "is nobody's, not root's" in exported.read_text() and "/fsx/logs/export/root/" in exported.read_text()

    in_theirs = shared / "backup-model1_8.out"
    assert logged_to(in_theirs).returncode == 1
    assert f"lies in {shared}, which is nobody's, not root's: its owner can replace the log" in in_theirs.read_text()

    own = mine / "backup-model1_9.out"  # its own log in its own folder: the job goes on (here to its S3 check)
    assert logged_to(own, {"CHECKPOINT_S3_URI": ""}).returncode == 1
    assert own.read_text().startswith("error: CHECKPOINT_S3_URI is not set"), own.read_text()


def test_a_backup_takes_the_clusters_folders_not_the_submitting_shells(tmp_path):
    cluster_env = tmp_path / "cluster.env"  # root's, as the node setup writes /opt/llm-jobs/cluster.env
    cluster_env.write_text(f"export FSX_CHECKPOINTS={tmp_path}/checkpoints FSX_LOGS={tmp_path}/logs\n")
    log = tmp_path / "backup.out"
    result = logged_to(log, {"CLUSTER_ENV": str(cluster_env), "FSX_CHECKPOINTS": "/fsx/checkpoints/model2",
                             "CHECKPOINT_S3_URI": "s3://backups", "AWS_EC2_METADATA_DISABLED": "true"})
    assert result.returncode != 0  # no checkpoint there
    assert f"backup of model1 on {os.uname().nodename}: {tmp_path}/checkpoints/model1 -> s3://backups/model1" in log.read_text()
