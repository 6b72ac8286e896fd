"""The node roles ParallelCluster itself creates from the rendered prod config (its own template constructs,
run by the emulated deploy), with the policies they attach as the deployed account holds them."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

from cluster_config.render import ClusterResources, model_role_arn
from cluster_config.settings import load_settings

pytestmark = pytest.mark.slow  # the emulated account and ParallelCluster's own code

# What must stay out of every cluster role's reach on the data and backup buckets: any job holds the
# role's credentials (compute nodes cannot keep the instance metadata service from job processes).
NEVER_ALLOWED = ("s3:DeleteObject", "s3:DeleteObjectVersion", "s3:DeleteBucket", "s3:PutBucketPolicy",
                 "s3:PutBucketVersioning", "s3:PutLifecycleConfiguration", "s3:PutBucketObjectLockConfiguration",
                 "s3:PutEncryptionConfiguration", "s3:PutBucketAcl", "s3:PutBucketLogging")


def allowed(statements: list[dict], action: str, resource: str) -> list[dict]:
    """The Allow statements whose action and resource patterns cover ``action`` on ``resource``."""
    def listed(value) -> list[str]:
        return value if isinstance(value, list) else [value]
    return [s for s in statements if s["Effect"] == "Allow"
            and any(fnmatchcase(action, a) for a in listed(s.get("Action", [])))
            and any(fnmatchcase(resource, r) for r in listed(s.get("Resource", [])))]


@pytest.fixture(scope="module")
def roles(report):
    found = report("prod").iam
    assert set(found) == {"HeadNode", "gpu", "cpu"}, found.keys()
    return found


def test_no_cluster_role_may_delete_or_reconfigure_the_data_and_backup_buckets(roles):
    resources = ClusterResources.placeholders(load_settings("prod"))
    for bucket in (resources.data_bucket, resources.backup_bucket):
        for node, role in roles.items():
            for action in NEVER_ALLOWED:
                for resource in (f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/model1/step_00000040/.metadata"):
                    assert not allowed(role["statements"], action, resource), (node, action, resource)
            wildcards = [s for s in role["statements"] if s["Effect"] == "Allow" and {"s3:*", "*"} & set(
                s["Action"] if isinstance(s["Action"], list) else [s["Action"]])]
            assert not wildcards, (node, wildcards)


def test_no_node_role_writes_backups_and_the_compute_queues_assume_only_their_models_roles(roles):
    """Every job on a node could use the node's role: backups are written through the model's own role
    (stacks/model_roles.py, via node_scripts/model_credentials.sh), never with the node's."""
    settings = load_settings("prod")
    bucket = f"arn:aws:s3:::{ClusterResources.placeholders(settings).backup_bucket}"
    for node, role in roles.items():
        for model in settings.models:
            assert not allowed(role["statements"], "s3:PutObject", f"{bucket}/{model.name}/step_00000040/.metadata"), node
    for queue in ("cpu", "gpu"):
        statements = roles[queue]["statements"]
        for model in settings.models:
            assert allowed(statements, "sts:AssumeRole", model_role_arn(settings, model.name)), queue
        assert not allowed(statements, "sts:AssumeRole", f"arn:aws:iam::{settings.account}:role/llm-models/other-cluster/x")
        assert not allowed(statements, "sts:AssumeRole", f"arn:aws:iam::{settings.account}:role/admin")
    assert not allowed(roles["HeadNode"]["statements"], "sts:AssumeRole", model_role_arn(settings, "model1"))


def test_no_cluster_role_reads_parameter_store_broadly(roles):
    for node, role in roles.items():
        assert not any("AmazonSSMManagedInstanceCore" in arn for arn in role["managed_policy_arns"]), node
        # CloudWatchAgentServerPolicy (ParallelCluster adds it for its log agent) reads AmazonCloudWatch-* only.
        assert not allowed(role["statements"], "ssm:GetParameter", "arn:aws:ssm:ap-southeast-3:222222222222:parameter/any"), node
        assert allowed(role["statements"], "ssmmessages:OpenDataChannel", "*"), node
