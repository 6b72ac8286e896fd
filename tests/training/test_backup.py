"""Final-checkpoint backup against a real S3 API (moto_server on loopback; the AWS boundary)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from boto3.s3.transfer import TransferConfig

from tests.s3_server import FAKE_AWS_ENV, s3_server
from training import backup as backup_mod
from training.backup import BackupError, backup

BUCKET = "ckpt-backup-test"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with s3_server() as url:
        env = {**FAKE_AWS_ENV, "AWS_ENDPOINT_URL_S3": url}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        yield client
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def small_parts(monkeypatch):
    """5 MiB parts (S3's minimum) so a test file is uploaded in several parts."""
    part = 5 * 2**20
    monkeypatch.setattr(backup_mod, "PART_BYTES", part)
    monkeypatch.setattr(backup_mod, "TRANSFER", TransferConfig(multipart_threshold=part, multipart_chunksize=part))
    return part


def make_checkpoint(root: Path, step: int, sizes: dict[str, int]) -> Path:
    step_dir = root / f"step_{step:08d}"
    step_dir.mkdir(parents=True)
    for name, size in sizes.items():
        (step_dir / name).write_bytes(os.urandom(size))
    (root / "latest").write_text(step_dir.name + "\n")
    return step_dir


def test_backup_uploads_latest_checkpoint_and_verifies(s3, tmp_path, small_parts):
    make_checkpoint(tmp_path, 10, {".metadata": 100, "train_meta.json": 50, "__0_0.distcp": 1000})
    step_dir = make_checkpoint(tmp_path, 20, {".metadata": 300, "train_meta.json": 50, "__0_0.distcp": 11 * 2**20,
                                              "__1_0.distcp": 0})
    target = backup(tmp_path, f"s3://{BUCKET}/runs/model1")
    assert target == f"s3://{BUCKET}/runs/model1/step_00000020/"
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="runs/model1/")["Contents"]
    keys = {o["Key"]: o["Size"] for o in listed}
    assert keys == {**{f"runs/model1/step_00000020/{f.name}": f.stat().st_size for f in step_dir.iterdir()},
                    "runs/model1/latest": len("step_00000020\n")}
    body = s3.get_object(Bucket=BUCKET, Key="runs/model1/step_00000020/__0_0.distcp")["Body"].read()
    assert body == (step_dir / "__0_0.distcp").read_bytes()
    assert s3.get_object(Bucket=BUCKET, Key="runs/model1/latest")["Body"].read() == b"step_00000020\n"


def test_backup_refuses_when_s3_holds_other_bytes(s3, tmp_path, small_parts):
    """A client that uploads something else (the AWS boundary misbehaving): verification catches it."""
    step_dir = make_checkpoint(tmp_path, 5, {".metadata": 10, "train_meta.json": 10, "__0_0.distcp": 6 * 2**20})
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(6 * 2**20))

    class Corrupting:
        def __getattr__(self, name):
            return getattr(s3, name)

        def upload_file(self, filename, bucket, key, **kwargs):
            if filename.endswith(".distcp"):
                filename = str(other)
            return s3.upload_file(filename, bucket, key, **kwargs)

    with pytest.raises(BackupError, match=r"(?s)verification failed.*__0_0\.distcp: S3 has"):
        backup(tmp_path, f"s3://{BUCKET}/bad", client=Corrupting())
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="bad/latest")
    assert step_dir.exists()


def test_backup_refuses_incomplete_or_missing_checkpoint(s3, tmp_path):
    with pytest.raises(BackupError, match="latest does not exist"):
        backup(tmp_path, f"s3://{BUCKET}/x")
    step_dir = make_checkpoint(tmp_path, 7, {"__0_0.distcp": 10})
    with pytest.raises(BackupError, match=rf"{step_dir.name} is not a complete checkpoint \(missing .metadata, train_meta.json\)"):
        backup(tmp_path, f"s3://{BUCKET}/x")
    with pytest.raises(BackupError, match="not an S3 URI"):
        backup(tmp_path, "bucket/x")


def test_backup_cli_runs_as_one_process(s3, tmp_path):
    make_checkpoint(tmp_path, 3, {".metadata": 10, "train_meta.json": 10, "__0_0.distcp": 1000})
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-m", "training.backup", str(tmp_path), f"s3://{BUCKET}/cli/model1"],
                            env={**os.environ, "PYTHONPATH": str(repo / "jobs")}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "backed up and verified 3 files" in result.stderr
    assert "backup step_00000003: 100.0% (" in result.stderr  # progress, as a log line when not on a terminal
    assert s3.get_object(Bucket=BUCKET, Key="cli/model1/latest")["Body"].read() == b"step_00000003\n"
