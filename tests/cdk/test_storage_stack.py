"""The storage stack: secured buckets, three FSx for Lustre file systems and their S3 links."""

import json
from fnmatch import fnmatchcase

import pytest
from aws_cdk import aws_fsx as fsx

BUCKETS = ("data_bucket", "checkpoint_bucket", "backup_bucket", "assets_bucket", "access_log_bucket")
RETAINED = ("data_bucket", "checkpoint_bucket", "backup_bucket", "access_log_bucket")
# Every other bucket holds data a user made (datasets, checkpoints, backups).
NOT_USER_DATA = ("assets_bucket", "access_log_bucket")


def resource(app, stack: str, construct) -> dict:
    """The synthesized CloudFormation resource of an L2 construct (or of an L1 one)."""
    cfn = getattr(construct.node, "default_child", None) or construct
    logical_id = app.stacks[stack].get_logical_id(cfn)
    return app.template_json(stack)["Resources"][logical_id]


def by_type(app, stack: str, kind: str) -> dict[str, dict]:
    return {k: r for k, r in app.template_json(stack)["Resources"].items() if r["Type"] == kind}


@pytest.mark.parametrize("name", BUCKETS)
def test_every_bucket_is_encrypted_private_and_tls_only(each_env, name):
    storage = each_env.stacks["storage"]
    bucket = resource(each_env, "storage", getattr(storage, name))["Properties"]
    assert bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"] == [
        {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
    ]
    assert bucket["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True
    }
    logical_id = storage.get_logical_id(getattr(storage, name).node.default_child)
    (policy,) = [p for p in by_type(each_env, "storage", "AWS::S3::BucketPolicy").values() if p["Properties"]["Bucket"] == {"Ref": logical_id}]
    assert {
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Action": "s3:*",
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }.items() <= policy["Properties"]["PolicyDocument"]["Statement"][0].items()


def test_buckets_log_access_to_the_access_log_bucket(each_env):
    storage = each_env.stacks["storage"]
    log_bucket_id = storage.get_logical_id(storage.access_log_bucket.node.default_child)
    for name in ("data_bucket", "checkpoint_bucket", "backup_bucket", "assets_bucket"):
        logging = resource(each_env, "storage", getattr(storage, name))["Properties"]["LoggingConfiguration"]
        assert logging["DestinationBucketName"] == {"Ref": log_bucket_id}
    assert "LoggingConfiguration" not in resource(each_env, "storage", storage.access_log_bucket)["Properties"]


def test_data_and_checkpoint_buckets_are_versioned_and_old_versions_expire(each_env):
    # CPU nodes may delete from the data bucket, and file systems export into both: versions make a
    # mistaken delete recoverable (checkov CKV_AWS_21 found the data bucket unversioned).
    storage = each_env.stacks["storage"]
    data = resource(each_env, "storage", storage.data_bucket)["Properties"]
    assert data["VersioningConfiguration"] == {"Status": "Enabled"}
    assert {"NoncurrentVersionExpiration": {"NoncurrentDays": 30}, "Status": "Enabled"} in data["LifecycleConfiguration"]["Rules"]
    checkpoints = resource(each_env, "storage", storage.checkpoint_bucket)["Properties"]
    assert checkpoints["VersioningConfiguration"] == {"Status": "Enabled"}
    assert {"NoncurrentVersionExpiration": {"NoncurrentDays": 7}, "Status": "Enabled"} in checkpoints["LifecycleConfiguration"]["Rules"]
    for name in ("assets_bucket", "access_log_bucket"):
        assert "VersioningConfiguration" not in resource(each_env, "storage", getattr(storage, name))["Properties"]


def test_data_checkpoint_and_log_buckets_survive_destroy(each_env):
    storage = each_env.stacks["storage"]
    for name in RETAINED:
        bucket = resource(each_env, "storage", getattr(storage, name))
        assert (bucket["DeletionPolicy"], bucket["UpdateReplacePolicy"]) == ("Retain", "Retain"), name
    assets = resource(each_env, "storage", storage.assets_bucket)
    assert assets["DeletionPolicy"] == "Delete"
    # Emptied first, or CloudFormation could not delete it.
    assert len(by_type(each_env, "storage", "Custom::S3AutoDeleteObjects")) == 1


