"""Final-checkpoint backup against a real S3 API (moto_server on loopback; the AWS boundary)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.s3_server import FAKE_AWS_ENV, s3_server
from training.checkpoints import backup as backup_mod
from training.checkpoints.backup import BackupError, VerificationFailed, backup

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
    return part


def make_checkpoint(root: Path, step: int, sizes: dict[str, int]) -> Path:
    step_dir = root / f"step_{step:08d}"
    step_dir.mkdir(parents=True)
    for name, size in sizes.items():
        (step_dir / name).write_bytes(os.urandom(size))
    (root / "latest").write_text(step_dir.name + "\n")
    return step_dir


def test_backup_uploads_latest_checkpoint_and_logs_and_verifies(s3, tmp_path, small_parts):
    make_checkpoint(tmp_path / "model1", 10, {".metadata": 100, "train_meta.json": 50, "__0_0.distcp": 1000})
    step_dir = make_checkpoint(tmp_path / "model1", 20, {".metadata": 300, "train_meta.json": 50, "__0_0.distcp": 11 * 2**20,
                                              "__1_0.distcp": 0})
    logs = tmp_path / "logs"
    (logs / "tensorboard").mkdir(parents=True)
    (logs / "metrics.jsonl").write_text('{"step": 20}\n')
    (logs / "tensorboard" / "events.out").write_bytes(os.urandom(7 * 2**20))
    target = backup(tmp_path / "model1", f"s3://{BUCKET}/runs/model1", logs_dir=logs)
    assert target == f"s3://{BUCKET}/runs/model1/step_00000020/"
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="runs/model1/")["Contents"]
    keys = {o["Key"]: o["Size"] for o in listed}
    assert keys == {**{f"runs/model1/step_00000020/{f.name}": f.stat().st_size for f in step_dir.iterdir()},
                    "runs/model1/logs/step_00000020/metrics.jsonl": len('{"step": 20}\n'),
                    "runs/model1/logs/step_00000020/tensorboard/events.out": 7 * 2**20,
                    "runs/model1/verified/step_00000020": len("step_00000020\n")}
    body = s3.get_object(Bucket=BUCKET, Key="runs/model1/step_00000020/__0_0.distcp")["Body"].read()
    assert body == (step_dir / "__0_0.distcp").read_bytes()
    assert s3.get_object(Bucket=BUCKET, Key="runs/model1/verified/step_00000020")["Body"].read() == b"step_00000020\n"


def test_backup_refuses_when_s3_holds_other_bytes(s3, tmp_path, small_parts):
    """A client that uploads something else (the AWS boundary misbehaving): verification catches it."""
    step_dir = make_checkpoint(tmp_path, 5, {".metadata": 10, "train_meta.json": 10, "__0_0.distcp": 6 * 2**20})
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(6 * 2**20))

    class Corrupting:
        def __getattr__(self, name):
            return getattr(s3, name)

        def upload_part(self, **kwargs):
            if kwargs["Key"].endswith(".distcp"):
                kwargs["Body"] = other.read_bytes()[:len(kwargs["Body"])]
            return s3.upload_part(**kwargs)

    with pytest.raises(BackupError, match=r"(?s)verification failed.*__0_0\.distcp: S3 has"):
        backup(tmp_path, f"s3://{BUCKET}/bad", client=Corrupting())
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="bad/verified/")
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
    result = subprocess.run([sys.executable, "-m", "training.checkpoints.backup", str(tmp_path), f"s3://{BUCKET}/cli/model1"],
                            env={**os.environ, "PYTHONPATH": str(repo / "jobs")}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "backed up and verified 3 files" in result.stderr
    assert "backup step_00000003: 100.0% (" in result.stderr  # progress, as a log line when not on a terminal
    assert s3.get_object(Bucket=BUCKET, Key="cli/model1/verified/step_00000003")["Body"].read() == b"step_00000003\n"


def run_cli(checkpoint_dir: Path, uri: str, *args: str) -> subprocess.Popen:
    repo = Path(__file__).resolve().parents[2]
    return subprocess.Popen([sys.executable, "-m", "training.checkpoints.backup", str(checkpoint_dir), uri, *args],
                            env={**os.environ, "PYTHONPATH": str(repo / "jobs")},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_killed_backup_resumes_uploading_only_what_is_missing(s3, tmp_path):
    """SIGKILL halfway: the rerun uploads only the missing objects (one version of every key, in a
    versioned bucket), verifies every object, and only then writes verified/<step>."""
    bucket = "ckpt-backup-resume"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    files = {".metadata": 1000, "train_meta.json": 100, **{f"__{i}_0.distcp": 256 * 1024 for i in range(150)}}
    step_dir = make_checkpoint(tmp_path, 40, files)
    uri, prefix = f"s3://{bucket}/model1", "model1/step_00000040/"

    def present() -> list[str]:
        return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="model1/").get("Contents", [])]

    first = run_cli(tmp_path, uri, "--workers", "1")
    deadline = time.monotonic() + 60
    while len(present()) < 20:
        assert first.poll() is None, f"the backup finished before it could be interrupted:\n{first.stdout.read()}"
        assert time.monotonic() < deadline, "the backup made no progress"
        time.sleep(0.01)
    first.kill()
    first.wait()
    before = set(present())
    assert 20 <= len(before) < len(files), len(before)
    assert not any(key.startswith("model1/verified/") for key in before)

    second = run_cli(tmp_path, uri)
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0, out
    assert f"backed up and verified {len(files)} files ({len(files) - len(before)} uploaded, {len(before)} already in S3)" in out
    versions = s3.list_object_versions(Bucket=bucket, Prefix=prefix)["Versions"]
    counts = {key: sum(v["Key"] == key for v in versions) for key in {v["Key"] for v in versions}}
    assert counts == {f"{prefix}{name}": 1 for name in files}
    for name in files:
        body = s3.get_object(Bucket=bucket, Key=f"{prefix}{name}")["Body"].read()
        assert body == (step_dir / name).read_bytes(), name
    assert s3.get_object(Bucket=bucket, Key="model1/verified/step_00000040")["Body"].read() == b"step_00000040\n"


def test_backup_never_replaces_an_object_s3_already_holds(s3, tmp_path, small_parts):
    """A key already holding other bytes (a damaged upload, another writer) is reported and kept: the
    rerun writes what is missing, leaves that object as it is (no new version) and no verified/<step>."""
    bucket = "ckpt-backup-write-once"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    make_checkpoint(tmp_path, 50, {".metadata": 10, "train_meta.json": 10, "__0_0.distcp": 6 * 2**20})
    damaged = "model1/step_00000050/__0_0.distcp"
    s3.put_object(Bucket=bucket, Key=damaged, Body=b"not the checkpoint")

    result = subprocess.run([sys.executable, "-m", "training.checkpoints.backup", str(tmp_path), f"s3://{bucket}/model1"],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "jobs")},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert f"problem: backup verification failed, verified/step_00000050 not written:\n  {damaged}: S3 has 18 bytes" in result.stderr
    assert "backups are write-once: the object is kept, not replaced" in result.stderr
    versions = s3.list_object_versions(Bucket=bucket, Prefix="model1/")["Versions"]
    assert [v["Key"] for v in versions if v["Key"] == damaged] == [damaged]
    assert s3.get_object(Bucket=bucket, Key=damaged)["Body"].read() == b"not the checkpoint"
    assert {v["Key"] for v in versions} == {damaged, "model1/step_00000050/.metadata", "model1/step_00000050/train_meta.json"}


@pytest.mark.parametrize("size", [100, 6 * 2**20], ids=["put", "multipart"])
def test_upload_to_an_existing_key_is_refused_by_s3(s3, tmp_path, small_parts, size):
    """The write itself is conditional (If-None-Match: *): even a key that appeared after the check is
    not replaced, and a refused multipart upload leaves no parts behind."""
    path = tmp_path / "shard.distcp"
    path.write_bytes(os.urandom(size))
    key = f"race/{size}/shard.distcp"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"written first")
    with pytest.raises(ClientError) as refused:
        backup_mod._put_new(s3, path, BUCKET, key)
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"written first"
    assert not s3.list_multipart_uploads(Bucket=BUCKET, Prefix=key).get("Uploads")


@pytest.mark.parametrize("latest", ["../model2/step_00000005", "/elsewhere/model2/step_00000005",
                                    "step_00000005/../../model2/step_00000005", "latest", ""])
def test_backup_refuses_a_latest_that_is_not_a_step_folder_of_its_model(s3, tmp_path, latest):
    """`latest` naming another model's checkpoint (or anything but step_<digits>) would back that one up
    as this model's: refused before anything is uploaded, as bad input (exit 2)."""
    model2 = make_checkpoint(tmp_path / "model2", 5, {".metadata": 10, "train_meta.json": 10, "__0_0.distcp": 100})
    model1 = tmp_path / "model1"
    make_checkpoint(model1, 5, {".metadata": 10, "train_meta.json": 10, "__0_0.distcp": 100})
    (model1 / "latest").write_text(latest.replace("/elsewhere/model2", str(model2.parent)) + "\n")
    with pytest.raises(BackupError, match=r"latest names .*, not a step folder of this model — write the name of one of"):
        backup(model1, f"s3://{BUCKET}/refused/model1")
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="refused/")
    code, err = cli_exit(model1, f"s3://{BUCKET}/refused/model1")
    assert code == 2 and err.startswith("error: ") and "not a step folder of this model" in err, err


