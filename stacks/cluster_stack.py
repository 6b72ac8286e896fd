"""What the head node needs from `cdk deploy`: the cluster config, the node scripts and the jobs bundle.

All three land in the assets bucket; the config is rendered from the settings and the network and
storage stacks' resources (tokens, resolved at deploy), so the bucket holds a config with the real
ids. With ``settings.create_cluster`` the stack also creates the cluster through ParallelCluster's
CloudFormation custom resource.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_cloudformation as cfn, aws_s3_deployment as s3deploy
import jsii
from constructs import Construct, IValidation

from cluster_config.plan import build_plan, format_plan
from cluster_config.render import (
    CONFIG_PREFIX,
    JOBS_PREFIX,
    NODE_SCRIPTS_PREFIX,
    PCLUSTER_VERSION,
    ClusterResources,
    config_key,
    render_cluster_config,
)
from cluster_config.settings import Settings
from stacks import nag
from stacks.network_stack import NetworkStack
from stacks.storage_stack import StorageStack

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSET_EXCLUDES = ["__pycache__", "*.pyc", ".pytest_cache"]


class ClusterStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        network: NetworkStack,
        storage: StorageStack,
        env: cdk.Environment,
        **kwargs,
    ) -> None:
        # A stack that owns a running cluster must not go by accident (see docs/cluster.md).
        super().__init__(scope, construct_id, env=env, termination_protection=settings.create_cluster, **kwargs)
        print(format_plan(build_plan(settings)), file=sys.stderr)

        self.resources = ClusterResources(
            head_node_subnet_id=network.head_node_subnet.subnet_id,
            compute_subnet_id=network.compute_subnet.subnet_id,
            head_node_security_group_id=network.head_node_sg.security_group_id,
            compute_security_group_id=network.compute_sg.security_group_id,
            file_system_ids={name: file_system.ref for name, file_system in storage.file_systems.items()},
            data_bucket=storage.data_bucket.bucket_name,
            checkpoint_bucket=storage.checkpoint_bucket.bucket_name,
            assets_bucket=storage.assets_bucket.bucket_name,
            placement_group_name=network.placement_group.ref if network.placement_group else None,
            partition=cdk.Aws.PARTITION,
        )
        self.config = render_cluster_config(settings, self.resources)
        bucket = storage.assets_bucket

        # One deployment per prefix: each prunes only what it owns.
        node_scripts = s3deploy.BucketDeployment(
            self,
            "NodeScripts",
            sources=[s3deploy.Source.asset(str(REPO_ROOT / "node_scripts"), exclude=ASSET_EXCLUDES)],
            destination_bucket=bucket,
            destination_key_prefix=NODE_SCRIPTS_PREFIX,
        )
        jobs = s3deploy.BucketDeployment(
            self,
            "JobsBundle",
            sources=[
                s3deploy.Source.asset(str(REPO_ROOT / "jobs"), exclude=ASSET_EXCLUDES),
                # The head node builds the jobs' venv from it (node_scripts/directory_setup.sh).
                s3deploy.Source.data("requirements-jobs.txt", (REPO_ROOT / "requirements-jobs.txt").read_text()),
            ],
            destination_bucket=bucket,
            destination_key_prefix=JOBS_PREFIX,
        )
        cluster_config = s3deploy.BucketDeployment(
            self,
            "ClusterConfig",
            # yaml_data resolves the tokens at deploy: the object holds the real subnet, group and FSx ids.
            sources=[s3deploy.Source.yaml_data(config_key(settings).removeprefix(CONFIG_PREFIX), self.config)],
            destination_bucket=bucket,
            destination_key_prefix=CONFIG_PREFIX,
        )
        self.deployments = {"node_scripts": node_scripts, "jobs": jobs, "config": cluster_config}

        config_uri = f"s3://{bucket.bucket_name}/{config_key(settings)}"
        cdk.CfnOutput(self, "ClusterConfigUri", value=config_uri, description="ParallelCluster config with real ids")
        cdk.CfnOutput(
            self,
            "CreateClusterCommand",
            description="Creates the cluster from the deployed config (skip when create_cluster is on)",
            value=(
                f"aws s3 cp {config_uri} {settings.cluster_name}.yaml && pcluster create-cluster "
                f"--region {settings.region} --cluster-name {settings.cluster_name} "
                f"--cluster-configuration {settings.cluster_name}.yaml"
            ),
        )

        self.cluster = self._create_cluster(settings) if settings.create_cluster else None
        if self.cluster is not None:
            # The nodes fetch their scripts and the jobs bundle at boot: upload before creating.
            for deployment in self.deployments.values():
                self.cluster.node.add_dependency(deployment)
        self._acknowledge_findings()

    def _create_cluster(self, settings: Settings) -> cdk.CustomResource:
        """ParallelCluster's own provider (a nested stack it publishes per region and version) creates it."""
        provider = cfn.CfnStack(
            self,
            "PclusterProvider",
            template_url=(
                f"https://{settings.region}-aws-parallelcluster.s3.{settings.region}.{cdk.Aws.URL_SUFFIX}"
                f"/parallelcluster/{PCLUSTER_VERSION}/templates/custom_resource/cluster.yaml"
            ),
        )
        cluster = cdk.CustomResource(
            self,
            "Cluster",
            service_token=provider.get_att("Outputs.ServiceToken").to_string(),
            resource_type="Custom::PclusterCluster",
            properties={
                "ClusterName": settings.cluster_name,  # differs from every stack name (llm-<env>-*)
                "ClusterConfiguration": self.config,
                # Deleting this stack deletes the cluster; the data stays in the retained buckets.
                "DeletionPolicy": "Delete",
            },
        )
        cdk.CfnOutput(self, "HeadNodeInstanceId", value=cluster.get_att_string("headNode.instanceId"))
        cdk.CfnOutput(self, "ValidationMessages", value=cluster.get_att_string("validationMessages"))
        return cluster

    def _acknowledge_findings(self) -> None:
        """CDK's bucket deployment function (one per stack) has findings that are CDK's design."""
        handler = next(c for c in self.node.children if c.node.id.startswith("Custom::CDKBucketDeployment"))
        nag.acknowledge(
            handler,
            "AwsSolutions::AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
            "CDK's bucket deployment function logs through the AWS managed basic execution policy.",
        )
        nag.acknowledge(
            handler,
            "AwsSolutions::AwsSolutions-L1",
            "aws-cdk-lib chooses and updates the runtime of its bucket deployment function with each release.",
        )
        policy = handler.node.find_child("ServiceRole").node.find_child("DefaultPolicy")
        # The object wildcards name buckets through cross-stack references, known only once CDK has
        # resolved them: acknowledge them in a validation, which runs after that and before cdk-nag.
        policy.node.add_validation(_AcknowledgeObjectWildcards(policy))


