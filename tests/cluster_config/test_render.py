"""The rendered ParallelCluster config: ParallelCluster's own schema accepts it, and it says what we mean."""

from __future__ import annotations

import copy
import hashlib
import re
import subprocess
import sys

import pytest
import yaml

from cluster_config.capacity_end import capacity_end_digest
from cluster_config.render import (
    DIRECTORY_SETUP_SCRIPT,
    JOBS_HOME,
    LOCAL_CACHE_DIR,
    NODE_SETUP_SCRIPT,
    ClusterResources,
    RenderError,
    data_upload_policy,
    model_role_arn,
    model_role_policy,
    models_file,
    render_cluster_config,
    session_manager_policy,
)
from cluster_config.settings import CONFIG_DIR, available_environments, load_settings

ENVS = available_environments()


def render(env: str) -> dict:
    settings = load_settings(env)
    return render_cluster_config(settings, ClusterResources.placeholders(settings))


@pytest.mark.parametrize("env", ENVS)
def test_every_environment_passes_parallelclusters_schema(env_results, env):
    result = env_results[env]
    assert result.errors == {}


def test_capacity_reservations_are_looked_up_once_and_answered_at_the_aws_boundary(env_results):
    # prod targets two Capacity Blocks: the schema load asks EC2 about both in one call (answered by
    # the stub, which checks the ids asked for), dev has none.
    assert env_results["prod"].ec2_calls == ["DescribeCapacityReservations"]
    assert env_results["dev"].ec2_calls == []


def test_schema_rejects_the_seed_configs_mistakes(check_schema):
    """The mistakes of the original hand-written config, made on purpose: the schema must name each."""
    settings = load_settings("prod")
    bad = copy.deepcopy(render("prod"))
    bad["Image"]["Os"] = "alinux2"
    bad["SlurmQueues"] = bad["Scheduling"].pop("SlurmQueues")
    bad["Iam"] = {"S3Access": [{"BucketName": "data"}]}
    for storage in bad["SharedStorage"][:3]:
        storage["FsxLustreSettings"]["DeploymentType"] = "PERSISTENT"
    errors = check_schema({"seed": bad}, settings)["seed"].errors
    assert "alinux2023" in str(errors["Image"]["Os"])
    assert errors["Scheduling"]["SlurmQueues"] == ["Missing data for required field."]
    assert errors["SlurmQueues"] == ["Unknown field."]
    assert errors["Iam"] == {"S3Access": ["Unknown field."]}
    for index in ("0", "1", "2"):
        assert "PERSISTENT_2" in str(errors["SharedStorage"][index]["FsxLustreSettings"]["DeploymentType"])


def test_cli_render_prints_schema_shaped_placeholder_ids():
    out = subprocess.run(
        [sys.executable, "-m", "cluster_config", "render", "--env", "prod"], capture_output=True, text=True, check=True
    ).stdout
    config = yaml.safe_load(out)
    assert config == render("prod")
    assert re.fullmatch(r"subnet-[0-9a-z]{17}", config["HeadNode"]["Networking"]["SubnetId"])
    fs_ids = [s["FsxLustreSettings"]["FileSystemId"] for s in config["SharedStorage"] if s["StorageType"] == "FsxLustre"]
    assert len(set(fs_ids)) == 3 and all(re.fullmatch(r"fs-[0-9a-z]{17}", fs_id) for fs_id in fs_ids)