def data_bearing_buckets(app) -> dict[str, dict]:
    """Every bucket of the storage template except the assets and access-log buckets, by logical id."""
    storage = app.stacks["storage"]
    others = {storage.get_logical_id(getattr(storage, name).node.default_child) for name in NOT_USER_DATA}
    return {k: r for k, r in by_type(app, "storage", "AWS::S3::Bucket").items() if k not in others}


def test_the_data_bearing_buckets_are_data_checkpoints_and_backups(each_env):
    storage = each_env.stacks["storage"]
    assert set(data_bearing_buckets(each_env)) == {
        storage.get_logical_id(getattr(storage, name).node.default_child)
        for name in ("data_bucket", "checkpoint_bucket", "backup_bucket")
    }


def test_backup_bucket_is_versioned_and_keeps_old_versions_90_days(each_env):
    backups = resource(each_env, "storage", each_env.stacks["storage"].backup_bucket)["Properties"]
    assert backups["VersioningConfiguration"] == {"Status": "Enabled"}
    assert {"NoncurrentVersionExpiration": {"NoncurrentDays": 90}, "Status": "Enabled"} in backups["LifecycleConfiguration"]["Rules"]


@pytest.mark.parametrize("name", ["data_bucket", "checkpoint_bucket", "backup_bucket"])
def test_every_data_bearing_bucket_is_versioned_retained_and_never_expires_current_data(each_env, name):
    bucket = resource(each_env, "storage", getattr(each_env.stacks["storage"], name))
    props = bucket["Properties"]
    assert (bucket["DeletionPolicy"], bucket["UpdateReplacePolicy"]) == ("Retain", "Retain")
    assert props.get("VersioningConfiguration") == {"Status": "Enabled"}, f"{name} is not versioned"
    for rule in props["LifecycleConfiguration"]["Rules"]:
        # Only old versions and abandoned uploads ever expire, and old versions not within a week.
        assert not {"ExpirationInDays", "ExpirationDate", "ExpiredObjectDeleteMarker", "Transitions"} & rule.keys(), rule
        assert rule.get("NoncurrentVersionExpiration", {"NoncurrentDays": 7})["NoncurrentDays"] >= 7, rule


def bucket_statements(each_env, name: str) -> dict[str, dict]:
    storage = each_env.stacks["storage"]
    logical_id = storage.get_logical_id(getattr(storage, name).node.default_child)
    (policy,) = [p for p in by_type(each_env, "storage", "AWS::S3::BucketPolicy").values() if p["Properties"]["Bucket"] == {"Ref": logical_id}]
    return {s.get("Sid"): s for s in policy["Properties"]["PolicyDocument"]["Statement"]}


@pytest.mark.parametrize("name", ["data_bucket", "checkpoint_bucket", "backup_bucket"])
def test_cluster_nodes_cannot_delete_or_reconfigure_the_bucket(each_env, name):
    statement = bucket_statements(each_env, name)["ClusterNodesKeepVersions"]
    assert statement["Effect"] == "Deny" and statement["Principal"] == {"AWS": "*"}
    denied = statement["Action"]
    # Deletes of every kind, and every bucket setting that decides how data is kept, reached or encrypted.
    for action in ("s3:DeleteObject", "s3:DeleteObjectVersion", "s3:DeleteBucket", "s3:DeleteBucketPolicy",
                   "s3:PutBucketObjectLockConfiguration", "s3:PutEncryptionConfiguration", "s3:PutBucketAcl",
                   "s3:PutObjectAcl", "s3:PutBucketLogging", "s3:PutBucketPolicy", "s3:PutLifecycleConfiguration",
                   "s3:PutBucketVersioning", "s3:PutBucketPublicAccessBlock", "s3:PutBucketOwnershipControls"):
        assert any(fnmatchcase(action, pattern) for pattern in denied), action
    # Writing objects stays possible (the upload policies' grants), and nothing else is caught by accident.
    for action in ("s3:PutObject", "s3:GetObject", "s3:ListBucket", "s3:AbortMultipartUpload"):
        assert not any(fnmatchcase(action, pattern) for pattern in denied), action
    # Only ParallelCluster's roles (path /parallelcluster/<cluster>/), never the deploying administrator.
    arn = statement["Condition"]["ArnLike"]["aws:PrincipalArn"]
    # The node roles and the models' roles (stacks/model_roles.py), whose sessions a job may hold.
    assert arn == [f"arn:aws:iam::{each_env.settings.account}:role/parallelcluster/*",
                   f"arn:aws:iam::{each_env.settings.account}:role/llm-models/*"]


