"""Upload: sync/verify against a real S3 API server (moto_server) on loopback."""

import hashlib
import json
import os

import boto3
import pytest

from dp_helpers import run_module
from tests.s3_server import FAKE_AWS_ENV, s3_server

BUCKET = "training-data"


@pytest.fixture(scope="module")
def s3_endpoint():
    with s3_server() as url:
        yield url


@pytest.fixture
def s3_env(s3_endpoint, tmp_path):
    """Environment of the CLI: fake credentials, no metadata service, no local AWS config."""
    return {**FAKE_AWS_ENV, "AWS_ENDPOINT_URL": s3_endpoint, "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}


@pytest.fixture
def s3(s3_env):
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    for obj in client.list_objects_v2(Bucket=BUCKET).get("Contents", []) if _exists(client) else []:
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    if not _exists(client):
        client.create_bucket(Bucket=BUCKET)
    return client


def _exists(client):
    return BUCKET in [b["Name"] for b in client.list_buckets()["Buckets"]]


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("alpha\n" * 1000)
    (d / "sub" / "b.bin").write_bytes(os.urandom(12 << 20))  # multipart with 5 MiB parts
    return d


def upload(env, *args):
    r = run_module("data_pipeline.upload", *args, env=env)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else None), r.stderr


def test_sync_uploads_with_manifest_then_skips_unchanged_files(s3, s3_env, data_dir):
    url = f"s3://{BUCKET}/datasets/raw"
    rc, out, err = upload(s3_env, "sync", data_dir, url, "--part-mb", "5", "--workers", "3")  # as the usage says
    assert rc == 0, err
    assert (out["files"], out["uploaded"], out["skipped"]) == (2, 2, 0)
    # Progress on stderr (stdout stays JSON): in a log, a percent/rate/ETA line, the last one at 100 %.
    assert f"sync {data_dir} -> {url}: 100.0% (12.6 MB of 12.6 MB), " in err and ", eta 0:00:00" in err
    body = s3.get_object(Bucket=BUCKET, Key="datasets/raw/sub/b.bin")["Body"].read()
    assert body == (data_dir / "sub" / "b.bin").read_bytes()
    head = s3.head_object(Bucket=BUCKET, Key="datasets/raw/sub/b.bin")
    assert "-" in head["ETag"]  # a multipart upload
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key="datasets/raw/manifest.json")["Body"].read())
    assert manifest["files"]["sub/b.bin"] == {"size": 12 << 20,
                                              "sha256": hashlib.sha256(body).hexdigest()}
    rc, out, _ = upload(s3_env, "sync", data_dir, url, "--part-mb", "5")
    assert (rc, out["uploaded"], out["skipped"]) == (0, 0, 2)
    (data_dir / "a.txt").write_text("changed\n")
    rc, out, _ = upload(s3_env, "sync", data_dir, url, "--part-mb", "5")
    assert (rc, out["uploaded"], out["skipped"]) == (0, 1, 1)
    rc, out, err = upload(s3_env, "verify", url, "--deep")
    assert rc == 0 and out["ok"], err
    assert f"verify {url} (deep): 100.0% (" in err


def test_verify_names_the_mismatching_file(s3, s3_env, data_dir):
    url = f"s3://{BUCKET}/v"
    assert upload(s3_env, "sync", data_dir, url)[0] == 0
    s3.put_object(Bucket=BUCKET, Key="v/a.txt", Body=b"tampered")
    rc, _, err = upload(s3_env, "verify", url)
    assert rc == 1 and "problem: a.txt: size 8 in S3" in err and "b.bin" not in err
    # Same size and the recorded checksum in metadata, different bytes: only --deep can tell.
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key="v/manifest.json")["Body"].read())
    entry = manifest["files"]["a.txt"]
    s3.put_object(Bucket=BUCKET, Key="v/a.txt", Body=b"x" * entry["size"],
                  Metadata={"sha256": entry["sha256"]})
    assert upload(s3_env, "verify", url)[0] == 0
    rc, _, err = upload(s3_env, "verify", url, "--deep")
    assert rc == 1 and "problem: a.txt: content SHA-256" in err
    s3.delete_object(Bucket=BUCKET, Key="v/sub/b.bin")
    rc, _, err = upload(s3_env, "verify", url)
    assert rc == 1 and "problem: sub/b.bin: missing" in err