@pytest.mark.slow  # every environment into the emulated account
def test_cli_validate_all_checks_every_environment(pcluster_schema):
    proc = subprocess.run(
        [sys.executable, "-m", "cluster_config", "validate", "--all"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    for env in ENVS:
        assert f"{env}: ParallelCluster schema accepts the config" in proc.stdout


def test_cli_names_an_unknown_environment():
    proc = subprocess.run(
        [sys.executable, "-m", "cluster_config", "render", "--env", "staging"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert "no environment 'staging'" in proc.stderr and "Available: dev, prod" in proc.stderr


@pytest.mark.parametrize("env", ENVS)
def test_shared_storage_mounts_the_settings_mount_dirs_by_file_system_id(env):
    settings = load_settings(env)
    resources = ClusterResources.placeholders(settings)
    storage = {s["Name"]: s for s in render_cluster_config(settings, resources)["SharedStorage"]}
    for key, fs in settings.storage.file_systems().items():
        assert storage[f"fsx-{key}"]["MountDir"] == fs.mount_dir
        # Existing file systems: the id and nothing else (ParallelCluster allows no other key then).
        assert storage[f"fsx-{key}"]["FsxLustreSettings"] == {"FileSystemId": resources.file_system_ids[key]}


def test_mount_dirs_are_the_ones_the_jobs_use():
    env_sh = (CONFIG_DIR.parent / "jobs" / "env.sh").read_text()
    for key, fs in load_settings("prod").storage.file_systems().items():
        assert f"${{FSX_{key.upper()}:-{fs.mount_dir}}}" in env_sh


@pytest.mark.parametrize("env", ENVS)
def test_nccl_tests_are_built_where_every_node_sees_them(env):
    """jobs/nccl_tests.sh builds once and every rank runs the binaries: its default folder must be on
    storage every node mounts. It was /fsx/tools: /fsx itself is each node's own disk."""
    script = (CONFIG_DIR.parent / "jobs" / "nccl_tests.sh").read_text()
    default = re.search(r'NCCL_TESTS_HOME="\$\{NCCL_TESTS_HOME:-([^}]+)\}"', script).group(1)
    mounts = [storage["MountDir"] for storage in render(env)["SharedStorage"]]
    assert [m for m in mounts if default.startswith(m.rstrip("/") + "/")] == [JOBS_HOME], (default, mounts)


def test_head_node_is_private_by_default_and_imdsv2_only():
    config = render("prod")
    head = config["HeadNode"]
    assert "KeyName" not in head.get("Ssh", {})
    assert head["Ssh"]["AllowedIps"] == load_settings("prod").network.vpc_cidr  # not ParallelCluster's 0.0.0.0/0
    assert head["Imds"] == {"Secured": True}
    assert config["Imds"] == {"ImdsSupport": "v2.0"}
    resources = ClusterResources.placeholders(load_settings("prod"))
    assert {"Policy": resources.session_manager_policy_arn} in head["Iam"]["AdditionalIamPolicies"]
    assert head["LocalStorage"]["RootVolume"]["Encrypted"] is True


def test_ssh_allow_list_with_several_ranges_is_refused_with_the_fix(tmp_path, write_env):
    config_dir = write_env(tmp_path, "dev", network={"vpc_cidr": "10.1.0.0/16", "ssh_allowed_cidrs": ["203.0.113.0/24", "198.51.100.0/24"]})
    settings = load_settings("dev", config_dir)
    with pytest.raises(RenderError, match="Ssh.AllowedIps takes one CIDR"):
        render_cluster_config(settings, ClusterResources.placeholders(settings))


def test_gpu_queue_follows_the_settings():
    queue = render("prod")["Scheduling"]["SlurmQueues"][0]
    for resource in queue["ComputeResources"]:
        assert resource["InstanceType"] == "p5e.48xlarge"
        assert resource["Efa"] == {"Enabled": True, "GdrSupport": True}
        assert resource["DisableSimultaneousMultithreading"] is True
    assert queue["Networking"]["PlacementGroup"] == {"Enabled": False}  # stated, as EFA requires
    assert queue["HealthChecks"] == {"Gpu": {"Enabled": True}}
    root = queue["ComputeSettings"]["LocalStorage"]["RootVolume"]
    assert (root["VolumeType"], root["Iops"], root["Throughput"], root["Size"]) == ("gp3", 6000, 500, 500)
    assert queue["ComputeSettings"]["LocalStorage"]["EphemeralVolume"] == {"MountDir": LOCAL_CACHE_DIR}


def test_placement_group_is_the_one_the_network_stack_made():
    settings = load_settings("dev")
    resources = ClusterResources.placeholders(settings)
    queue = render_cluster_config(settings, resources)["Scheduling"]["SlurmQueues"][0]
    assert queue["Networking"]["PlacementGroup"] == {"Enabled": True, "Name": resources.placement_group_name}
    without = ClusterResources(**{**resources.__dict__, "placement_group_name": None})
    with pytest.raises(RenderError, match="placement_group is true but no placement group was created"):
        render_cluster_config(settings, without)


def test_scheduling_is_slurm_with_scaling_strategy_and_memory_scheduling():
    scheduling = render("prod")["Scheduling"]
    assert scheduling["Scheduler"] == "slurm"
    assert scheduling["ScalingStrategy"] == "all-or-nothing"
    assert scheduling["SlurmSettings"]["EnableMemoryBasedScheduling"] is True
    assert scheduling["SlurmSettings"]["ScaledownIdletime"] > 0
    assert [q["Name"] for q in scheduling["SlurmQueues"]] == ["gpu", "cpu"]


def test_queue_s3_access_is_least_privilege():
    settings = load_settings("prod")
    resources = ClusterResources.placeholders(settings)
    gpu, cpu = render_cluster_config(settings, resources)["Scheduling"]["SlurmQueues"]
    access = lambda queue: {a["BucketName"]: a["EnableWriteAccess"] for a in queue["Iam"]["S3Access"]}  # noqa: E731
    # Read-only everywhere: ParallelCluster grants a writable S3Access bucket as s3:*.
    assert access(gpu) == {resources.data_bucket: False, resources.assets_bucket: False}
    assert access(cpu) == {resources.data_bucket: False, resources.backup_bucket: False, resources.assets_bucket: False}
    for queue in (gpu, cpu):
        assert all("*" not in a["BucketName"] for a in queue["Iam"]["S3Access"])
    # The cluster user's dataset sync writes through the CPU queue's data policy; a model's jobs through its
    # model's role, which both compute queues may assume (model_roles_policy); training touches FSx only.
    ssm, models = {"Policy": resources.session_manager_policy_arn}, {"Policy": resources.model_roles_policy_arn}
    assert gpu["Iam"]["AdditionalIamPolicies"] == [ssm, models]
    assert cpu["Iam"]["AdditionalIamPolicies"] == [ssm, {"Policy": resources.data_upload_policy_arn}, models]


def test_a_models_role_writes_new_objects_under_its_own_prefixes_only():
    settings = load_settings("prod")
    policy = model_role_policy("model1", data_bucket_arn="arn:aws:s3:::d", backup_bucket_arn="arn:aws:s3:::b")
    writes = [s for s in policy["Statement"] if "s3:PutObject" in s["Action"]]
    assert [s["Resource"] for s in writes] == ["arn:aws:s3:::d/tokenized/model1/*", "arn:aws:s3:::b/model1/*"]
    assert all(s["Effect"] == "Allow" and "s3:*" not in s["Action"] for s in policy["Statement"])
    assert models_file(settings).splitlines()[0] == (
        f"model1 {settings.models[0].nodes} arn:aws:iam::{settings.account}:role/llm-models/{settings.cluster_name}/"
        f"{settings.cluster_name}-model1")


def test_session_manager_policy_has_only_the_session_actions():
    policy = session_manager_policy("aws", "ap-southeast-3", "222222222222")
    actions = {action for statement in policy["Statement"] for action in statement["Action"]}
    assert actions == {"ssm:UpdateInstanceInformation", "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
                       "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel"}
    assert policy["Statement"][0]["Resource"] == "arn:aws:ec2:ap-southeast-3:222222222222:instance/*"


def test_head_node_may_upload_to_the_data_bucket_but_not_delete():
    """README's upload step runs on the head node: it needs write on the data bucket (issue: AccessDenied)."""
    settings = load_settings("prod")
    resources = ClusterResources.placeholders(settings)
    iam = render_cluster_config(settings, resources)["HeadNode"]["Iam"]
    assert iam["AdditionalIamPolicies"] == [
        {"Policy": resources.session_manager_policy_arn}, {"Policy": resources.data_upload_policy_arn},
        {"Policy": resources.monitoring_policy_arn}]  # the metric agent's (stacks/alerts_stack.py)
    # Attachable by ParallelCluster's least-privilege users: policy/parallelcluster/* only.
    for arn in (resources.data_upload_policy_arn, resources.monitoring_policy_arn, resources.model_roles_policy_arn,
                resources.session_manager_policy_arn):
        assert arn.startswith(f"arn:aws:iam::{settings.account}:policy/parallelcluster/")
    # Through the policy, not S3Access: ParallelCluster grants a writable S3Access bucket as s3:*.
    assert iam["S3Access"] == [{"BucketName": resources.assets_bucket, "EnableWriteAccess": False}]
    bucket_arn = f"arn:aws:s3:::{resources.data_bucket}"
    granted = {(action, s["Resource"]) for s in data_upload_policy(bucket_arn)["Statement"] for action in s["Action"]}
    assert all(s["Effect"] == "Allow" for s in data_upload_policy(bucket_arn)["Statement"])
    assert granted == {
        ("s3:ListBucket", bucket_arn), ("s3:GetBucketLocation", bucket_arn), ("s3:ListBucketMultipartUploads", bucket_arn),
        ("s3:GetObject", f"{bucket_arn}/*"), ("s3:PutObject", f"{bucket_arn}/*"),
        ("s3:AbortMultipartUpload", f"{bucket_arn}/*"), ("s3:ListMultipartUploadParts", f"{bucket_arn}/*"),
    }


def test_custom_actions_run_the_shipped_scripts_and_read_the_model_list_from_a_file():
    settings = load_settings("prod")
    resources = ClusterResources.placeholders(settings)
    config = render_cluster_config(settings, resources)
    models_uri = f"s3://{resources.assets_bucket}/cluster/llm-prod.models"
    for node in (config["HeadNode"], *config["Scheduling"]["SlurmQueues"]):
        start, configured = node["CustomActions"]["OnNodeStart"], node["CustomActions"]["OnNodeConfigured"]
        assert start["Script"] == f"s3://{resources.assets_bucket}/node_scripts/{NODE_SETUP_SCRIPT}"
        assert configured["Script"] == f"s3://{resources.assets_bucket}/node_scripts/{DIRECTORY_SETUP_SCRIPT}"
        args = configured["Args"]
        assert args[args.index("--data") + 1] == "/fsx/data"
        assert args[args.index("--checkpoint-uri") + 1] == f"s3://{resources.backup_bucket}"
        assert args[args.index("--data-uri") + 1] == f"s3://{resources.data_bucket}"
        assert args[args.index("--models-uri") + 1] == models_uri
        assert not set(args) & {m.name for m in settings.models}  # no model name in OnNodeConfigured
    assert models_file(settings) == "".join(f"{m.name} {m.nodes} {model_role_arn(settings, m.name)}\n" for m in settings.models)
    updated = config["HeadNode"]["CustomActions"]["OnNodeUpdated"]["Args"]
    assert updated[:-4] == config["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Args"]
    # The GPU queue's end lies beside the list (tests/cluster_config/test_capacity_end.py); both digests may change.
    assert updated[-4:-2] == ["--capacity-end-sha256", capacity_end_digest(settings)]
    assert updated[-2:] == ["--models-sha256", hashlib.sha256(models_file(settings).encode()).hexdigest()]


def test_changing_the_model_list_changes_only_on_node_updated(tmp_path, write_env):
    """ParallelCluster refuses OnNodeConfigured changes on a running cluster; OnNodeUpdated may change."""
    base = render("prod")
    raw = yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())
    raw["models"][-1]["nodes"] = 7
    raw["models"][-1].pop("min_nodes", None)  # prod's is for its 34 nodes
    raw["models"].append({**raw["models"][2], "name": "model8", "dataset": "tokenized/model8"})  # a second 13B
    config_dir = write_env(tmp_path, "prod", models=raw["models"])
    changed = render_cluster_config(load_settings("prod", config_dir), ClusterResources.placeholders(load_settings("prod")))
    for path in (("HeadNode",), ("Scheduling", "SlurmQueues", 0), ("Scheduling", "SlurmQueues", 1)):
        before, after = base, changed
        for key in path:
            before, after = before[key], after[key]
        assert before["CustomActions"]["OnNodeConfigured"] == after["CustomActions"]["OnNodeConfigured"]
    assert base["HeadNode"]["CustomActions"]["OnNodeUpdated"] != changed["HeadNode"]["CustomActions"]["OnNodeUpdated"]


def test_two_capacity_blocks_render_two_compute_resources_with_their_own_targets():
    # 80 p5e nodes cannot come from one block (64 at most): prod holds two of 40.
    gpu, cpu = render("prod")["Scheduling"]["SlurmQueues"]
    assert gpu["CapacityType"] == "CAPACITY_BLOCK" and cpu["CapacityType"] == "ONDEMAND"
    assert [(r["Name"], r["MinCount"], r["MaxCount"], r["CapacityReservationTarget"]) for r in gpu["ComputeResources"]] == [
        ("p5e-48xlarge", 40, 40, {"CapacityReservationId": "cr-0a1b2c3d4e5f60718"}),
        ("p5e-48xlarge-r2", 40, 40, {"CapacityReservationId": "cr-0a1b2c3d4e5f60729"}),
    ]
    assert "CapacityReservationTarget" not in gpu  # per compute resource, not per queue


def on_odcrs(tmp_path, write_env, counts: list[int], min_count: int, max_count: int) -> dict:
    """prod's GPU queue rendered on On-Demand Capacity Reservations of ``counts`` instances."""
    ids = ["cr-0a1b2c3d4e5f60718", "cr-0a1b2c3d4e5f60729", "cr-0123456789abcdef0"]
    config_dir = write_env(tmp_path, "prod", gpu_queue__min_count=min_count, gpu_queue__max_count=max_count,
                           gpu_queue__capacity_reservations=[{"id": i, "instance_count": n} for i, n in zip(ids, counts)])
    settings = load_settings("prod", config_dir)
    return render_cluster_config(settings, ClusterResources.placeholders(settings))["Scheduling"]["SlurmQueues"][0]


def test_one_reservation_renders_one_compute_resource_named_as_without(tmp_path, write_env):
    gpu = on_odcrs(tmp_path, write_env, [80], 0, 80)
    assert gpu["CapacityType"] == "ONDEMAND"
    assert [(r["Name"], r["MinCount"], r["MaxCount"], r["CapacityReservationTarget"]) for r in gpu["ComputeResources"]] == [
        ("p5e-48xlarge", 0, 80, {"CapacityReservationId": "cr-0a1b2c3d4e5f60718"})]


def test_odcr_node_counts_fill_the_reservations_in_order(tmp_path, write_env):
    gpu = on_odcrs(tmp_path, write_env, [50, 20, 20], 55, 80)
    assert [(r["Name"], r["MinCount"], r["MaxCount"]) for r in gpu["ComputeResources"]] == [
        ("p5e-48xlarge", 50, 50), ("p5e-48xlarge-r2", 5, 20), ("p5e-48xlarge-r3", 0, 10)]


def test_several_reservations_pass_parallelclusters_schema(tmp_path, write_env, check_schema):
    settings = load_settings("prod")
    gpu = on_odcrs(tmp_path, write_env, [50, 20, 20], 0, 90)
    config = render("prod")
    config["Scheduling"]["SlurmQueues"][0] = gpu
    result = check_schema({"three odcrs": config}, settings)["three odcrs"]
    assert result.errors == {} and result.ec2_calls == ["DescribeCapacityReservations"]


def test_dev_without_a_reservation_has_one_untargeted_compute_resource():
    (resource,) = render("dev")["Scheduling"]["SlurmQueues"][0]["ComputeResources"]
    assert resource["Name"] == "g5-12xlarge" and "CapacityReservationTarget" not in resource
    assert (resource["MinCount"], resource["MaxCount"]) == (0, 3)


@pytest.mark.parametrize("env", ENVS)
def test_bootstrap_timeouts_are_rendered_as_dev_settings(env):
    settings = load_settings(env)
    assert render(env)["DevSettings"] == {"Timeouts": {
        "HeadNodeBootstrapTimeout": settings.head_node.bootstrap_timeout_s,
        "ComputeNodeBootstrapTimeout": settings.compute_bootstrap_timeout_s,
    }}
    assert settings.head_node.bootstrap_timeout_s == 3600  # the head node builds the jobs' CUDA PyTorch venv


@pytest.mark.parametrize("env", ENVS)
def test_compute_queues_pass_their_gpu_count_to_the_node_health_check(env):
    settings = load_settings(env)
    config = render(env)
    gpu, cpu = config["Scheduling"]["SlurmQueues"]
    for queue, gpus in ((gpu, settings.gpu_queue.gpus_per_instance), (cpu, 0)):
        args = queue["CustomActions"]["OnNodeConfigured"]["Args"]
        assert args[args.index("--gpus") + 1] == str(gpus)
    # The head node's OnNodeConfigured cannot change on a running cluster: no --gpus there.
    head = config["HeadNode"]["CustomActions"]
    assert "--gpus" not in head["OnNodeConfigured"]["Args"] and "--gpus" not in head["OnNodeUpdated"]["Args"]


def test_monitoring_and_tags():
    config = render("prod")
    assert config["Monitoring"]["DetailedMonitoring"] is True
    assert config["Monitoring"]["Logs"]["CloudWatch"]["Enabled"] is True
    assert config["Monitoring"]["Logs"]["CloudWatch"]["RetentionInDays"] in (30, 60, 90, 120, 180, 365)
    assert config["Monitoring"]["Dashboards"]["CloudWatch"]["Enabled"] is True
    assert {"Key": "environment", "Value": "prod"} in config["Tags"]


def test_missing_file_system_is_a_clear_error():
    settings = load_settings("dev")
    resources = ClusterResources.placeholders(settings)
    partial = ClusterResources(**{**resources.__dict__, "file_system_ids": {"data": "fs-0123456789abcdef0"}})
    with pytest.raises(RenderError, match=r"lacks \['checkpoints', 'logs'\]"):
        render_cluster_config(settings, partial)