def test_cluster_nodes_write_backups_once(each_env):
    """A node's PutObject or CompleteMultipartUpload without If-None-Match is refused: no backup key is
    ever replaced. The multipart steps that cannot carry the header are exempt."""
    statements = bucket_statements(each_env, "backup_bucket")
    statement = statements["ClusterNodesWriteOnce"]
    assert (statement["Effect"], statement["Principal"], statement["Action"]) == ("Deny", {"AWS": "*"}, "s3:PutObject")
    assert statement["Condition"] == {
        "ArnLike": {"aws:PrincipalArn": [f"arn:aws:iam::{each_env.settings.account}:role/parallelcluster/*",
                                         f"arn:aws:iam::{each_env.settings.account}:role/llm-models/*"]},
        "Null": {"s3:if-none-match": "true"},
        "Bool": {"s3:ObjectCreationOperation": "true"},
    }
    for name in ("data_bucket", "checkpoint_bucket"):  # FSx exports and dataset syncs replace objects there
        assert "ClusterNodesWriteOnce" not in bucket_statements(each_env, name)


def link_targets(app) -> list:
    """Every S3 location an FSx link of the storage stack reaches: association paths and, for file
    systems linked without associations, their import and export paths."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("DataRepositoryPath", "ImportPath", "ExportPath"):
                    found.append(value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(app.template_json("storage")["Resources"])
    return found


def test_no_fsx_link_reaches_the_backup_bucket(each_env):
    storage = each_env.stacks["storage"]
    targets = link_targets(each_env)
    assert targets, "no FSx link found: this test would pass for nothing"
    reached = [token for target in targets for token in _tokens(target)]
    ref = lambda bucket: {"Ref": storage.get_logical_id(bucket.node.default_child)}  # noqa: E731
    assert ref(storage.checkpoint_bucket) in reached  # the search sees bucket references at all
    assert ref(storage.backup_bucket) not in reached, targets


def _tokens(value) -> list:
    """Every {"Ref": ...} inside a CloudFormation value."""
    if isinstance(value, dict):
        return [value] if set(value) == {"Ref"} else [t for v in value.values() for t in _tokens(v)]
    if isinstance(value, list):
        return [t for v in value for t in _tokens(v)]
    return []


@pytest.mark.parametrize("name", ["data", "checkpoints", "logs"])
def test_file_systems_are_persistent_2_sized_from_the_settings_in_the_compute_subnet(each_env, name):
    storage, network = each_env.stacks["storage"], each_env.stacks["network"]
    wanted = each_env.settings.storage.file_systems()[name]
    file_system = storage.file_systems[name]
    assert isinstance(file_system, fsx.CfnFileSystem)
    props = resource(each_env, "storage", file_system)["Properties"]
    assert props["FileSystemType"] == "LUSTRE"
    assert props["StorageCapacity"] == wanted.storage_capacity_gib
    assert props["LustreConfiguration"] == {
        "DeploymentType": "PERSISTENT_2",
        "PerUnitStorageThroughput": wanted.throughput_per_tib,
        "DataCompressionType": wanted.data_compression,
    }
    # The subnet and security group are the network stack's exports (strong references): follow them back.
    exports = {o["Export"]["Name"]: o["Value"] for o in each_env.template_json("network")["Outputs"].values() if "Export" in o}
    (subnet,) = props["SubnetIds"]
    (group,) = props["SecurityGroupIds"]
    assert exports[subnet["Fn::ImportValue"]] == network.resolve(network.compute_subnet.subnet_id)
    assert exports[group["Fn::ImportValue"]] == network.resolve(network.fsx_sg.security_group_id)


def test_file_system_ids_and_mount_names_are_outputs(each_env):
    storage = each_env.stacks["storage"]
    outputs = each_env.template_json("storage")["Outputs"]
    for name, file_system in storage.file_systems.items():
        logical_id = storage.get_logical_id(file_system)
        assert outputs[f"{name.capitalize()}FileSystemId"]["Value"] == {"Ref": logical_id}
        assert outputs[f"{name.capitalize()}MountName"]["Value"] == {"Fn::GetAtt": [logical_id, "LustreMountName"]}
        assert storage.resolve(file_system.attr_lustre_mount_name) == {"Fn::GetAtt": [logical_id, "LustreMountName"]}


def links(app) -> dict[str, dict]:
    """Data repository associations keyed by the file system name they belong to."""
    storage = app.stacks["storage"]
    names = {storage.get_logical_id(fs): name for name, fs in storage.file_systems.items()}
    return {
        names[r["Properties"]["FileSystemId"]["Ref"]]: r["Properties"]
        for r in by_type(app, "storage", "AWS::FSx::DataRepositoryAssociation").values()
    }


def bucket_url(app, bucket) -> dict:
    return {"Fn::Join": ["", ["s3://", {"Ref": app.stacks["storage"].get_logical_id(bucket.node.default_child)}]]}


def test_data_file_system_lazy_loads_the_training_bucket(each_env):
    data = links(each_env)["data"]
    assert data["DataRepositoryPath"] == bucket_url(each_env, each_env.stacks["storage"].data_bucket)
    assert data["FileSystemPath"] == "/"
    assert data["BatchImportMetaDataOnCreate"] is True
    assert data["S3"] == {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}}


def test_checkpoint_file_system_exports_to_the_checkpoint_bucket(each_env):
    checkpoints = links(each_env)["checkpoints"]
    assert checkpoints["DataRepositoryPath"] == bucket_url(each_env, each_env.stacks["storage"].checkpoint_bucket)
    assert checkpoints["FileSystemPath"] == "/"
    assert checkpoints["S3"]["AutoExportPolicy"] == {"Events": ["NEW", "CHANGED", "DELETED"]}
    # Checkpoints already in the bucket appear on a new file system, so a new cluster can resume.
    assert checkpoints["BatchImportMetaDataOnCreate"] is True
    assert checkpoints["S3"]["AutoImportPolicy"] == {"Events": ["NEW", "CHANGED"]}


def test_log_file_system_has_no_bucket_link(each_env):
    assert set(links(each_env)) == {"data", "checkpoints"}


def test_shipped_environments_compress_with_lz4(dev, prod):
    for app in (dev, prod):
        for file_system in by_type(app, "storage", "AWS::FSx::FileSystem").values():
            assert file_system["Properties"]["LustreConfiguration"]["DataCompressionType"] == "LZ4"


@pytest.fixture(scope="module")
def persistent_1(tmp_path_factory):
    """dev with storage.deployment_type PERSISTENT_1 (for regions without PERSISTENT_2), synthesized."""
    import json

    from stacks.app import build_app
    from tests.settings_files import write_env

    tiers = {"storage_capacity_gib": 1200, "throughput_per_tib": 200}
    config_dir = write_env(tmp_path_factory.mktemp("settings"), "dev", storage__deployment_type="PERSISTENT_1",
                           storage__data={**tiers, "mount_dir": "/fsx/data"},
                           storage__checkpoints={**tiers, "mount_dir": "/fsx/checkpoints"},
                           storage__logs={**tiers, "mount_dir": "/fsx/logs"}).parent
    outdir = tmp_path_factory.mktemp("cdk-p1")
    built = build_app("dev", config_dir=config_dir, outdir=str(outdir))
    built.app.synth()  # cdk-nag included
    storage = built.stacks["storage"]
    return storage, json.loads((outdir / f"{storage.artifact_id}.template.json").read_text())


def test_persistent_1_links_buckets_through_the_file_systems_own_import_and_export_paths(persistent_1):
    storage, template = persistent_1
    assert not [r for r in template["Resources"].values() if r["Type"] == "AWS::FSx::DataRepositoryAssociation"]
    lustre = {name: template["Resources"][storage.get_logical_id(fs)]["Properties"]["LustreConfiguration"]
              for name, fs in storage.file_systems.items()}
    for name, bucket in (("data", storage.data_bucket), ("checkpoints", storage.checkpoint_bucket)):
        url = {"Fn::Join": ["", ["s3://", {"Ref": storage.get_logical_id(bucket.node.default_child)}]]}
        assert lustre[name]["DeploymentType"] == "PERSISTENT_1"
        assert lustre[name]["PerUnitStorageThroughput"] == 200
        assert (lustre[name]["ImportPath"], lustre[name]["ExportPath"]) == (url, url)
        assert lustre[name]["AutoImportPolicy"] == "NEW_CHANGED_DELETED"
    assert lustre["logs"] == {"DeploymentType": "PERSISTENT_1", "PerUnitStorageThroughput": 200, "DataCompressionType": "LZ4"}


KEPT = {"data": "llm-dev-databucket-kept1", "checkpoints": "llm-dev-checkpointbucket-kept2",
        "backups": "llm-dev-backupbucket-kept3"}


@pytest.fixture(scope="module")
def adopted(tmp_path_factory):
    """dev after a `cdk destroy`: storage.keep_buckets names the three kept buckets; synthesized (cdk-nag included)."""
    from stacks.app import build_app
    from tests.settings_files import write_env

    config_dir = write_env(tmp_path_factory.mktemp("settings"), "dev", storage__keep_buckets=KEPT).parent
    outdir = tmp_path_factory.mktemp("cdk-kept")
    built = build_app("dev", config_dir=config_dir, outdir=str(outdir))
    built.app.synth()
    return built, {name: json.loads((outdir / f"{stack.artifact_id}.template.json").read_text())
                   for name, stack in built.stacks.items()}


def test_kept_buckets_are_adopted_by_name_linked_and_guarded_again(adopted):
    built, templates = adopted
    storage = templates["storage"]["Resources"]
    # No new data-bearing bucket: only the assets and access-log buckets are created.
    created = [r for r in storage.values() if r["Type"] == "AWS::S3::Bucket"]
    assert len(created) == 2
    # The new file systems link to the kept buckets: what they hold appears on /fsx/data and /fsx/checkpoints.
    links = {r["Properties"]["DataRepositoryPath"] for r in storage.values()
             if r["Type"] == "AWS::FSx::DataRepositoryAssociation"}
    assert links == {f"s3://{KEPT['data']}", f"s3://{KEPT['checkpoints']}"}
    # Each kept bucket gets its policy again: TLS only, no deletes or reconfiguration by the cluster's
    # roles, and backups written once.
    policies = {r["Properties"]["Bucket"]: {s.get("Sid"): s for s in r["Properties"]["PolicyDocument"]["Statement"]}
                for r in storage.values()
                if r["Type"] == "AWS::S3::BucketPolicy" and isinstance(r["Properties"]["Bucket"], str)}
    for kind, name in KEPT.items():
        statements = policies[name]
        assert statements["TlsOnly"]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        assert statements["TlsOnly"]["Effect"] == "Deny"
        assert "s3:Delete*" in statements["ClusterNodesKeepVersions"]["Action"]
        assert ("ClusterNodesWriteOnce" in statements) == (kind == "backups")
    # The head node's upload grants name the kept data and backup buckets.
    cluster = json.dumps(templates["cluster"])
    assert KEPT["data"] in cluster and KEPT["backups"] in cluster


def test_a_bucket_kept_twice_or_misspelt_is_refused_at_synth(tmp_path):
    from cluster_config.settings import SettingsError, load_settings
    from tests.settings_files import write_env

    twice = write_env(tmp_path / "a", "dev", storage__keep_buckets={"data": "llm-x", "backups": "llm-x"}).parent
    with pytest.raises(SettingsError, match=r"keep_buckets names one bucket twice"):
        load_settings("dev", twice)
    upper = write_env(tmp_path / "b", "dev", storage__keep_buckets={"checkpoints": "LLM_Checkpoints"}).parent
    with pytest.raises(SettingsError, match=r"storage.keep_buckets.checkpoints.*not an S3 bucket name"):
        load_settings("dev", upper)
