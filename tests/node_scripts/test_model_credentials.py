"""node_scripts/model_credentials.sh, the root-owned credential helper: a model user gets its own model's role,
chosen by the uid sudo reports (SUDO_UID), never by anything the caller passes; other users get nothing.
The AWS side is a moto server (the boundary) with IAM checks on, the node's credentials in the helper's
stand-in for the instance profile."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import urllib.request
from pathlib import Path

import boto3
import pytest

from cluster_config.render import MODEL_ROLE_PATH
from tests.s3_server import s3_server

HELPER = Path(__file__).resolve().parents[2] / "node_scripts" / "model_credentials.sh"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the helper runs as root (through sudo on a node)")


@pytest.fixture(scope="module")
def aws(tmp_path_factory):
    """Two models' roles that trust the node, the node's keys in a root-only config, the model-role list."""
    folder = tmp_path_factory.mktemp("helper")
    with s3_server() as url:
        iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                           aws_secret_access_key="testing")
        node = iam.create_user(UserName="node")["User"]["Arn"]
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": node}, "Action": "sts:AssumeRole"}]}
        roles = {m: iam.create_role(RoleName=f"llm-dev-{m}", Path=f"{MODEL_ROLE_PATH}llm-dev/",
                                    AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"] for m in ("model1", "model2")}
        iam.put_user_policy(UserName="node", PolicyName="assume", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="node")["AccessKey"]
        urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset-auth", data=b"0",
                                                      headers={"Content-Type": "text/plain"}), timeout=10).close()
        (folder / "roles").write_text("".join(f"{m} {arn}\n" for m, arn in roles.items()))
        (folder / "instance.config").write_text(
            f"[default]\nregion = us-east-1\nendpoint_url = {url}\naws_access_key_id = {key['AccessKeyId']}\n"
            f"aws_secret_access_key = {key['SecretAccessKey']}\n")
        yield folder, url, roles


def helper(aws, uid: str | None, *args: str) -> subprocess.CompletedProcess:
    folder, _, _ = aws
    env = {"PATH": os.environ["PATH"], "MODEL_ROLES": str(folder / "roles"), "JOBS_PYTHON": sys.executable,
           "INSTANCE_AWS_CONFIG": str(folder / "instance.config"), **({"SUDO_UID": uid} if uid is not None else {})}
    return subprocess.run(["bash", str(HELPER), *args], capture_output=True, text=True, env=env, timeout=60)


def uid_of(user: str) -> str:
    try:
        return str(pwd.getpwnam(user).pw_uid)
    except KeyError:
        pytest.skip(f"no user {user} on this machine (the local cluster's nodes make the models' users)")


def test_a_model_user_gets_its_own_models_role_and_nothing_else(aws):
    _, url, roles = aws
    proc = helper(aws, uid_of("model1"))
    assert proc.returncode == 0, proc.stderr
    credentials = json.loads(proc.stdout)
    assert credentials["Version"] == 1 and credentials["SessionToken"] and credentials["Expiration"]
    sts = boto3.client("sts", endpoint_url=url, region_name="us-east-1", aws_access_key_id=credentials["AccessKeyId"],
                       aws_secret_access_key=credentials["SecretAccessKey"], aws_session_token=credentials["SessionToken"])
    assert ":assumed-role/llm-dev-model1/model1-" in sts.get_caller_identity()["Arn"]


def test_the_caller_cannot_choose_another_model_or_get_anything_as_another_user(aws):
    asked = helper(aws, uid_of("model1"), "model2")
    assert asked.returncode == 1 and "takes no arguments" in asked.stderr and not asked.stdout
    stranger = helper(aws, uid_of("nobody"))
    assert stranger.returncode == 1 and "'nobody' is not a model's user" in stranger.stderr and not stranger.stdout
    direct = helper(aws, None)
    assert direct.returncode == 1 and "no SUDO_UID" in direct.stderr
