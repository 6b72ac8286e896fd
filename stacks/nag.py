"""cdk-nag (3.x) AwsSolutions checks and every acknowledged finding of every stack, each with its reason.

Findings make synth fail (they are reported in ``cdk.out/<env>/validation-report.json``). A
finding is accepted only through ``acknowledge()``, on the narrowest construct that has it, with a
written reason. cdk-nag 3 matches granular findings one by one: ``AwsSolutions-IAM5[Action::s3:List*]``.
"""

from __future__ import annotations

import json
import re

import aws_cdk as cdk
import jsii
from cdk_nag import AwsSolutionsChecks
from constructs import Construct, IConstruct, IValidation

from stacks.network_stack import NetworkStack


def add_checks(app: cdk.App) -> None:
    """Run the AwsSolutions rules over every stack of ``app`` at synth."""
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Accept ``finding`` (e.g. ``AwsSolutions-S1``) on ``scope`` and everything below it."""
    if len(reason.split()) < 5:
        raise ValueError(f"acknowledging {finding} on {scope.node.path} needs a reason of a sentence or more")
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=finding, reason=reason))


def acknowledge_network(network: NetworkStack) -> None:
    """The network stack's accepted findings (the storage stack has none)."""
    for subnet in (network.head_node_subnet, network.compute_subnet):
        acknowledge(
            subnet,
            "CloudFormation-Validate::W3010",
            "The zone is the capacity reservation's zone from the settings; the reserved GPUs exist only there.",
        )


def acknowledge_database(database: Construct) -> None:
    """The Slurm accounting database's accepted findings (stacks/database_stack.py)."""
    acknowledge(
        database.instance,
        "CloudFormation-Validate::W3010",
        "The instance sits in the cluster's zone from the settings, next to the head node it serves.",
    )
    acknowledge(
        database.secret,
        "AwsSolutions::AwsSolutions-SMG4",
        "ParallelCluster writes the password into slurmdbd.conf when the head node is configured; a rotation "
        "would lock slurmdbd out until the next cluster update, so the password is rotated by redeploying.",
    )
    acknowledge(
        database.instance,
        "AwsSolutions::AwsSolutions-RDS3",
        "One instance in the cluster's zone: the whole cluster is single-zone, and slurmctld keeps "
        "working without slurmdbd for hours (it queues accounting records) while RDS replaces an instance.",
    )
    acknowledge(
        database.instance,
        "AwsSolutions::AwsSolutions-RDS11",
        "slurmdbd is configured by ParallelCluster from a host:port URI; the port is closed to everything "
        "but the head node's security group, so a non-default port would hide nothing.",
    )


def acknowledge_bucket_deployment(stack: cdk.Stack) -> None:
    """CDK's bucket deployment function (one per stack, used by the cluster stack) has findings that are CDK's design."""
    handler = next(c for c in stack.node.children if c.node.id.startswith("Custom::CDKBucketDeployment"))
    acknowledge(
        handler,
        "AwsSolutions::AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
        "CDK's bucket deployment function logs through the AWS managed basic execution policy.",
    )
    acknowledge(
        handler,
        "AwsSolutions::AwsSolutions-L1",
        "aws-cdk-lib chooses and updates the runtime of its bucket deployment function with each release.",
    )
    policy = handler.node.find_child("ServiceRole").node.find_child("DefaultPolicy")
    # The object wildcards name buckets through cross-stack references, known only once CDK has
    # resolved them: acknowledge them in a validation, which runs after that and before cdk-nag.
    policy.node.add_validation(_AcknowledgeObjectWildcards(policy, (
        "CDK's bucket deployment function reads the CDK asset bucket and rewrites one prefix of the "
        "assets bucket; object keys are not known in advance, so it is granted bucket/* there only."
    )))


def acknowledge_provider_policy(policy: Construct) -> None:
    """The policy the cluster stack gives ParallelCluster's provider Lambda (create_cluster: true)."""
    policy.node.add_validation(_AcknowledgeObjectWildcards(policy, (
        "ParallelCluster's provider Lambda checks the node scripts' S3 URLs; it may read objects under "
        "the node_scripts/ prefix of the assets bucket, whose script names the config chooses."
    )))


def acknowledge_data_upload_policy(policy: Construct) -> None:
    """The head node's upload policy on the data bucket (cluster_config.render.data_upload_policy)."""
    policy.node.add_validation(_AcknowledgeObjectWildcards(policy, (
        "Users upload raw text and datasets from the head node under keys they choose; it may read and "
        "write objects of the data bucket (bucket/*), with no delete action at all."
    )))


