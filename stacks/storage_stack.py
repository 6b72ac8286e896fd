"""S3 buckets and the three FSx for Lustre file systems linked to them."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_fsx as fsx, aws_iam as iam, aws_s3 as s3
from constructs import Construct

from cluster_config.render import MODEL_ROLE_PATH
from cluster_config.settings import FileSystemSettings, Settings
from stacks.network_stack import NetworkStack

# Lustre 2.15 is the client version in ParallelCluster's current AMIs.
LUSTRE_VERSION = "2.15"
ALL_EVENTS = ["NEW", "CHANGED", "DELETED"]
# How long an overwritten or deleted object stays recoverable (current versions never expire).
# Backups: long, they are the copy that outlives everything. Checkpoint bucket: every pruned
# checkpoint becomes an old version (prod writes ~2.3 TB per round of checkpoints of all models),
# so a week: time to notice an accidental delete on FSx without paying for a month of prunes.
BACKUP_NONCURRENT_DAYS = 90
CHECKPOINT_NONCURRENT_DAYS = 7
# What a cluster node may never do to a bucket holding user data: delete anything (a current object,
# an old version, the bucket), or change how the bucket keeps data (versioning, lifecycle, object lock,
# replication), who may reach it (policy, ACLs, ownership, public access block), its encryption or its
# access logging. Allow policies grant none of these; the deny also holds against a policy added later.
# ParallelCluster's roles all live under PCLUSTER_ROLE_PATH, the models' roles (stacks/model_roles.py) under
# MODEL_ROLE_PATH; administrators are not affected.
CLUSTER_DENIED_ACTIONS = ["s3:Delete*", "s3:PutBucket*", "s3:PutLifecycleConfiguration", "s3:PutEncryptionConfiguration",
                          "s3:PutReplicationConfiguration", "s3:PutObjectAcl", "s3:PutObjectVersionAcl",
                          "s3:PutObjectRetention", "s3:PutObjectLegalHold", "s3:BypassGovernanceRetention"]
PCLUSTER_ROLE_PATH = "/parallelcluster/"
# The data bucket's keys that every cluster role writes once, like every backup: tokenized datasets (each
# model's under tokenized/<model>/) and tokenizers. A dataset that must change gets a new folder, never new
# bytes under a name a model's fingerprint already knows (data_pipeline.upload sends If-None-Match for a new
# key and says so when a changed file would replace one). raw/ stays replaceable (versioned).
DATA_WRITE_ONCE_PREFIXES = ("tokenized/*", "tokenizers/*")


class StorageStack(cdk.Stack):
    """Durable data in S3, fast working copies on FSx for Lustre in the compute subnet.

    - data: lazily loads the training bucket (metadata imported, file contents fetched from S3
      on first read) and follows changes made in the bucket.
    - checkpoints: exports every new, changed or deleted file to the versioned checkpoint
      bucket, and imports what already is there, so a new cluster resumes from the last run.
    - logs: plain scratch space for job logs and profiles, no bucket.

    The backup bucket is linked to no file system: nothing done on FSx (a prune, a clean-up, a
    lost file system) can delete or overwrite a backup, and backups never appear on FSx.
    docs/cdk.md has the durability table (each kind of data, its copies, what destroy does).
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, settings: Settings, network: NetworkStack, env: cdk.Environment, **kwargs
    ) -> None:
        super().__init__(scope, construct_id, env=env, **kwargs)

        self.access_log_bucket = self._bucket(
            "AccessLogBucket",
            # Audit trail of the retained buckets, so it is retained with them.
            removal_policy=cdk.RemovalPolicy.RETAIN,
            server_access_logs=False,
        )
        # Each data-bearing bucket is new, or one a destroyed deployment kept (storage.keep_buckets), adopted
        # by name: it keeps the versioning, lifecycle, encryption and logging it was created with (below);
        # this stack gives it its policy again, which `cdk destroy` removed with the old stack.
        kept = settings.storage.keep_buckets
        self._kept_policies: dict[str, s3.BucketPolicy] = {}
        # Versioned: the head node and CPU nodes write (never delete) shards here, and with PERSISTENT_1 the
        # file system exports into it; a mistaken overwrite stays recoverable for 30 days.
        self.data_bucket = self._bucket(
            "DataBucket",
            kept=kept.data,
            removal_policy=cdk.RemovalPolicy.RETAIN,
            versioned=True,
            extra_rules=[s3.LifecycleRule(noncurrent_version_expiration=cdk.Duration.days(30))],
        )
        self.checkpoint_bucket = self._bucket(
            "CheckpointBucket",
            kept=kept.checkpoints,
            removal_policy=cdk.RemovalPolicy.RETAIN,
            versioned=True,
            # Deleting a checkpoint on FSx (a prune) deletes it in S3 too; the old version stays
            # recoverable for a week, then stops costing money. Final checkpoints: backup bucket.
            extra_rules=[s3.LifecycleRule(noncurrent_version_expiration=cdk.Duration.days(CHECKPOINT_NONCURRENT_DAYS))],
        )
        # Final checkpoints and run logs, written by the backup job (jobs/backup.sh), never by FSx.
        self.backup_bucket = self._bucket(
            "BackupBucket",
            kept=kept.backups,
            removal_policy=cdk.RemovalPolicy.RETAIN,
            versioned=True,
            extra_rules=[s3.LifecycleRule(noncurrent_version_expiration=cdk.Duration.days(BACKUP_NONCURRENT_DAYS))],
        )
        for bucket in (self.data_bucket, self.checkpoint_bucket, self.backup_bucket):
            self._keep_versions_from_cluster_nodes(bucket)
        self._write_once_from_cluster_nodes(self.backup_bucket)
        self._write_once_from_cluster_nodes(self.data_bucket, DATA_WRITE_ONCE_PREFIXES, sid="ClusterNodesWriteOnceDatasets")
        # Scripts and configs, re-uploaded by every deploy: nothing to keep.
        self.assets_bucket = self._bucket(
            "AssetsBucket", removal_policy=cdk.RemovalPolicy.DESTROY, auto_delete_objects=True
        )

        storage = settings.storage
        # PERSISTENT_2 links S3 through data repository associations; PERSISTENT_1 (for regions without
        # PERSISTENT_2) through the file system's own ImportPath/ExportPath/AutoImportPolicy.
        persistent_1 = storage.deployment_type == "PERSISTENT_1"
        repositories = {"data": self.data_bucket, "checkpoints": self.checkpoint_bucket} if persistent_1 else {}
        self.file_systems: dict[str, fsx.CfnFileSystem] = {
            name: self._file_system(name, fs_settings, settings, network, repositories.get(name))
            for name, fs_settings in storage.file_systems().items()
        }
        if not persistent_1:
            self._link(
                "DataLink",
                self.file_systems["data"],
                self.data_bucket,
                auto_import=ALL_EVENTS,
            )
            self._link(
                "CheckpointLink",
                self.file_systems["checkpoints"],
                self.checkpoint_bucket,
                auto_import=["NEW", "CHANGED"],
                auto_export=ALL_EVENTS,
            )

        for name, file_system in self.file_systems.items():
            title = name.capitalize()
            cdk.CfnOutput(self, f"{title}FileSystemId", value=file_system.ref)
            cdk.CfnOutput(self, f"{title}MountName", value=file_system.attr_lustre_mount_name)
        for title, bucket in (
            ("Data", self.data_bucket),
            ("Checkpoint", self.checkpoint_bucket),
            ("Backup", self.backup_bucket),
            ("Assets", self.assets_bucket),
            ("AccessLog", self.access_log_bucket),
        ):
            cdk.CfnOutput(self, f"{title}BucketName", value=bucket.bucket_name)

    def _bucket(
        self,
        construct_id: str,
        *,
        removal_policy: cdk.RemovalPolicy,
        server_access_logs: bool = True,
        extra_rules: list[s3.LifecycleRule] = (),
        kept: str | None = None,
        **kwargs,
    ) -> s3.IBucket:
        if kept:
            return self._adopt(construct_id, kept)
        return s3.Bucket(
            self,
            construct_id,
            # SSE-S3: FSx reads and writes linked buckets without extra key grants.
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.access_log_bucket if server_access_logs else None,
            server_access_logs_prefix=f"{construct_id}/" if server_access_logs else None,
            lifecycle_rules=[s3.LifecycleRule(abort_incomplete_multipart_upload_after=cdk.Duration.days(7)), *extra_rules],
            removal_policy=removal_policy,
            **kwargs,
        )

    def _adopt(self, construct_id: str, name: str) -> s3.IBucket:
        """A bucket kept from a destroyed deployment, and its policy: TLS only, as every bucket here."""
        bucket = s3.Bucket.from_bucket_name(self, construct_id, name)
        policy = self._kept_policies[name] = s3.BucketPolicy(self, f"{construct_id}Policy", bucket=bucket)
        policy.document.add_statements(
            iam.PolicyStatement(
                sid="TlsOnly",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["s3:*"],
                resources=[bucket.bucket_arn, bucket.arn_for_objects("*")],
                conditions={"Bool": {"aws:SecureTransport": "false"}},
            )
        )
        return bucket

    def _add_to_policy(self, bucket: s3.IBucket, statement: iam.PolicyStatement) -> None:
        # An imported bucket has no policy of this stack's to add to: the adopted one gets its own (_adopt).
        kept = self._kept_policies.get(bucket.bucket_name)
        if kept is not None:
            kept.document.add_statements(statement)
        else:
            bucket.add_to_resource_policy(statement)

    def _keep_versions_from_cluster_nodes(self, bucket: s3.IBucket) -> None:
        """Deny the cluster's roles every delete and every change to the bucket's configuration."""
        self._add_to_policy(
            bucket,
            iam.PolicyStatement(
                sid="ClusterNodesKeepVersions",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=CLUSTER_DENIED_ACTIONS,
                resources=[bucket.bucket_arn, bucket.arn_for_objects("*")],
                conditions={"ArnLike": {"aws:PrincipalArn": self._cluster_roles()}},
            )
        )

    def _write_once_from_cluster_nodes(
        self, bucket: s3.IBucket, prefixes: tuple[str, ...] = ("*",), sid: str = "ClusterNodesWriteOnce"
    ) -> None:
        """Deny the cluster's roles any object write that could replace an existing key: PutObject and
        CompleteMultipartUpload must carry If-None-Match (S3 then refuses a key that exists). The
        multipart steps before the completion cannot carry the header, so they are exempt
        (s3:ObjectCreationOperation is false for them); the completion decides whether the key is written."""
        self._add_to_policy(
            bucket,
            iam.PolicyStatement(
                sid=sid,
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["s3:PutObject"],
                resources=[bucket.arn_for_objects(prefix) for prefix in prefixes],
                conditions={
                    "ArnLike": {"aws:PrincipalArn": self._cluster_roles()},
                    "Null": {"s3:if-none-match": "true"},
                    "Bool": {"s3:ObjectCreationOperation": "true"},
                },
            )
        )

    def _cluster_roles(self) -> list[str]:
        """The node roles and the models' roles (an assumed role's session is matched by its role's ARN)."""
        return [f"arn:{self.partition}:iam::{self.account}:role{path}*" for path in (PCLUSTER_ROLE_PATH, MODEL_ROLE_PATH)]

    def _file_system(
        self, name: str, fs: FileSystemSettings, settings: Settings, network: NetworkStack, repository: s3.IBucket | None
    ) -> fsx.CfnFileSystem:
        # PERSISTENT_1 only: the bucket linked at the file system level. Both buckets are imported
        # (metadata listed, contents loaded on first read) and followed as they change; the export
        # path is the bucket's root, so `lfs hsm_archive` or a data repository task writes back in place.
        # PERSISTENT_1 has no automatic export: docs/cdk.md says how checkpoints reach S3 then.
        linked = {}
        if repository is not None:
            uri = f"s3://{repository.bucket_name}"
            linked = {"import_path": uri, "export_path": uri, "auto_import_policy": "NEW_CHANGED_DELETED"}
        lustre = fsx.CfnFileSystem.LustreConfigurationProperty(
            deployment_type=settings.storage.deployment_type,
            per_unit_storage_throughput=fs.throughput_per_tib,
            data_compression_type=fs.data_compression,
            **linked,
        )
        file_system = fsx.CfnFileSystem(
            self,
            f"{name.capitalize()}FileSystem",
            file_system_type="LUSTRE",
            file_system_type_version=LUSTRE_VERSION,
            storage_type="SSD",
            storage_capacity=fs.storage_capacity_gib,
            subnet_ids=[network.compute_subnet.subnet_id],
            security_group_ids=[network.fsx_sg.security_group_id],
            lustre_configuration=lustre,
            tags=[cdk.CfnTag(key="Name", value=f"{settings.cluster_name}-{name}")],
        )
        return file_system

    def _link(
        self,
        construct_id: str,
        file_system: fsx.CfnFileSystem,
        bucket: s3.IBucket,
        *,
        auto_import: list[str],
        auto_export: list[str] | None = None,
    ) -> fsx.CfnDataRepositoryAssociation:
        """Link the whole file system to the whole bucket."""
        s3_config = fsx.CfnDataRepositoryAssociation.S3Property(
            auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(events=auto_import),
            auto_export_policy=(
                fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(events=auto_export) if auto_export else None
            ),
        )
        return fsx.CfnDataRepositoryAssociation(
            self,
            construct_id,
            file_system_id=file_system.ref,
            file_system_path="/",
            data_repository_path=f"s3://{bucket.bucket_name}",
            # List what the bucket already holds when the link is created.
            batch_import_meta_data_on_create=True,
            s3=s3_config,
        )
