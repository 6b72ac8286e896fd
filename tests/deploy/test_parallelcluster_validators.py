"""Deploy-true: each environment deployed into an emulated account (moto), then ParallelCluster 3.16.1's
own validators (what `pcluster create-cluster --dryrun` runs) and update checks (what `pcluster
update-cluster` and its CloudFormation custom resource run) on the config rendered with those ids.

The findings that would have stopped a real deploy are re-created here and shown caught before deploy.
"""

from __future__ import annotations

import copy

import yaml

import pytest

from cluster_config.emulated.acknowledged import ACKNOWLEDGED_WARNINGS
from cluster_config.emulated.check import check_environment, update_scenarios
from cluster_config.emulated.stubs import PCLUSTER_STUBS
from cluster_config.settings import CONFIG_DIR, Settings, available_environments

pytestmark = pytest.mark.slow

ENVS = available_environments()
# Validators that must run: each checks something only a deploy would otherwise find.
KEY_VALIDATORS = {
    "InstanceTypeValidator",  # the type exists in the region (c6i in ap-southeast-3)
    "ExistingFsxNetworkingValidator",  # Lustre ports through the file systems' ENIs and security groups
    "SecurityGroupsValidator", "EfaSecurityGroupValidator", "EfaValidator",
    "HeadNodeLaunchTemplateValidator", "ComputeResourceLaunchTemplateValidator",
    "AdditionalIamPolicyValidator",  # the SSM managed policy and the head node's upload policy exist
    "AsyncTimedUrlValidator",  # the node scripts are in the assets bucket
    "QueueSubnetsValidator", "SchedulableMemoryValidator", "EbsVolumeThroughputIopsValidator",
}


@pytest.mark.parametrize("env", ENVS)
def test_parallelclusters_validators_pass_on_the_emulated_deploy(report, env):
    result = report(env)
    assert result.errors == [], result.errors
    assert result.open_warnings == [], "fix these or acknowledge them in cluster_config/emulated/acknowledged.py"
    assert len(result.validators) >= 70
    assert KEY_VALIDATORS <= set(result.validators), KEY_VALIDATORS - set(result.validators)
    # The config names what the emulated deploy created, not placeholders.
    assert result.config["HeadNode"]["Networking"]["SubnetId"].startswith("subnet-")


def test_capacity_reservation_validators_run_on_prod(report):
    assert {"CapacityReservationValidator", "CapacityReservationSizeValidator", "CapacityTypeValidator"} <= set(report("prod").validators)


def test_prods_two_capacity_blocks_pass_parallelclusters_validators(report):
    """80 p5e nodes from two Capacity Blocks of 40 (one block holds at most 64): each block its own
    compute resource, static, with its own target; ParallelCluster's validators accept the queue."""
    result = report("prod")
    assert result.errors == [] and result.open_warnings == []
    gpu = result.config["Scheduling"]["SlurmQueues"][0]
    assert gpu["CapacityType"] == "CAPACITY_BLOCK"
    assert [(r["Name"], r["MinCount"], r["MaxCount"], r["CapacityReservationTarget"]["CapacityReservationId"])
            for r in gpu["ComputeResources"]] == [("p5e-48xlarge", 40, 40, "cr-0a1b2c3d4e5f60718"),
                                                 ("p5e-48xlarge-r2", 40, 40, "cr-0a1b2c3d4e5f60729")]
    # Both blocks were described to ParallelCluster (from the settings: a block cannot be made in moto).
    assert "describe_capacity_reservations(cr-0a1b2c3d4e5f60718, cr-0a1b2c3d4e5f60729)" in result.stubbed


def test_capacity_block_larger_than_its_reservation_is_what_parallelcluster_rejects(synthesized, pcluster_validated):
    """ParallelCluster compares each compute resource's MaxCount with its block: one 80-node compute resource
    on a 40-instance block fails (the settings refuse a block above 64, and counts that differ, first)."""
    def one_resource_of_80(config):
        gpu = config["Scheduling"]["SlurmQueues"][0]
        first = gpu["ComputeResources"][0]
        gpu["ComputeResources"] = [{**first, "MinCount": 80, "MaxCount": 80}]

    result = pcluster_validated("prod", edit_config=one_resource_of_80)
    assert [f["validator"] for f in result.errors] == ["CapacityReservationSizeValidator"], result.errors


@pytest.mark.parametrize("env", ENVS)
def test_only_the_listed_calls_are_stubbed(report, env):
    for call in report(env).stubbed:
        name = call.split("(")[0]
        assert any(stub.startswith(f"Ec2Client.{name}") for stub in PCLUSTER_STUBS), call