@jsii.implements(IValidation)
class _AcknowledgeObjectWildcards:
    """Acknowledge CDK's s3 action families and ``<bucket>/*`` resources in the deployment policy, nothing else."""

    ACTION_FAMILIES = ("s3:GetBucket*", "s3:GetObject*", "s3:List*", "s3:Abort*", "s3:DeleteObject*")

    def __init__(self, policy: Construct) -> None:
        self.policy = policy

    def validate(self) -> list[str]:
        stack = cdk.Stack.of(self.policy)
        document = stack.resolve(self.policy.node.default_child.policy_document)
        reason = (
            "CDK's bucket deployment function reads the CDK asset bucket and rewrites one prefix of the "
            "assets bucket; object keys are not known in advance, so it is granted bucket/* there only."
        )
        for statement in document["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            for action in actions:
                if action in self.ACTION_FAMILIES:
                    nag.acknowledge(self.policy, f"AwsSolutions::AwsSolutions-IAM5[Action::{action}]", reason)
            if not all(action.startswith("s3:") for action in actions):
                continue
            for resource in resources:
                text = _flatten(resource)
                if text.endswith("/*"):
                    nag.acknowledge(self.policy, f"AwsSolutions::AwsSolutions-IAM5[Resource::{text}]", reason)
        return []


def _flatten(value) -> str:
    """A resolved CloudFormation value as cdk-nag prints it (Fn::Join joined, other intrinsics as JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_flatten(part) for part in parts)
    return json.dumps(value, separators=(",", ":"))