def test_backup_refuses_a_step_folder_or_file_that_links_outside_its_model(s3, tmp_path):
    model2 = make_checkpoint(tmp_path / "model2", 5, {".metadata": 10, "train_meta.json": 10, "__0_0.distcp": 100})
    model1 = tmp_path / "model1"
    model1.mkdir()
    (model1 / "step_00000009").symlink_to(model2)
    (model1 / "latest").write_text("step_00000009\n")
    with pytest.raises(BackupError, match=r"step_00000009 is a link to .*model2/step_00000005, outside .*model1 — "):
        backup(model1, f"s3://{BUCKET}/refused/model1")
    assert cli_exit(model1, f"s3://{BUCKET}/refused/model1")[0] == 2

    step_dir = make_checkpoint(model1, 10, {".metadata": 10, "train_meta.json": 10})
    (step_dir / "__0_0.distcp").symlink_to(model2 / "__0_0.distcp")
    with pytest.raises(BackupError, match=r"__0_0\.distcp links to .*model2/step_00000005/__0_0\.distcp, outside"):
        backup(model1, f"s3://{BUCKET}/refused/model1")
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="refused/")


def cli_exit(checkpoint_dir: Path, uri: str) -> tuple[int, str]:
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-m", "training.checkpoints.backup", str(checkpoint_dir), uri],
                            env={**os.environ, "PYTHONPATH": str(repo / "jobs")}, capture_output=True, text=True, timeout=60)
    return result.returncode, result.stderr


def test_verified_marker_is_written_after_every_object_is_verified(s3, tmp_path):
    make_checkpoint(tmp_path, 2, {".metadata": 10, "train_meta.json": 10, "__0_0.distcp": 1000, "__1_0.distcp": 1000})
    calls = []

    class Recording:
        def __getattr__(self, name):
            method = getattr(s3, name)

            def call(*args, **kwargs):
                key = kwargs.get("Key") or args[2]
                calls.append((name, key))
                return method(*args, **kwargs)
            return call

    backup(tmp_path, f"s3://{BUCKET}/order/model1", client=Recording())
    assert calls[-2:] == [("head_object", "order/model1/verified/step_00000002"),
                          ("put_object", "order/model1/verified/step_00000002")]
    heads = [key for name, key in calls[:-2] if name == "head_object"]
    assert sorted(set(heads)) == sorted(f"order/model1/step_00000002/{n}" for n in
                                        (".metadata", "train_meta.json", "__0_0.distcp", "__1_0.distcp"))
    assert all(name in ("head_object", "put_object") for name, _ in calls[:-2])