def test_every_acknowledged_warning_is_still_raised(report):
    """An acknowledgement whose warning has gone is stale: remove it."""
    raised = [w for env in ENVS for w in report(env).warnings]
    for validator, fragment in ACKNOWLEDGED_WARNINGS:
        assert any(w["validator"] == validator and fragment in w["message"] for w in raised), (validator, fragment)


@pytest.mark.parametrize("env", ENVS)
def test_settings_changes_during_a_run_that_a_running_cluster_accepts(report, env):
    updates = report(env).updates
    for scenario in ("add a model", "remove a model", "raise cpu_queue.max_count"):
        assert updates[scenario]["allowed"], (scenario, updates[scenario]["rows"])
        assert updates[scenario]["rows"], f"{scenario}: the config did not change, so nothing was checked"
    # A model's node count reaches the head node only through the model list (its Slurm QOS,
    # node_scripts/slurm_accounts.sh): the list's digest in OnNodeUpdated changes, and that is all.
    resize = updates["resize a model"]
    assert resize["allowed"]
    assert [(row[0], row[1], row[4]) for row in resize["rows"]] == [
        ("['HeadNode', 'CustomActions', 'OnNodeUpdated']", "Args", "SUCCEEDED")]


@pytest.mark.parametrize("env", ENVS)
def test_settings_changes_that_need_the_compute_fleet_stopped(report, env):
    # Documented in docs/cluster.md: with QueueUpdateStrategy DRAIN, ParallelCluster refuses these
    # while nodes run; stop the fleet (pcluster update-compute-fleet --status STOP_REQUESTED) first.
    updates = report(env).updates
    for scenario, where in (("lower gpu_queue.max_count", "MaxCount"), ("change cpu_queue.instance_type", "ComputeResources")):
        assert not updates[scenario]["allowed"], scenario
        refused = [row for row in updates[scenario]["rows"] if row[4] != "SUCCEEDED"]
        assert [row[1] for row in refused] == [where], refused
        assert "All compute nodes must be stopped or QueueUpdateStrategy must be set to TERMINATE" in refused[0][5]


def test_reservation_changes_a_running_cluster_accepts(report):
    # Compute resources are named by position: a new reservation adds one, a new id for a slot (the next
    # Capacity Block) retargets one; QueueUpdateStrategy DRAIN lets both through while nodes run.
    updates = report("prod").updates
    added = updates["add a capacity reservation"]
    assert added["allowed"], added["rows"]
    assert [(row[1], row[4]) for row in added["rows"]] == [("ComputeResources", "SUCCEEDED")], added["rows"]
    replaced = updates["replace a capacity reservation"]
    assert replaced["allowed"], replaced["rows"]
    assert [(row[0], row[1], row[3], row[4]) for row in replaced["rows"]] == [(
        "['Scheduling', 'SlurmQueues[gpu]', 'ComputeResources[p5e-48xlarge-r2]', 'CapacityReservationTarget']",
        "CapacityReservationId", "cr-0f1e2d3c4b5a69788", "SUCCEEDED")], replaced["rows"]


@pytest.mark.parametrize("env", ENVS)
def test_head_node_bootstrap_timeout_is_fixed_at_creation(report, env):
    refused = report(env).updates["raise head_node.bootstrap_timeout_s"]
    assert not refused["allowed"]
    assert [(row[1], row[7]) for row in refused["rows"] if row[4] != "SUCCEEDED"] == [("HeadNodeBootstrapTimeout", "UNSUPPORTED")]


def test_a_cluster_created_before_the_timeouts_and_gpu_counts_takes_them_by_update(synthesized, pcluster_venv):
    """DevSettings.Timeouts and the queues' --gpus arguments reach a running cluster: the section is new
    (DevSettings: SUPPORTED) and queue custom actions follow QueueUpdateStrategy; the head node's
    OnNodeConfigured, which a running cluster cannot change, is untouched."""
    settings, stacks, templates, _ = synthesized("prod")

    def before(deployed):
        old = copy.deepcopy(deployed.config)
        del old["DevSettings"]
        for queue in old["Scheduling"]["SlurmQueues"]:
            args = queue["CustomActions"]["OnNodeConfigured"]["Args"]
            del args[args.index("--gpus"):args.index("--gpus") + 2]
        return {"timeouts and --gpus": (old, deployed.config)}

    result = check_environment(settings, stacks, templates, with_updates=False, extra_updates=before)
    update = result.updates["timeouts and --gpus"]
    assert update["allowed"], update["rows"]
    assert sorted((row[0], row[1], row[4]) for row in update["rows"]) == [
        ("['Scheduling', 'SlurmQueues[cpu]', 'CustomActions', 'OnNodeConfigured']", "Args", "SUCCEEDED"),
        ("['Scheduling', 'SlurmQueues[gpu]', 'CustomActions', 'OnNodeConfigured']", "Args", "SUCCEEDED"),
        ("[]", "DevSettings", "SUCCEEDED"),
    ], update["rows"]


