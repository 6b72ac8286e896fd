"""Render the ParallelCluster v3 cluster config from settings and the ids of the stacks' resources.

``render_cluster_config`` is pure: the same inputs give the same dict. The CDK stack calls it with
CloudFormation tokens (resolved when the config is deployed to the assets bucket); tests and
``python -m cluster_config render`` call it with ``ClusterResources.placeholders``, ids that have the
real ids' shapes so ParallelCluster's schema checks them like real ones.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import yaml

from cluster_config.capacity_end import capacity_end_digest
from cluster_config.settings import CONFIG_PREFIX, PCLUSTER_VERSION, Settings
from cluster_config.slurm_timeouts import custom_slurm_settings

# Amazon Linux 2023: supported by ParallelCluster 3.16 (Amazon Linux 2 is gone from it), kernel 6.1
# with current EFA and Lustre clients, and the OS ParallelCluster's own AMIs and examples lead with.
OS = "alinux2023"

# Where the stack puts things in the assets bucket; node scripts and docs use the same keys.
NODE_SCRIPTS_PREFIX = "node_scripts/"
JOBS_PREFIX = "jobs/"
NODE_SETUP_SCRIPT = "node_setup.sh"  # OnNodeStart
DIRECTORY_SETUP_SCRIPT = "directory_setup.sh"  # OnNodeConfigured (and OnNodeUpdated on the head node)
# The model list travels as a file next to the config, not as script arguments: ParallelCluster
# refuses any change to OnNodeConfigured on a running cluster, so those arguments never change,
# while OnNodeUpdated (allowed to change) carries the list's digest and makes an update refresh it.

# Shared EBS volume the head node exports over NFS: the jobs bundle and the jobs' Python
# environment, built once by the head node (jobs/env.sh defaults JOBS_VENV to <this>/venv).
JOBS_HOME = "/opt/llm-jobs"
JOBS_HOME_SIZE_GIB = 100
# Instance-store NVMe: ParallelCluster stripes all of a node's instance-store disks into one
# volume (LVM, one stripe per disk: RAID 0) and mounts it here; the node scripts keep a data cache on it.
LOCAL_CACHE_DIR = "/local_cache"

# The head node (users, README: `python -m data_pipeline.upload sync ... s3://<data bucket>/...`) and
# the CPU queue (jobs/sync_dataset.sh, the same command) upload to the data bucket and read it back
# (verify, restore). ParallelCluster's S3Access with EnableWriteAccess grants s3:* on a bucket, which
# would let any job delete every dataset or change the bucket's encryption, ACLs or object lock; this
# policy grants the upload's own calls only: HeadBucket and listing (ListBucket), HeadObject and
# GetObject, PutObject (multipart uploads included) and cleaning up a failed multipart upload. No
# delete of any kind. Dataset keys are chosen by users (any path under the data file system), so the
# objects are granted bucket-wide.
DATA_UPLOAD_BUCKET_ACTIONS = ("s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads")
DATA_UPLOAD_OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts")
# ParallelCluster attaches AdditionalIamPolicies only from policy/parallelcluster* or policy/parallelcluster/*
# when it runs with its documented least-privilege permissions (its CLI user policy, and the provider
# Lambda of create_cluster: true): the policy lives under this path.
PCLUSTER_POLICY_PATH = "/parallelcluster/"
# Each model's S3 writes come from a role of its own (stacks/model_roles.py), never from a node's role:
# every job on a node could use the node's role, so a model's job could write another model's prefixes.
# The nodes keep the instance credentials from every user but root and the cluster's user
# (node_setup.sh), and a model's user gets its own role's credentials from a root-owned helper that
# assumes the role of the caller's uid (node_scripts/model_credentials.sh, docs/cluster.md).
# The roles live under this path, one folder per cluster; the nodes' roles may assume those of their cluster.
MODEL_ROLE_PATH = "/llm-models/"
# What a model's job writes: new objects under its own prefixes, and cleaning up its own failed multipart
# uploads. PutObject covers CreateMultipartUpload, UploadPart and CompleteMultipartUpload. The bucket
# policies (stacks/storage_stack.py) refuse a write without If-None-Match there, so no key is ever replaced.
MODEL_WRITE_ACTIONS = ("s3:PutObject", "s3:AbortMultipartUpload")
# A model's own prefix in the data bucket (its tokenized dataset, as MODEL=<name> sbatch jobs/preprocess.sh makes it).
MODEL_DATA_PREFIX = "tokenized/{model}/"
# Session Manager's instance-side calls (the documented minimal instance profile for Session Manager;
# AWS's managed AWSCloud9SSMInstanceProfile holds the same five): the agent registers the instance and
# opens the session channels. No Parameter Store, Run Command, inventory or patching, and no session
# logging to S3 or KMS-encrypted sessions (add s3:GetEncryptionConfiguration / kms:Decrypt if either is
# turned on in the account's Session Manager preferences).
SESSION_MANAGER_INSTANCE_ACTIONS = ("ssm:UpdateInstanceInformation",)
SESSION_MANAGER_CHANNEL_ACTIONS = ("ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
                                   "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel")

SCALEDOWN_IDLE_MINUTES = 15  # idle dynamic nodes go after this; a job queued meanwhile reuses them warm
LOG_RETENTION_DAYS = 90
FILE_SYSTEM_KEYS = ("data", "checkpoints", "logs")


class RenderError(ValueError):
    """Settings or resource ids that cannot make a valid cluster config; the message says the fix."""


# Slurm enforces each model's account and QOS (node_scripts/slurm_accounts.sh): a job needs an
# association, and QOS limits (the model's node share, one running job) hold.
ACCOUNTING_ENFORCE = "associations,limits,qos"


@dataclass(frozen=True)
class SlurmDatabase:
    """The accounting database slurmdbd uses (stacks/database_stack.py)."""

    uri: str  # host:port
    user_name: str
    password_secret_arn: str  # Secrets Manager secret holding the password as a plain string


@dataclass(frozen=True)
class ClusterResources:
    """Ids of what the network and storage stacks created (tokens in the stack, placeholders elsewhere)."""

    head_node_subnet_id: str
    compute_subnet_id: str
    head_node_security_group_id: str
    compute_security_group_id: str
    file_system_ids: Mapping[str, str]  # keys: data, checkpoints, logs
    data_bucket: str
    checkpoint_bucket: str
    assets_bucket: str
    backup_bucket: str
    data_upload_policy_arn: str  # the managed policy of data_upload_policy(): head node and CPU queue (the cluster's user)
    model_roles_policy_arn: str  # the managed policy of model_roles_policy(): the compute queues assume the models' roles
    session_manager_policy_arn: str  # the managed policy of session_manager_policy(): every node
    monitoring_policy_arn: str  # the head node's metric agent: remote write, EC2 discovery (stacks/alerts_stack.py)
    placement_group_name: Optional[str] = None
    database: Optional[SlurmDatabase] = None

    @classmethod
    def placeholders(cls, settings: Settings) -> "ClusterResources":
        """Ids shaped like real ones (subnet-0…, sg-0…, fs-0…), stable per environment."""

        def fake(prefix: str, name: str) -> str:
            digest = hashlib.sha256(f"{settings.name}/{prefix}/{name}".encode()).hexdigest()
            return f"{prefix}-0{digest[:16]}"

        placement_group = f"{settings.cluster_name}-gpu" if settings.gpu_queue.placement_group else None
        kept = settings.storage.keep_buckets
        return cls(
            head_node_subnet_id=fake("subnet", "head-node"),
            compute_subnet_id=fake("subnet", "compute"),
            head_node_security_group_id=fake("sg", "head-node"),
            compute_security_group_id=fake("sg", "compute"),
            file_system_ids={key: fake("fs", key) for key in FILE_SYSTEM_KEYS},
            # A bucket storage.keep_buckets names is adopted under its own name (stacks/storage_stack.py).
            data_bucket=kept.data or f"{settings.cluster_name}-data-{settings.account}",
            checkpoint_bucket=kept.checkpoints or f"{settings.cluster_name}-checkpoints-{settings.account}",
            assets_bucket=f"{settings.cluster_name}-assets-{settings.account}",
            backup_bucket=kept.backups or f"{settings.cluster_name}-backups-{settings.account}",
            data_upload_policy_arn=f"arn:aws:iam::{settings.account}:policy{PCLUSTER_POLICY_PATH}{settings.cluster_name}-data-upload",
            model_roles_policy_arn=f"arn:aws:iam::{settings.account}:policy{PCLUSTER_POLICY_PATH}{settings.cluster_name}-model-roles",
            session_manager_policy_arn=(
                f"arn:aws:iam::{settings.account}:policy{PCLUSTER_POLICY_PATH}{settings.cluster_name}-session-manager"
            ),
            monitoring_policy_arn=f"arn:aws:iam::{settings.account}:policy{PCLUSTER_POLICY_PATH}{settings.cluster_name}-monitoring",
            placement_group_name=placement_group,
            database=SlurmDatabase(
                uri=f"{settings.cluster_name}-accounting.c0abcdefghij.{settings.region}.rds.amazonaws.com:3306",
                user_name="slurm",
                password_secret_arn=(
                    f"arn:aws:secretsmanager:{settings.region}:{settings.account}:secret:{settings.cluster_name}-slurmdbd-AbCdEf"
                ),
            ),
        )


def render_cluster_config(settings: Settings, resources: ClusterResources) -> dict[str, Any]:
    """The ParallelCluster config (as a dict) for ``settings`` on ``resources``."""
    missing = [key for key in FILE_SYSTEM_KEYS if key not in resources.file_system_ids]
    if missing:
        raise RenderError(f"file_system_ids lacks {missing}; pass one FSx file system id per key {list(FILE_SYSTEM_KEYS)}")
    if settings.gpu_queue.placement_group and not resources.placement_group_name:
        raise RenderError(
            "gpu_queue.placement_group is true but no placement group was created; "
            "the network stack must pass its placement group, or set placement_group: false"
        )
    return {
        "Region": settings.region,
        "Image": {"Os": OS},
        "Imds": {"ImdsSupport": "v2.0"},  # IMDSv2 only, on every node
        "HeadNode": _head_node(settings, resources),
        "Scheduling": _scheduling(settings, resources),
        "SharedStorage": _shared_storage(settings, resources),
        "Monitoring": {
            "DetailedMonitoring": True,
            "Logs": {"CloudWatch": {"Enabled": True, "RetentionInDays": LOG_RETENTION_DAYS, "DeletionPolicy": "Retain"}},
            "Dashboards": {"CloudWatch": {"Enabled": True}},
            "Alarms": {"Enabled": True},
        },
        "DevSettings": {
            "Timeouts": {
                # The head node's custom actions build the jobs' venv (settings.py says why it is longer).
                "HeadNodeBootstrapTimeout": settings.head_node.bootstrap_timeout_s,
                "ComputeNodeBootstrapTimeout": settings.compute_bootstrap_timeout_s,
            },
        },
        "Tags": [{"Key": key, "Value": value} for key, value in sorted(settings.tags.items())],
    }


def to_yaml(config: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=False, width=120)


def script_uri(resources: ClusterResources, script: str) -> str:
    return f"s3://{resources.assets_bucket}/{NODE_SCRIPTS_PREFIX}{script}"


def config_key(settings: Settings) -> str:
    return f"{CONFIG_PREFIX}{settings.cluster_name}.yaml"


def models_key(settings: Settings) -> str:
    return f"{CONFIG_PREFIX}{settings.cluster_name}.models"


def models_file(settings: Settings) -> str:
    """The model list the nodes read, "<name> <nodes> <role arn>" a line; the cluster stack ships it next to the
    config. The head node makes each model's Slurm account and QOS from it (node_scripts/slurm_accounts.sh); every
    node gives each model's user its role's credentials (node_scripts/model_credentials.sh)."""
    # A model's share: the nodes it trains on and its hot spares, all in its one allocation.
    return "".join(f"{model.name} {model.nodes + model.hot_spares} {model_role_arn(settings, model.name)}\n"
                   for model in settings.models)


def partition_of(region: str) -> str:
    return "aws-cn" if region.startswith("cn-") else "aws-us-gov" if region.startswith("us-gov-") else "aws"


def model_role_arn(settings: Settings, model: str) -> str:
    """The ARN of ``model``'s role (stacks/model_roles.py names it so)."""
    return (f"arn:{partition_of(settings.region)}:iam::{settings.account}:role"
            f"{model_role_path(settings.cluster_name)}{model_role_name(settings.cluster_name, model)}")