def test_missing_bucket_is_one_clear_line(s3, s3_env, data_dir):
    rc, _, err = upload(s3_env, "sync", data_dir, "s3://no-such-bucket/x")
    assert rc == 2 and err.strip() == "error: bucket 'no-such-bucket' does not exist — check the name (cdk deploy prints it)"


def test_missing_credentials_is_one_clear_line(s3_env, data_dir):
    env = {**s3_env, "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}  # empty = unset
    rc, _, err = upload(env, "sync", data_dir, f"s3://{BUCKET}/x")
    assert rc == 2 and err.strip().startswith("error: no AWS credentials found")
    assert len(err.strip().splitlines()) == 1


def test_verify_without_manifest_says_to_sync_first(s3, s3_env):
    rc, _, err = upload(s3_env, "verify", f"s3://{BUCKET}/nothing-here")
    assert rc == 2 and "error: no manifest.json at s3://training-data/nothing-here — run `sync` first" in err


def test_restore_downloads_checked_files_keeps_good_ones_and_refuses_bad_bytes(s3, s3_env, data_dir, tmp_path):
    url = f"s3://{BUCKET}/r"
    assert upload(s3_env, "sync", data_dir, url, "--part-mb", "5")[0] == 0
    target = tmp_path / "restored"
    rc, out, err = upload(s3_env, "restore", url, target)
    assert (rc, out["downloaded"], out["skipped"]) == (0, 2, 0), err
    for rel in ("a.txt", "sub/b.bin"):
        assert (target / rel).read_bytes() == (data_dir / rel).read_bytes()
    (target / "a.txt").write_text("damaged locally\n")  # only this one is fetched again
    rc, out, _ = upload(s3_env, "restore", url, target)
    assert (rc, out["downloaded"], out["skipped"]) == (0, 1, 1)
    assert (target / "a.txt").read_bytes() == (data_dir / "a.txt").read_bytes()
    # S3 holds other bytes than the manifest recorded: the file is refused, nothing half-written stays.
    s3.put_object(Bucket=BUCKET, Key="r/a.txt", Body=b"tampered")
    elsewhere = tmp_path / "elsewhere"
    rc, out, err = upload(s3_env, "restore", url, elsewhere)
    assert rc == 1 and "problem: a.txt: downloaded SHA-256" in err and "manifest says" in err
    assert (elsewhere / "sub/b.bin").read_bytes() == (data_dir / "sub/b.bin").read_bytes()
    assert not (elsewhere / "a.txt").exists()
    assert [p.name for p in elsewhere.rglob("*") if p.is_file() and p.name.endswith(".part")] == []


@pytest.mark.parametrize("size", [1000, 6 << 20], ids=["put", "multipart"])
def test_a_second_writer_of_a_new_key_is_refused_by_s3_itself(s3, tmp_path, size):
    """The race the sync's own look-up cannot see: another writer creates the key between the sync finding it
    absent and its write. The write the sync makes then (``_put_new``, with no look-up of its own) carries
    If-None-Match, and the server refuses it, for a single put and for a multipart upload's completion: the
    first writer's bytes stay, no upload's parts are left behind, and the refusal is one clear line."""
    from data_pipeline.upload import UploadError, _put_new

    key = f"tokenized/raced-{size}/shard_000000.tar"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"the first writer's shard")
    mine = tmp_path / "shard_000000.tar"
    mine.write_bytes(os.urandom(size))
    with pytest.raises(UploadError) as refused:
        _put_new(s3, mine, BUCKET, key, 5 << 20, {"sha256": "mine"})
    assert str(refused.value) == (f"s3://{BUCKET}/{key} was written by another sync meanwhile — run the sync again "
                                  "(it skips what matches) or sync to a new folder")
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"the first writer's shard"
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    # Without the header this server replaces the key: the refusal above is the header's, answered by S3.
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"unconditional")
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"unconditional"