def test_model_list_in_on_node_configured_args_would_make_the_update_fail(synthesized, pcluster_venv):
    """The finding: model names in OnNodeConfigured Args; splitting model7 made `cdk deploy` roll back."""
    settings, stacks, templates, _ = synthesized("prod")

    def old_style(deployed):
        def with_models(config, models):
            config = copy.deepcopy(config)
            config["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Args"] += models
            return config

        names = [m.name for m in settings.models]
        return {"split model7 (models as arguments)": (with_models(deployed.config, names),
                                                       with_models(deployed.config, names + ["model8"]))}

    result = check_environment(settings, stacks, templates, with_updates=False, extra_updates=old_style)
    refused = result.updates["split model7 (models as arguments)"]
    assert not refused["allowed"]
    assert [(row[0], row[1]) for row in refused["rows"] if row[4] != "SUCCEEDED"] == [
        ("['HeadNode', 'CustomActions', 'OnNodeConfigured']", "Args")
    ]


def test_the_head_node_upload_policy_reaches_a_running_cluster_by_update(synthesized, pcluster_venv):
    """Clusters created before the head node could write the data bucket get the policy by `cdk deploy`."""
    settings, stacks, templates, _ = synthesized("prod")

    def before_the_policy(deployed):
        old = copy.deepcopy(deployed.config)
        old["HeadNode"]["Iam"]["AdditionalIamPolicies"].remove({"Policy": deployed.resources.data_upload_policy_arn})
        return {"add the upload policy": (old, deployed.config)}

    result = check_environment(settings, stacks, templates, with_updates=False, extra_updates=before_the_policy)
    assert result.errors == [], result.errors  # the policy exists in the account (AdditionalIamPolicyValidator)
    update = result.updates["add the upload policy"]
    assert update["allowed"], update["rows"]
    assert [(row[0], row[4]) for row in update["rows"]] == [("['HeadNode', 'Iam']", "SUCCEEDED")], update["rows"]


def test_c6i_in_ap_southeast_3_is_what_parallelcluster_rejects(synthesized, pcluster_venv):
    """The finding, past the settings check (which now refuses c6i there: tests/test_settings.py)."""
    settings, stacks, templates, _ = synthesized("prod")

    def seed_instance_type(config):
        config["HeadNode"]["InstanceType"] = "c6i.4xlarge"

    result = check_environment(settings, stacks, templates, with_updates=False, edit_config=seed_instance_type)
    messages = [f["message"] for f in result.errors if f["validator"] == "InstanceTypeValidator"]
    assert messages == ["The instance type 'c6i.4xlarge' is not supported."]


def with_reservations(settings: Settings, reservations: list[dict], min_count: int, max_count: int) -> Settings:
    raw = settings.model_dump()
    raw["gpu_queue"].update(capacity_reservations=reservations, min_count=min_count, max_count=max_count)
    return Settings(**raw)


def test_on_demand_capacity_reservations_render_a_config_parallelcluster_accepts(synthesized, pcluster_venv):
    settings, stacks, templates, _ = synthesized("prod")
    odcrs = with_reservations(settings, [{"id": "cr-0a1b2c3d4e5f60718", "instance_count": 60},
                                         {"id": "cr-0a1b2c3d4e5f60729", "instance_count": 30}], 0, 90)
    result = check_environment(odcrs, stacks, templates, with_updates=False)
    assert result.errors == [], result.errors
    gpu = result.config["Scheduling"]["SlurmQueues"][0]
    assert gpu["CapacityType"] == "ONDEMAND"
    assert [(r["MinCount"], r["MaxCount"]) for r in gpu["ComputeResources"]] == [(0, 60), (0, 30)]


