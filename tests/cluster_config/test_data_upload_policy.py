"""The head node's policy on the data bucket, enforced by a real S3 API: moto_server with IAM checks on.

Users run README's upload step (`python -m data_pipeline.upload sync ... s3://<data bucket>/raw`) on
the head node. With the read-only access it had, the upload failed with AccessDenied; with
``render.data_upload_policy`` sync, verify and restore work and nothing can be deleted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from cluster_config.render import PCLUSTER_POLICY_PATH, data_upload_policy
from tests.s3_server import FAKE_AWS_ENV, s3_server

REPO = Path(__file__).resolve().parents[2]
BUCKET = "llm-prod-data"
BUCKET_ARN = f"arn:aws:s3:::{BUCKET}"
# What ParallelCluster grants for S3Access with EnableWriteAccess: false (its S3Read statement),
# i.e. what the head node had on the data bucket before.
READ_ONLY = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": ["s3:Get*", "s3:List*"], "Resource": [BUCKET_ARN, f"{BUCKET_ARN}/*"]}]}
# moto names HeadBucket's permission s3:HeadBucket; AWS checks s3:ListBucket for it (S3 API
# reference, HeadBucket), which both policies grant. Added to each user here, never to the policy.
MOTO_HEAD_BUCKET = {"Effect": "Allow", "Action": "s3:HeadBucket", "Resource": BUCKET_ARN}


@pytest.fixture(scope="module")
def account():
    """A bucket and two users, one per policy; then IAM is enforced on every request. -> (url, {user: keys})."""
    with s3_server() as url:
        admin = dict(endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
        iam = boto3.client("iam", **admin)
        boto3.client("s3", **admin).create_bucket(Bucket=BUCKET)
        keys = {}
        for user, policy in (("head-node", data_upload_policy(BUCKET_ARN)), ("read-only", READ_ONLY)):
            policy = {**policy, "Statement": [*policy["Statement"], MOTO_HEAD_BUCKET]}
            arn = iam.create_policy(PolicyName=user, Path=PCLUSTER_POLICY_PATH, PolicyDocument=json.dumps(policy))["Policy"]["Arn"]
            iam.create_user(UserName=user)
            iam.attach_user_policy(UserName=user, PolicyArn=arn)
            key = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        reset_auth = urllib.request.Request(f"{url}/moto-api/reset-auth", data=b"0", headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(reset_auth, timeout=10).close()  # IAM checks on every request from now on
        yield url, keys


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory) -> Path:
    raw = tmp_path_factory.mktemp("raw")
    (raw / "corpus-00000.txt").write_text("alpha beta\n" * 1000)
    (raw / "corpus-00001.txt").write_bytes(os.urandom(12 << 20))  # multipart with 5 MiB parts
    return raw


def upload(account, user: str, *args) -> subprocess.CompletedProcess:
    url, keys = account
    env = {**os.environ, **FAKE_AWS_ENV, **keys[user], "AWS_ENDPOINT_URL": url, "PYTHONPATH": str(REPO / "jobs")}
    return subprocess.run([sys.executable, "-m", "data_pipeline.upload", *map(str, args)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_read_only_access_fails_the_upload_as_reported(account, raw_dir):
    result = upload(account, "read-only", "sync", raw_dir, f"s3://{BUCKET}/before/raw", "--part-mb", "5")
    assert result.returncode == 2
    assert "AccessDenied" in result.stderr and "PutObject" in result.stderr


def test_head_node_policy_syncs_verifies_and_restores(account, raw_dir, tmp_path):
    url = f"s3://{BUCKET}/raw"
    synced = upload(account, "head-node", "sync", raw_dir, url, "--part-mb", "5")
    assert synced.returncode == 0, synced.stderr
    assert json.loads(synced.stdout)["uploaded"] == 2
    again = upload(account, "head-node", "sync", raw_dir, url, "--part-mb", "5")  # a rerun reads back what is there
    assert again.returncode == 0 and json.loads(again.stdout)["skipped"] == 2, again.stderr
    verified = upload(account, "head-node", "verify", url, "--deep")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"] is True, verified.stderr
    restored = upload(account, "head-node", "restore", url, tmp_path / "back")
    assert restored.returncode == 0, restored.stderr
    assert (tmp_path / "back" / "corpus-00001.txt").read_bytes() == (raw_dir / "corpus-00001.txt").read_bytes()


@pytest.mark.parametrize("call", [
    lambda s3: s3.delete_object(Bucket=BUCKET, Key="raw/manifest.json"),
    lambda s3: s3.delete_object(Bucket=BUCKET, Key="raw/manifest.json", VersionId="null"),
    lambda s3: s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(READ_ONLY)),
    lambda s3: s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Suspended"}),
    lambda s3: s3.put_public_access_block(Bucket=BUCKET, PublicAccessBlockConfiguration={"BlockPublicAcls": False}),
    lambda s3: s3.delete_bucket(Bucket=BUCKET),
], ids=["delete", "delete-version", "bucket-policy", "versioning", "public-access-block", "delete-bucket"])
def test_head_node_policy_deletes_and_reconfigures_nothing(account, call):
    url, keys = account
    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id=keys["head-node"]["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=keys["head-node"]["AWS_SECRET_ACCESS_KEY"])
    with pytest.raises(ClientError) as denied:
        call(s3)
    assert denied.value.response["Error"]["Code"] == "AccessDenied"