def acknowledge_model_role_policy(policy: Construct, model: str) -> None:
    """A model's role's policy (cluster_config.render.model_role_policy)."""
    policy.node.add_validation(_AcknowledgeObjectWildcards(policy, (
        f"{model}'s jobs read datasets (shared by design) and write a new key per shard, checkpoint file and log "
        f"under {model}'s own prefixes only; the bucket policies refuse any overwrite and any delete."
    )))


def acknowledge_model_roles_policy(policy: Construct) -> None:
    """The compute queues' right to assume the models' roles (cluster_config.render.model_roles_policy)."""
    policy.node.add_validation(_AcknowledgeStatementResources(policy, {
        "AssumeModelRoles": "The roles of this cluster's models, one folder of IAM path per cluster; the credential "
                            "helper, as root, assumes the caller's model's role only.",
    }))


def acknowledge_session_manager_policy(policy: Construct) -> None:
    """Session Manager on every node (cluster_config.render.session_manager_policy)."""
    policy.node.add_validation(_AcknowledgeStatementResources(policy, {
        "RegisterInstance": "The agent registers its own instance; instance ids are assigned at launch, so the "
                            "account's instances in the region are named.",
        "SessionChannels": "The ssmmessages session-channel actions have no resource types (Service Authorization "
                           "Reference); they open Session Manager channels for this instance only.",
    }))


def acknowledge_teammate_session_policy(policy: Construct) -> None:
    """The models' Session Manager roles (stacks/teammate_access.py)."""
    policy.node.add_validation(_AcknowledgeStatementResources(policy, {
        "StartSessionOnHeadNode": "Instance ids are assigned at launch; the condition holds it to the instance tagged "
                                  "as this cluster's head node by ParallelCluster.",
        "StartSessionShellOnly": "One document, named: the standard shell, in which Run As applies.",
        "OwnSessions": "Session ids start with the caller's own user id: a teammate resumes or ends their own sessions only.",
        "FindHeadNode": "These describe calls have no resource-level permissions (Service Authorization Reference); "
                        "they find the head node's instance id and whether its agent is online.",
    }))


def acknowledge_monitoring_policy(policy: Construct) -> None:
    """The head node's metric agent policy (cluster_config.monitoring.head_node_policy)."""
    acknowledge(
        policy,
        "AwsSolutions::AwsSolutions-IAM5[Resource::*]",
        "Prometheus' EC2 service discovery lists the compute nodes with ec2:DescribeInstances, which has no "
        "resource-level permissions (Service Authorization Reference); the policy's other action, remote write, "
        "names the workspace.",
    )


@jsii.implements(IValidation)
class _AcknowledgeObjectWildcards:
    """Acknowledge CDK's s3 action families and ``<bucket>/*`` resources in one policy, nothing else."""

    ACTION_FAMILIES = ("s3:GetBucket*", "s3:GetObject*", "s3:List*", "s3:Abort*", "s3:DeleteObject*")

    def __init__(self, policy: Construct, reason: str) -> None:
        self.policy = policy
        self.reason = reason

    def validate(self) -> list[str]:
        stack = cdk.Stack.of(self.policy)
        document = stack.resolve(self.policy.node.default_child.policy_document)
        reason = self.reason
        for statement in document["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            for action in actions:
                if action in self.ACTION_FAMILIES:
                    acknowledge(self.policy, f"AwsSolutions::AwsSolutions-IAM5[Action::{action}]", reason)
            if not all(action.startswith("s3:") for action in actions):
                continue
            for resource in resources:
                text = _flatten(resource)
                if text.endswith("/*"):
                    acknowledge(self.policy, f"AwsSolutions::AwsSolutions-IAM5[Resource::{text}]", reason)
        return []


@jsii.implements(IValidation)
class _AcknowledgeStatementResources:
    """Acknowledge the wildcard resource of each named statement (Sid) of one policy, with its own reason;
    resolved at validation time, like the ARNs cdk-nag reports."""

    def __init__(self, policy: Construct, reasons: dict[str, str]) -> None:
        self.policy = policy
        self.reasons = reasons

    def validate(self) -> list[str]:
        document = cdk.Stack.of(self.policy).resolve(self.policy.node.default_child.policy_document)
        for statement in document["Statement"]:
            # cdk-nag writes an IAM policy variable ${aws:userid} as <aws:userid>.
            resource = re.sub(r"\$\{([^}]*)\}", r"<\1>", _flatten(statement["Resource"]))
            acknowledge(self.policy, f"AwsSolutions::AwsSolutions-IAM5[Resource::{resource}]", self.reasons[statement["Sid"]])
        return []


def _flatten(value) -> str:
    """A resolved CloudFormation value as cdk-nag prints it (Fn::Join joined, other intrinsics as JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_flatten(part) for part in parts)
    if isinstance(value, dict) and "Fn::ImportValue" in value:  # a strong cross-stack reference: its export name
        return value["Fn::ImportValue"]
    return json.dumps(value, separators=(",", ":"))