def test_capacity_block_with_min_count_0(synthesized, pcluster_validated):
    """The settings refuse it first (tests/test_settings.py); ParallelCluster agrees once CapacityType says so,
    but the old ONDEMAND rendering against a Capacity Block passes every validator and fails only at launch."""
    settings, _, _, _ = synthesized("prod")
    with pytest.raises(ValueError, match="set min_count: 80"):
        with_reservations(settings, [r.model_dump() for r in settings.gpu_queue.capacity_reservations], 0, 80)

    def min_count_0(config):
        for resource in config["Scheduling"]["SlurmQueues"][0]["ComputeResources"]:
            resource["MinCount"] = 0

    result = pcluster_validated("prod", edit_config=min_count_0)
    assert "Min count must be a value > 0 when using Capacity Block reservation." in [f["message"] for f in result.errors]

    def old_ondemand(config):
        min_count_0(config)
        config["Scheduling"]["SlurmQueues"][0]["CapacityType"] = "ONDEMAND"

    result = pcluster_validated("prod", edit_config=old_ondemand)
    assert result.errors == []  # not caught by ParallelCluster: why the reservation kind is a setting


def test_persistent_1_file_systems_pass_parallelclusters_validators(synthesized, pcluster_venv, tmp_path):
    """storage.deployment_type PERSISTENT_1: the storage template's ImportPath/ExportPath reach the FSx API."""
    from stacks.app import build_app
    from tests.settings_files import write_env

    import json

    tiers = {"storage_capacity_gib": 1200, "throughput_per_tib": 200}
    config_dir = write_env(tmp_path / "settings", "dev", storage__deployment_type="PERSISTENT_1",
                           storage__data={**tiers, "mount_dir": "/fsx/data"},
                           storage__checkpoints={**tiers, "mount_dir": "/fsx/checkpoints"},
                           storage__logs={**tiers, "mount_dir": "/fsx/logs"}).parent
    built = build_app("dev", config_dir=config_dir, outdir=str(tmp_path / "cdk"))
    built.app.synth()
    templates = {part: json.loads((tmp_path / "cdk" / f"{stack.artifact_id}.template.json").read_text())
                 for part, stack in built.stacks.items()}
    result = check_environment(built.settings, built.stacks, templates, with_updates=False)
    assert result.errors == [] and result.open_warnings == []
    assert "ExistingFsxNetworkingValidator" in result.validators


def test_update_scenarios_cover_what_users_change():
    from cluster_config.settings import load_settings

    assert set(update_scenarios(load_settings("prod"))) == {
        "add a model", "remove a model", "resize a model", "lower gpu_queue.max_count",
        "raise cpu_queue.max_count", "change cpu_queue.instance_type", "raise head_node.bootstrap_timeout_s",
        "add a capacity reservation", "replace a capacity reservation",
    }
    assert "add a capacity reservation" not in update_scenarios(load_settings("dev"))  # dev has none


def _deployed_from(tmp_path, **changes):
    """A settings file as the running cluster was deployed from: the shipped prod with ``changes``."""
    from tests.settings_files import write_env

    return write_env(tmp_path / "deployed", "prod", **changes)


def test_update_check_accepts_a_new_model_before_deploy(pcluster_venv, tmp_path, capsys):
    from cluster_config.__main__ import main

    seven_b = yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())["models"][0]
    raw_models = [{**seven_b, "name": f"model{i}", "nodes": 11, "dataset": f"tokenized/model{i}"} for i in range(1, 7)]
    deployed = _deployed_from(tmp_path, models=raw_models)  # before model7 was added
    assert main(["update-check", "--env", "prod", "--from", str(deployed)]) == 0
    out = capsys.readouterr().out
    # A 70B model joins: the model list (OnNodeUpdated) changes, and so does KillWait, which is sized
    # for a save of every planned model at once. A running cluster accepts both.
    assert "prod: the running cluster accepts this update (2 change(s))" in out
    assert "SUCCEEDED ['HeadNode', 'CustomActions', 'OnNodeUpdated']/Args" in out
    assert "{'KillWait': 660}" in out


def test_update_check_refuses_an_instance_type_change_with_the_fix(pcluster_venv, tmp_path, capsys):
    from cluster_config.__main__ import main

    deployed = _deployed_from(tmp_path, cpu_queue__instance_type="c7i.16xlarge")
    assert main(["update-check", "--env", "prod", "--from", str(deployed)]) == 1
    captured = capsys.readouterr()
    assert "ACTION NEEDED ['Scheduling', 'SlurmQueues[cpu]']/ComputeResources" in captured.out
    assert "error: ParallelCluster would refuse this update on the running cluster" in captured.err
    assert "pcluster update-compute-fleet --status STOP_REQUESTED" in captured.err
