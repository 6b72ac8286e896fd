"""What the head node needs from `cdk deploy`: the cluster config, the node scripts and the jobs bundle.

All three land in the assets bucket; the config is rendered from the settings and the network and
storage stacks' resources (tokens, resolved at deploy), so the bucket holds a config with the real
ids. With ``settings.create_cluster`` the stack also creates the cluster through ParallelCluster's
CloudFormation custom resource.
"""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_cloudformation as cfn, aws_iam as iam, aws_s3 as s3, aws_s3_deployment as s3deploy
from constructs import Construct

from cluster_config.render import (
    CONFIG_PREFIX,
    JOBS_PREFIX,
    NODE_SCRIPTS_PREFIX,
    PCLUSTER_POLICY_PATH,
    PCLUSTER_VERSION,
    ClusterResources,
    SlurmDatabase,
    config_key,
    data_upload_policy,
    models_file,
    models_key,
    model_roles_policy,
    render_cluster_config,
    session_manager_policy,
)
from cluster_config.capacity_end import capacity_end_file, capacity_end_key
from cluster_config.quotas import quotas_file, quotas_key
from cluster_config.model_jobs import job_files
from cluster_config.monitoring import monitoring_file, monitoring_key
from cluster_config.settings import Settings
from stacks import nag
from stacks.alerts_stack import AlertsStack
from stacks.database_stack import DatabaseStack
from stacks.model_roles import ModelRoles
from stacks.network_stack import NetworkStack
from stacks.storage_stack import StorageStack
from stacks.teammate_access import TeammateAccess

REPO_ROOT = Path(__file__).resolve().parent.parent
# The provider's own resources (a Lambda, its role and log group) deploy in minutes; a stuck nested
# stack should fail the deploy long before CloudFormation's default of no timeout.
PROVIDER_TIMEOUT_MINUTES = 30
ASSET_EXCLUDES = ["__pycache__", "*.pyc", ".pytest_cache"]
# What `python -m cluster_config jobs` writes into a checkout's jobs/ (the local cluster's): the bundle
# carries this environment's own, from job_files below (model_jobs.GENERATED; a literal list, which
# local_cluster/boot_plan.py reads from this source).
GENERATED_EXCLUDES = ["train_*.sh", "models/*.yaml", "models/*.megatron.args", "models/cluster.json"]


class ClusterStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        network: NetworkStack,
        storage: StorageStack,
        database: DatabaseStack,
        alerts: AlertsStack,
        env: cdk.Environment,
        **kwargs,
    ) -> None:
        # A stack that owns a running cluster must not go by accident (see docs/cluster.md).
        super().__init__(scope, construct_id, env=env, termination_protection=settings.create_cluster, **kwargs)

        # The cluster roles' rights beyond ParallelCluster's read-only S3Access (docs/cluster.md has the table).
        # Write access to the data bucket: uploads users run on the head node (README, data pipeline)
        # and the CPU queue's dataset sync.
        self.data_upload_policy = self._cluster_policy(
            "HeadNodeDataUpload", "The head node and the CPU queue upload to and read the data bucket; they may not delete",
            data_upload_policy(storage.data_bucket.bucket_arn))
        nag.acknowledge_data_upload_policy(self.data_upload_policy)
        # A model's jobs write S3 through a role of its model's, which the compute nodes' root assumes for the
        # job's uid (node_scripts/model_credentials.sh): one model's job cannot write another model's prefixes.
        self.model_roles = ModelRoles(self, "ModelRoles", settings=settings, data_bucket=storage.data_bucket,
                                      backup_bucket=storage.backup_bucket)
        # A teammate enters the head node as their model's user through Session Manager's Run As.
        self.teammate_access = TeammateAccess(self, "TeammateAccess", settings=settings)
        self.model_roles_policy = self._cluster_policy(
            "AssumeModelRoles", "The compute nodes assume this cluster's models' roles, for each model's own jobs",
            model_roles_policy(self.partition, self.account, settings.cluster_name))
        nag.acknowledge_model_roles_policy(self.model_roles_policy)
        # Session Manager on every node, without AmazonSSMManagedInstanceCore's Parameter Store reads.
        self.session_manager_policy = self._cluster_policy(
            "SessionManager", "Session Manager's instance-side calls only: no Parameter Store, no Run Command",
            session_manager_policy(self.partition, self.region, self.account))
        nag.acknowledge_session_manager_policy(self.session_manager_policy)
        self.resources = ClusterResources(
            head_node_subnet_id=network.head_node_subnet.subnet_id,
            compute_subnet_id=network.compute_subnet.subnet_id,
            head_node_security_group_id=network.head_node_sg.security_group_id,
            compute_security_group_id=network.compute_sg.security_group_id,
            file_system_ids={name: file_system.ref for name, file_system in storage.file_systems.items()},
            data_bucket=storage.data_bucket.bucket_name,
            checkpoint_bucket=storage.checkpoint_bucket.bucket_name,
            assets_bucket=storage.assets_bucket.bucket_name,
            backup_bucket=storage.backup_bucket.bucket_name,
            data_upload_policy_arn=self.data_upload_policy.managed_policy_arn,
            model_roles_policy_arn=self.model_roles_policy.managed_policy_arn,
            session_manager_policy_arn=self.session_manager_policy.managed_policy_arn,
            monitoring_policy_arn=alerts.head_node_policy.managed_policy_arn,
            placement_group_name=network.placement_group.ref if network.placement_group else None,
            database=SlurmDatabase(uri=database.uri, user_name=database.instance_user, password_secret_arn=database.secret.secret_arn),
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
                s3deploy.Source.asset(str(REPO_ROOT / "jobs"), exclude=ASSET_EXCLUDES + GENERATED_EXCLUDES),
                # Each model's job script and training config, derived from its entry in the settings, and
                # the cluster file the bundle's commands read instead of the settings (models/cluster.json).
                *(s3deploy.Source.data(path, text) for path, text in job_files(settings).items()),
                # The head node builds the jobs' venv from it (node_scripts/directory_setup.sh).
                s3deploy.Source.data("requirements-jobs.txt", (REPO_ROOT / "requirements-jobs.txt").read_text()),
                # torchao for train.float8, installed apart from the venv (directory_setup.sh).
                s3deploy.Source.data("requirements-float8.txt", (REPO_ROOT / "requirements-float8.txt").read_text()),
            ],
            destination_bucket=bucket,
            destination_key_prefix=JOBS_PREFIX,
        )
        cluster_config = s3deploy.BucketDeployment(
            self,
            "ClusterConfig",
            # yaml_data resolves the tokens at deploy: the object holds the real subnet, group and FSx ids.
            # The model list the node scripts read goes with it (see render.models_key), and the metric
            # agents' settings with the workspace's remote-write URL (cluster_config/monitoring.py).
            sources=[
                s3deploy.Source.yaml_data(config_key(settings).removeprefix(CONFIG_PREFIX), self.config),
                s3deploy.Source.data(models_key(settings).removeprefix(CONFIG_PREFIX), models_file(settings)),
                # The GPU queue's end, for the head node's maintenance reservation (cluster_config/capacity_end.py).
                s3deploy.Source.data(capacity_end_key(settings).removeprefix(CONFIG_PREFIX), capacity_end_file(settings)),
                # Each model's project quota on the checkpoint file system, from the plan (cluster_config/quotas.py).
                s3deploy.Source.data(quotas_key(settings).removeprefix(CONFIG_PREFIX), quotas_file(settings)),
                s3deploy.Source.data(
                    monitoring_key(settings).removeprefix(CONFIG_PREFIX),
                    monitoring_file(settings, remote_write_url=alerts.remote_write_url, region=settings.region),
                ),
            ],
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

        self.cluster = self._create_cluster(settings, bucket) if settings.create_cluster else None
        if self.cluster is not None:
            # The nodes fetch their scripts and the jobs bundle at boot: upload before creating.
            for deployment in self.deployments.values():
                self.cluster.node.add_dependency(deployment)

    def _create_cluster(self, settings: Settings, assets_bucket: s3.IBucket) -> cdk.CustomResource:
        """ParallelCluster's own provider (a nested stack it publishes per region and version) creates it."""
        # The provider's Lambda validates the config like `pcluster create-cluster`, which reads the
        # node scripts' S3 URLs; its own policies cover only parallelcluster-* buckets, so it would get
        # AccessDenied on the assets bucket. The template's AdditionalIamPolicies parameter adds this one.
        read_assets = iam.ManagedPolicy(
            self,
            "PclusterProviderReadAssets",
            description="ParallelCluster's provider Lambda reads the node scripts in the assets bucket",
            statements=[
                iam.PolicyStatement(actions=["s3:GetObject"], resources=[assets_bucket.arn_for_objects(f"{NODE_SCRIPTS_PREFIX}*")]),
                iam.PolicyStatement(actions=["s3:GetBucketLocation", "s3:ListBucket"], resources=[assets_bucket.bucket_arn]),
            ],
        )
        nag.acknowledge_provider_policy(read_assets)
        provider = cfn.CfnStack(
            self,
            "PclusterProvider",
            template_url=(
                f"https://{settings.region}-aws-parallelcluster.s3.{settings.region}.{cdk.Aws.URL_SUFFIX}"
                f"/parallelcluster/{PCLUSTER_VERSION}/templates/custom_resource/cluster.yaml"
            ),
            parameters={"AdditionalIamPolicies": read_assets.managed_policy_arn},
            timeout_in_minutes=PROVIDER_TIMEOUT_MINUTES,
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

    def _cluster_policy(self, construct_id: str, description: str, document: dict) -> iam.ManagedPolicy:
        """A managed policy under the path ParallelCluster attaches AdditionalIamPolicies from."""
        return iam.ManagedPolicy(self, construct_id, description=description, path=PCLUSTER_POLICY_PATH,
                                 document=iam.PolicyDocument.from_json(document))
