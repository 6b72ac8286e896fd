"""One IAM role per model: the only identity a model's jobs write to S3 with (docs/cluster.md, "Node roles")."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam, aws_s3 as s3
from constructs import Construct

from cluster_config.render import PCLUSTER_POLICY_PATH, model_role_name, model_role_path, model_role_policy
from cluster_config.settings import Settings
from stacks import nag


class ModelRoles(Construct):
    """A role per model of the settings, named by cluster_config.render.model_role_arn (the node scripts find it
    there), with that model's prefixes only. Only the cluster's node roles may assume them: root's credential
    helper on a node (node_scripts/model_credentials.sh) does, for the uid that calls it."""

    def __init__(
        self, scope: Construct, construct_id: str, *, settings: Settings, data_bucket: s3.IBucket, backup_bucket: s3.IBucket
    ) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        # ParallelCluster puts a cluster's node roles under /parallelcluster/<cluster name>/ (its cdk_builder_utils).
        node_roles = f"arn:{stack.partition}:iam::{stack.account}:role{PCLUSTER_POLICY_PATH}{settings.cluster_name}/*"
        self.roles: dict[str, iam.Role] = {}
        self.policies: dict[str, iam.ManagedPolicy] = {}
        for model in settings.models:
            policy = iam.ManagedPolicy(
                self, f"{model.name}Policy", description=f"{model.name}'s jobs: its own prefixes, new objects only",
                document=iam.PolicyDocument.from_json(model_role_policy(
                    model.name, data_bucket_arn=data_bucket.bucket_arn, backup_bucket_arn=backup_bucket.bucket_arn)))
            nag.acknowledge_model_role_policy(policy, model.name)
            self.policies[model.name] = policy
            self.roles[model.name] = iam.Role(
                self, f"{model.name}Role",
                role_name=model_role_name(settings.cluster_name, model.name),
                path=model_role_path(settings.cluster_name),
                description=f"{model.name}'s jobs on the cluster {settings.cluster_name} (node_scripts/model_credentials.sh)",
                assumed_by=iam.AccountRootPrincipal().with_conditions({"ArnLike": {"aws:PrincipalArn": node_roles}}),
                managed_policies=[policy],
                max_session_duration=cdk.Duration.hours(1),
            )