def data_upload_policy(data_bucket_arn: str) -> dict[str, Any]:
    """The head node's and the CPU queue's policy on the data bucket (an IAM policy document); the cluster stack creates it."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ListDataBucket", "Effect": "Allow", "Action": list(DATA_UPLOAD_BUCKET_ACTIONS),
             "Resource": data_bucket_arn},
            {"Sid": "ReadWriteDataObjects", "Effect": "Allow", "Action": list(DATA_UPLOAD_OBJECT_ACTIONS),
             "Resource": f"{data_bucket_arn}/*"},
        ],
    }


def model_role_name(cluster_name: str, model: str) -> str:
    """The IAM role of ``model``'s jobs (stacks/model_roles.py); the credential helper builds its ARN from it."""
    return f"{cluster_name}-{model}"


def model_role_path(cluster_name: str) -> str:
    return f"{MODEL_ROLE_PATH}{cluster_name}/"


def model_role_policy(model: str, *, data_bucket_arn: str, backup_bucket_arn: str) -> dict[str, Any]:
    """What ``model``'s jobs may do in S3 (an IAM policy document): read the data bucket (datasets may be
    shared), write new objects under its own dataset prefix there, and read and write new objects under
    its own prefix of the backup bucket. Nothing at another model's prefix, no delete, no s3:*."""
    data_prefix = MODEL_DATA_PREFIX.format(model=model)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ListData", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": data_bucket_arn},
            {"Sid": "ReadData", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": f"{data_bucket_arn}/*"},
            {"Sid": "WriteOwnDataset", "Effect": "Allow", "Action": list(MODEL_WRITE_ACTIONS),
             "Resource": f"{data_bucket_arn}/{data_prefix}*"},
            {"Sid": "ListOwnBackups", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": backup_bucket_arn,
             "Condition": {"StringLike": {"s3:prefix": [f"{model}/*"]}}},
            {"Sid": "ReadWriteOwnBackups", "Effect": "Allow", "Action": ["s3:GetObject", *MODEL_WRITE_ACTIONS],
             "Resource": f"{backup_bucket_arn}/{model}/*"},
        ],
    }


def model_roles_policy(partition: str, account: str, cluster_name: str) -> dict[str, Any]:
    """The compute queues' right to assume the roles of this cluster's models (the credential helper, as root)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "AssumeModelRoles", "Effect": "Allow", "Action": ["sts:AssumeRole"],
             "Resource": f"arn:{partition}:iam::{account}:role{model_role_path(cluster_name)}*"},
        ],
    }


def session_manager_policy(partition: str, region: str, account: str) -> dict[str, Any]:
    """Session Manager on every node, in place of AmazonSSMManagedInstanceCore (which also grants
    ssm:GetParameter* on every parameter of the account to any job)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "RegisterInstance", "Effect": "Allow", "Action": list(SESSION_MANAGER_INSTANCE_ACTIONS),
             "Resource": f"arn:{partition}:ec2:{region}:{account}:instance/*"},
            # The ssmmessages actions have no resource types (Service Authorization Reference): "*" only.
            {"Sid": "SessionChannels", "Effect": "Allow", "Action": list(SESSION_MANAGER_CHANNEL_ACTIONS), "Resource": "*"},
        ],
    }


def _head_node(settings: Settings, resources: ClusterResources) -> dict[str, Any]:
    return {
        "InstanceType": settings.head_node.instance_type,
        "Networking": {
            "SubnetId": resources.head_node_subnet_id,
            "AdditionalSecurityGroups": [resources.head_node_security_group_id],
        },
        # No key pair: administrators use SSM Session Manager. SSH (if any) only from the allow-list,
        # else only from inside the VPC, because ParallelCluster's default is 0.0.0.0/0.
        "Ssh": {"AllowedIps": _ssh_allowed_ips(settings)},
        "LocalStorage": {
            "RootVolume": {"Size": settings.head_node.root_volume_gib, "VolumeType": "gp3", "Encrypted": True},
        },
        "Imds": {"Secured": True},  # instance credentials for root and the cluster's daemons only
        "Iam": {
            # Users upload raw text and datasets from here (data_upload_policy): write, never delete.
            # Its Prometheus agent writes metrics to the environment's workspace (docs/monitoring.md).
            "AdditionalIamPolicies": [_ssm_policy(resources), {"Policy": resources.data_upload_policy_arn},
                                      {"Policy": resources.monitoring_policy_arn}],
            "S3Access": [{"BucketName": resources.assets_bucket, "EnableWriteAccess": False}],
        },
        "CustomActions": {
            "OnNodeStart": _node_setup_action(settings, resources),
            "OnNodeConfigured": _directory_setup_action(settings, resources),
            # Every cluster update re-runs it: a redeployed jobs bundle and a changed model list reach
            # the cluster. The list's digest is the one argument that differs: a changed list changes
            # the config, so the update (and this script) runs even when nothing else changed.
            "OnNodeUpdated": _directory_setup_action(settings, resources, models_digest=True),
        },
    }


def _scheduling(settings: Settings, resources: ClusterResources) -> dict[str, Any]:
    custom = custom_slurm_settings(settings)
    database = {}
    if resources.database is not None:
        # ParallelCluster runs slurmdbd on the head node against this database (sacct, sreport);
        # the enforcement turns the per-model accounts and QOS into limits.
        database = {"Database": {
            "Uri": resources.database.uri,
            "UserName": resources.database.user_name,
            "PasswordSecretArn": resources.database.password_secret_arn,
        }}
        custom = [*custom, {"AccountingStorageEnforce": ACCOUNTING_ENFORCE}]
    return {
        "Scheduler": "slurm",
        # A multi-node job launches all its nodes or none, so a partial launch never holds reserved
        # capacity idle while it waits for the rest.
        "ScalingStrategy": "all-or-nothing",
        "SlurmSettings": {
            "ScaledownIdletime": SCALEDOWN_IDLE_MINUTES,
            "EnableMemoryBasedScheduling": True,
            "QueueUpdateStrategy": "DRAIN",  # updates wait for running jobs instead of killing them
            # KillWait sized so a SIGTERM (scancel, time limit) leaves time to save (slurm_timeouts.py).
            "CustomSlurmSettings": custom,
            **database,
        },
        "SlurmQueues": [_gpu_queue(settings, resources), _cpu_queue(settings, resources)],
    }


def _gpu_queue(settings: Settings, resources: ClusterResources) -> dict[str, Any]:
    queue = settings.gpu_queue
    return {
        "Name": queue.name,
        "CapacityType": queue.capacity_type,  # CAPACITY_BLOCK for Capacity Blocks for ML
        "JobExclusiveAllocation": True,  # training jobs own whole nodes (GPUs, EFA, NVMe cache)
        "ComputeResources": _gpu_compute_resources(settings),
        "ComputeSettings": {
            "LocalStorage": {
                "RootVolume": {
                    "Size": queue.root_volume.size_gib,
                    "VolumeType": "gp3",
                    "Iops": queue.root_volume.iops,
                    "Throughput": queue.root_volume.throughput_mib_s,
                    "Encrypted": True,
                },
                "EphemeralVolume": {"MountDir": LOCAL_CACHE_DIR},
            },
        },
        "Networking": {
            "SubnetIds": [resources.compute_subnet_id],
            "AdditionalSecurityGroups": [resources.compute_security_group_id],
            "PlacementGroup": _placement_group(settings, resources),
        },
        "HealthChecks": {"Gpu": {"Enabled": True}},
        "Iam": {
            # Training reads and writes FSx only: the link exports checkpoints, and the backup runs as a
            # CPU job afterwards (jobs/backup.sh). A model's job that calls S3 here gets its model's role
            # (model_roles_policy) like on the CPU queue, never more than the node's read-only S3Access.
            "AdditionalIamPolicies": [_ssm_policy(resources), {"Policy": resources.model_roles_policy_arn}],
            "S3Access": [
                {"BucketName": resources.data_bucket, "EnableWriteAccess": False},
                {"BucketName": resources.assets_bucket, "EnableWriteAccess": False},
            ],
        },
        "CustomActions": {
            "OnNodeStart": _node_setup_action(settings, resources),
            "OnNodeConfigured": _directory_setup_action(settings, resources, local_cache=True,
                                                        gpus=queue.gpus_per_instance),
        },
    }


def _gpu_compute_resources(settings: Settings) -> list[dict[str, Any]]:
    """One compute resource per capacity reservation (a Capacity Block holds at most 64 instances,
    so a larger reserved queue is several), or one without a reservation."""
    queue = settings.gpu_queue

    def resource(name: str, min_count: int, max_count: int) -> dict[str, Any]:
        return {
            "Name": name,
            "InstanceType": queue.instance_type,
            "MinCount": min_count,
            "MaxCount": max_count,
            "DisableSimultaneousMultithreading": True,
            "Efa": {"Enabled": queue.efa.enabled, "GdrSupport": queue.efa.gdr_support},
        }

    if not queue.capacity_reservations:
        return [resource(_resource_name(queue.instance_type), queue.min_count, queue.max_count)]
    resources = []
    for index, (reservation, (min_count, max_count)) in enumerate(zip(queue.capacity_reservations, queue.node_counts())):
        # Named by position, the first as without a reservation: adding a reservation adds a compute
        # resource and a new id for the same slot retargets it, both of which a running cluster accepts;
        # a renamed compute resource is a removal, which needs the compute fleet stopped.
        name = _resource_name(queue.instance_type) + (f"-r{index + 1}" if index else "")
        resources.append({**resource(name, min_count, max_count),
                          "CapacityReservationTarget": {"CapacityReservationId": reservation.id}})
    return resources


def _cpu_queue(settings: Settings, resources: ClusterResources) -> dict[str, Any]:
    queue = settings.cpu_queue
    return {
        "Name": queue.name,
        "CapacityType": "ONDEMAND",
        "ComputeResources": [
            {
                "Name": _resource_name(queue.instance_type),
                "InstanceType": queue.instance_type,
                "MinCount": queue.min_count,
                "MaxCount": queue.max_count,
            }
        ],
        "ComputeSettings": {"LocalStorage": {"RootVolume": {"VolumeType": "gp3", "Encrypted": True}}},
        "Networking": {
            "SubnetIds": [resources.compute_subnet_id],
            "AdditionalSecurityGroups": [resources.compute_security_group_id],
        },
        "Iam": {
            # The cluster's user's dataset sync writes to the data bucket (data_upload_policy; the node's
            # credentials are root's and the cluster user's alone, node_setup.sh); a model's jobs write through
            # their model's role (model_roles_policy). Never EnableWriteAccess: ParallelCluster grants that as s3:*.
            "AdditionalIamPolicies": [_ssm_policy(resources), {"Policy": resources.data_upload_policy_arn},
                                      {"Policy": resources.model_roles_policy_arn}],
            "S3Access": [
                {"BucketName": resources.data_bucket, "EnableWriteAccess": False},
                {"BucketName": resources.backup_bucket, "EnableWriteAccess": False},
                {"BucketName": resources.assets_bucket, "EnableWriteAccess": False},
            ],
        },
        "CustomActions": {
            "OnNodeStart": _node_setup_action(settings, resources),
            "OnNodeConfigured": _directory_setup_action(settings, resources, gpus=0),
        },
    }


def _shared_storage(settings: Settings, resources: ClusterResources) -> list[dict[str, Any]]:
    file_systems = settings.storage.file_systems()
    storage: list[dict[str, Any]] = [
        {
            "Name": f"fsx-{key}",
            "StorageType": "FsxLustre",
            "MountDir": file_systems[key].mount_dir,
            # An existing file system: FileSystemId is the only key ParallelCluster allows then.
            "FsxLustreSettings": {"FileSystemId": resources.file_system_ids[key]},
        }
        for key in FILE_SYSTEM_KEYS
    ]
    storage.append(
        {
            "Name": "llm-jobs",
            "StorageType": "Ebs",
            "MountDir": JOBS_HOME,
            "EbsSettings": {"VolumeType": "gp3", "Size": JOBS_HOME_SIZE_GIB, "Encrypted": True, "DeletionPolicy": "Delete"},
        }
    )
    return storage


def _placement_group(settings: Settings, resources: ClusterResources) -> dict[str, Any]:
    # Stated either way: with EFA, ParallelCluster wants an explicit choice.
    if not settings.gpu_queue.placement_group:
        return {"Enabled": False}
    return {"Enabled": True, "Name": resources.placement_group_name}


def _node_setup_action(settings: Settings, resources: ClusterResources) -> dict[str, Any]:
    action: dict[str, Any] = {"Script": script_uri(resources, NODE_SETUP_SCRIPT)}
    if settings.containers:
        action["Args"] = ["--containers"]
    return action


def _directory_setup_action(
    settings: Settings, resources: ClusterResources, *, local_cache: bool = False, models_digest: bool = False,
    gpus: Optional[int] = None,
) -> dict[str, Any]:
    """``gpus``: the GPUs a compute node of the queue has, for the node health check; the head node
    passes none (its OnNodeConfigured arguments cannot change on a running cluster)."""
    file_systems = settings.storage.file_systems()
    args = [
        "--data", file_systems["data"].mount_dir,
        "--checkpoints", file_systems["checkpoints"].mount_dir,
        "--logs", file_systems["logs"].mount_dir,
        "--jobs-uri", f"s3://{resources.assets_bucket}/{JOBS_PREFIX}",
        # Where the backup job puts final checkpoints (CHECKPOINT_S3_URI in the jobs' environment):
        # the backup bucket, which no FSx link reaches. DATA_S3_URI: where tokenized data is synced.
        "--checkpoint-uri", f"s3://{resources.backup_bucket}",
        "--data-uri", f"s3://{resources.data_bucket}",
    ]
    if local_cache:
        args += ["--local-cache", LOCAL_CACHE_DIR]
    if gpus is not None:
        args += ["--gpus", str(gpus)]
    args += ["--models-uri", f"s3://{resources.assets_bucket}/{models_key(settings)}"]
    if models_digest:
        # The GPU queue's end (capacity_end.py) lies beside the model list; a changed end changes the config too.
        args += ["--capacity-end-sha256", capacity_end_digest(settings)]
        args += ["--models-sha256", hashlib.sha256(models_file(settings).encode()).hexdigest()]
    return {"Script": script_uri(resources, DIRECTORY_SETUP_SCRIPT), "Args": args}


def _ssm_policy(resources: ClusterResources) -> dict[str, str]:
    return {"Policy": resources.session_manager_policy_arn}


def _ssh_allowed_ips(settings: Settings) -> str:
    cidrs = settings.network.ssh_allowed_cidrs
    if len(cidrs) > 1:
        raise RenderError(
            f"network.ssh_allowed_cidrs has {len(cidrs)} entries but ParallelCluster's HeadNode.Ssh.AllowedIps "
            "takes one CIDR; list one range (or none, to use SSM Session Manager only)"
        )
    return cidrs[0] if cidrs else settings.network.vpc_cidr


def _resource_name(instance_type: str) -> str:
    """ParallelCluster compute resource names allow lowercase letters, digits and '-'."""
    return instance_type.replace(".", "-")
