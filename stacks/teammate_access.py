"""A Session Manager role per model: a teammate who assumes it lands on the head node as the model's own Unix user.

Session Manager's Run As starts a session as the OS user named by the ``SSMSessionRunAs`` tag of the IAM role
(or user) that starts it, once Run As is enabled in the account's Session Manager preferences (the
``SSM-SessionManagerRunShell`` document; docs/deploy.md, "A teammate enters as their model", has the command).
Each role carries its model's user in that tag, may start sessions only on this cluster's head node (the tags
ParallelCluster gives it: ``parallelcluster:cluster-name``, ``parallelcluster:node-type=HeadNode``) and only
with the standard shell document, and cannot change its tag: its trust allows ``sts:AssumeRole`` alone (no
``sts:TagSession``, so no session tag can override the role's), and it has no IAM actions.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import Construct

from cluster_config.settings import Settings
from stacks import nag

RUN_AS_TAG = "SSMSessionRunAs"
SHELL_DOCUMENT = "SSM-SessionManagerRunShell"  # the preferences document, which Run As is enabled in
SESSION_ROLE_PATH = "/llm-sessions/"
# ParallelCluster's tags on every instance of a cluster (pcluster.constants, cdk_builder_utils.get_default_instance_tags).
CLUSTER_NAME_TAG, NODE_TYPE_TAG = "parallelcluster:cluster-name", "parallelcluster:node-type"


def session_role_name(cluster_name: str, model: str) -> str:
    return f"{cluster_name}-{model}-session"


def session_policy(partition: str, region: str, account: str, cluster_name: str) -> dict:
    """The same for every model: which user a session runs as is the role's tag, not the policy."""
    checked = {"BoolIfExists": {"ssm:SessionDocumentAccessCheck": "true"}}  # the document is checked, not skipped
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "StartSessionOnHeadNode", "Effect": "Allow", "Action": "ssm:StartSession",
             "Resource": f"arn:{partition}:ec2:{region}:{account}:instance/*",
             "Condition": {"StringEquals": {f"ssm:resourceTag/{CLUSTER_NAME_TAG}": cluster_name,
                                            f"ssm:resourceTag/{NODE_TYPE_TAG}": "HeadNode"}, **checked}},
            {"Sid": "StartSessionShellOnly", "Effect": "Allow", "Action": "ssm:StartSession",
             "Resource": f"arn:{partition}:ssm:{region}:{account}:document/{SHELL_DOCUMENT}", "Condition": checked},
            {"Sid": "OwnSessions", "Effect": "Allow", "Action": ["ssm:ResumeSession", "ssm:TerminateSession"],
             "Resource": f"arn:{partition}:ssm:{region}:{account}:session/${{aws:userid}}-*"},
            {"Sid": "FindHeadNode", "Effect": "Allow",
             "Action": ["ec2:DescribeInstances", "ssm:DescribeInstanceInformation", "ssm:GetConnectionStatus"],
             "Resource": "*"},
        ],
    }


class TeammateAccess(Construct):
    """One role per model of the settings, assumable by the account's principals that its administrators allow
    (sts:AssumeRole on the role's ARN: the output ``<model>SessionRoleArn``)."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self.policy = iam.ManagedPolicy(
            self, "SessionPolicy", description=f"Session Manager on {settings.cluster_name}'s head node only",
            document=iam.PolicyDocument.from_json(
                session_policy(stack.partition, stack.region, stack.account, settings.cluster_name)))
        nag.acknowledge_teammate_session_policy(self.policy)
        self.roles: dict[str, iam.Role] = {}
        for model in settings.models:
            role = iam.Role(
                self, f"{model.name}SessionRole",
                role_name=session_role_name(settings.cluster_name, model.name),
                path=f"{SESSION_ROLE_PATH}{settings.cluster_name}/",
                description=f"Session Manager on {settings.cluster_name}'s head node as the Unix user {model.name}",
                assumed_by=iam.AccountRootPrincipal(),
                managed_policies=[self.policy],
                max_session_duration=cdk.Duration.hours(1),
            )
            cdk.Tags.of(role).add(RUN_AS_TAG, model.name)  # each model's jobs run as a user of the model's name
            cdk.CfnOutput(self, f"{model.name}SessionRoleArn", value=role.role_arn,
                          description=f"assume it, then aws ssm start-session to the head node: you are {model.name}")
            self.roles[model.name] = role
