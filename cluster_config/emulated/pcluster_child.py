"""Runs inside .venv-pcluster (ParallelCluster 3.16.1): its validators and update checks, as JSON.

Started by ``cluster_config.emulated.check`` with a JSON request on stdin:

    {"endpoint": "http://127.0.0.1:PORT", "region": ..., "cluster_name": ...,
     "config": "<yaml>" | null, "reservations": [...], "placement_groups": [...], "patches": {"name": ["<base yaml>", "<target yaml>"]},
     "iam": true | absent}

and answers on stdout:

    {"failures": [{"level", "validator", "message"}], "error": null | "<why the config did not load>",
     "validators": [names that ran], "stubbed": [stubbed calls], "patches": {"name": {"allowed", "rows"}},
     "iam": {"HeadNode" | queue name: {"managed_policy_arns": [...], "statements": [...]}}}

``validate_create_request`` is what ``pcluster create-cluster --dryrun`` runs (schema, then every
validator); ``ConfigPatch(...).check()`` is what ``pcluster update-cluster`` and ParallelCluster's
CloudFormation custom resource run before an update. With ``"iam"``, the head node's and each queue's
role and inline policies come from ParallelCluster's own template constructs (its cluster stack's
``HeadNodeIamResources`` / ``ComputeNodeIamResources``), synthesized with its CDK v1. Every AWS call goes to the emulated account
(``AWS_ENDPOINT_URL``) except those listed in ``stubs.PCLUSTER_STUBS``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def main() -> None:
    argparse.ArgumentParser(prog="python -m cluster_config.emulated.pcluster_child",
                            description="ParallelCluster's validators and update checks of a JSON request on stdin, as "
                                        "cluster_config.emulated.check sends it; the answer, JSON, on stdout").parse_args()
    request = json.loads(sys.stdin.read())
    os.environ.update({
        "AWS_ENDPOINT_URL": request["endpoint"], "AWS_DEFAULT_REGION": request["region"],
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
    })
    logging.disable(logging.CRITICAL)  # ParallelCluster logs every call; the answer is the JSON

    import boto3
    import yaml
    from pcluster.config.common import Resource
    from pcluster.config.config_patch import ConfigPatch
    from pcluster.models.cluster import Cluster, ConfigValidationError
    from pcluster.validators.common import FailureLevel

    from cluster_config.emulated.stubs import RunningCluster, amazon_linux_image, patch_pcluster

    stubbed: list[str] = []
    patch_pcluster(request["reservations"], request["placement_groups"], amazon_linux_image(boto3.client("ec2")), stubbed)

    ran: list[str] = []
    execute = Resource._validator_execute

    def record(validator_class, validator_args, suppressors, executor):
        ran.append(validator_class.__name__)
        return execute(validator_class, validator_args, suppressors, executor)

    Resource._validator_execute = staticmethod(record)

    error, failures = None, []
    if request["config"] is not None:  # None: update checks only
        cluster = Cluster(request["cluster_name"], config=request["config"])
        try:
            failures = cluster.validate_create_request(validator_suppressors=set(), validation_failure_level=FailureLevel.ERROR)
        except ConfigValidationError as exc:
            failures = exc.validation_failures or []
            if not failures:
                error = str(exc)

    iam = _node_iam(cluster.config, request["region"]) if request.get("iam") and request["config"] is not None else {}

    running = RunningCluster(request["cluster_name"])
    patches = {}
    for name, (base, target) in request.get("patches", {}).items():
        allowed, rows = ConfigPatch(cluster=running, base_config=yaml.safe_load(base), target_config=yaml.safe_load(target)).check()
        patches[name] = {"allowed": allowed, "rows": [[_plain(cell) for cell in row] for row in rows[1:]]}

    json.dump({
        "failures": [{"level": f.level.name, "validator": f.validator_type, "message": f.message} for f in failures],
        "error": error,
        "validators": sorted(set(ran)),
        "stubbed": sorted(set(stubbed)),
        "patches": patches,
        "iam": iam,
    }, sys.stdout)


def _node_iam(config, region: str) -> dict:
    """Each node role's managed policy ARNs and inline policy statements, as ParallelCluster's template has them."""
    from types import SimpleNamespace

    from aws_cdk import core
    from pcluster.config.cluster_config import SharedStorageType
    from pcluster.templates.cdk_builder_utils import ComputeNodeIamResources, HeadNodeIamResources, create_hash_suffix

    app = core.App()
    stack = core.Stack(app, "cluster", env=core.Environment(region=region))
    storage = {kind: [] for kind in SharedStorageType}  # FSx and EBS add no IAM statements
    bucket = SimpleNamespace(name="parallelcluster-emulated", artifact_directory="parallelcluster/clusters/emulated")
    HeadNodeIamResources(stack, "HeadNodeIamResources", config, config.head_node, storage, "HeadNode", bucket)
    for queue in config.scheduling.queues:
        ComputeNodeIamResources(stack, f"ComputeNodeIamResources{queue.name}", config, queue, storage, queue.name)
    resources = app.synth().get_stack_by_name("cluster").template["Resources"]
    iam = {}
    for node in ["HeadNode", *(queue.name for queue in config.scheduling.queues)]:
        role_id = f"Role{create_hash_suffix(node)}"  # ParallelCluster's logical id of the node's role
        statements = [statement for value in resources.values() if value["Type"] == "AWS::IAM::Policy"
                      and {"Ref": role_id} in value["Properties"]["Roles"]
                      for statement in value["Properties"]["PolicyDocument"]["Statement"]]
        managed = resources[role_id]["Properties"].get("ManagedPolicyArns", [])
        # The attached policies' documents as the emulated account holds them (the stacks' own, AWS managed ones).
        statements += [statement for arn in managed for statement in _policy_statements(_plain(arn, region))]
        iam[node] = {"managed_policy_arns": [_plain(arn, region) for arn in managed],
                     "statements": _plain(statements, region)}
    return iam


def _policy_statements(arn: str) -> list:
    import boto3

    client = boto3.client("iam")
    version = client.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
    document = client.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
    document = json.loads(document) if isinstance(document, str) else document
    statements = document["Statement"]
    return statements if isinstance(statements, list) else [statements]


def _plain(value, region: str | None = None):
    """A JSON-ready value; with ``region``, CloudFormation's Fn::Join and pseudo parameters in it as plain strings."""
    if region is None:
        return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
    if isinstance(value, list):
        return [_plain(item, region) for item in value]
    if isinstance(value, dict) and set(value) == {"Fn::Join"}:
        separator, parts = value["Fn::Join"]
        return separator.join(_plain(part, region) for part in parts)
    if isinstance(value, dict) and set(value) == {"Ref"} and value["Ref"].startswith("AWS::"):
        return {"AWS::Partition": "aws", "AWS::Region": region, "AWS::URLSuffix": "amazonaws.com"}.get(value["Ref"], value["Ref"])
    if isinstance(value, dict):
        return {key: _plain(item, region) for key, item in value.items()}
    return value


if __name__ == "__main__":
    main()
