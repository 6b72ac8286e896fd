"""Every rejected settings input fails at load time with a message naming the file, the field and the fix."""

from pathlib import Path

import pytest

from cluster_config.offerings import GRAFANA_REGIONS
from cluster_config.settings import SettingsError, available_environments, load_settings
from tests.settings_files import write_env


def rejection(tmp_path: Path, env_name: str = "prod", **changes) -> str:
    path = write_env(tmp_path, env_name, **changes)
    with pytest.raises(SettingsError) as caught:
        load_settings(env_name, config_dir=tmp_path)
    message = str(caught.value)
    assert str(path) in message, "the message must name the file"
    return message


@pytest.mark.parametrize("env_name", available_environments())
def test_shipped_environments_load(env_name):
    settings = load_settings(env_name)
    assert settings.name == env_name
    assert settings.gpu_queue.max_count >= sum(model.nodes for model in settings.models)


def test_unmodified_copy_loads(tmp_path):
    write_env(tmp_path)
    assert load_settings("prod", config_dir=tmp_path).gpu_queue.max_count == 80


def test_unknown_top_level_key_is_rejected_with_allowed_keys(tmp_path):
    message = rejection(tmp_path, regoin="ap-southeast-3")
    assert "regoin: unknown key; remove it or fix the spelling" in message
    assert "region" in message.split("allowed here:")[1]


def test_unknown_nested_key_is_rejected_with_allowed_keys(tmp_path):
    message = rejection(tmp_path, storage__data__throughput=1000)
    assert "storage.data.throughput: unknown key" in message
    assert "throughput_per_tib" in message.split("allowed here:")[1]


@pytest.mark.parametrize(
    ("capacity", "nearest"), [(3000, "2400 or 4800"), (1000, "1200"), (7000, "4800 or 7200")]
)
def test_fsx_capacity_must_be_a_persistent_increment(tmp_path, capacity, nearest):
    message = rejection(tmp_path, storage__checkpoints__storage_capacity_gib=capacity)
    assert (
        f"storage.checkpoints.storage_capacity_gib: {capacity} GiB is not a valid FSx for Lustre persistent SSD size; "
        f"use 1200, 2400 or a multiple of 2400 (nearest: {nearest})"
    ) in message


def test_fsx_throughput_must_be_an_offered_tier(tmp_path):
    message = rejection(tmp_path, storage__logs__throughput_per_tib=200)
    assert "storage: logs.throughput_per_tib: 200 MB/s/TiB is not offered for PERSISTENT_2; use one of 125, 250, 500, 1000" in message


def test_persistent_1_has_its_own_throughput_tiers(tmp_path):
    # Prod's 1000 MB/s/TiB exists only for PERSISTENT_2: switching the type alone is caught.
    message = rejection(tmp_path, storage__deployment_type="PERSISTENT_1")
    assert "storage: data.throughput_per_tib: 1000 MB/s/TiB is not offered for PERSISTENT_1; use one of 50, 100, 200" in message
    tiers = {"storage_capacity_gib": 2400, "throughput_per_tib": 200}
    write_env(tmp_path, storage__deployment_type="PERSISTENT_1", storage__data={**tiers, "mount_dir": "/fsx/data"},
              storage__checkpoints={**tiers, "mount_dir": "/fsx/checkpoints"}, storage__logs={**tiers, "mount_dir": "/fsx/logs"})
    assert load_settings("prod", config_dir=tmp_path).storage.deployment_type == "PERSISTENT_1"


def test_unknown_fsx_deployment_type_is_rejected(tmp_path):
    message = rejection(tmp_path, storage__deployment_type="PERSISTENT")
    assert "storage.deployment_type: Input should be 'PERSISTENT_2' or 'PERSISTENT_1'" in message


def test_instance_types_the_region_does_not_offer_are_rejected_with_alternatives(tmp_path):
    # The finding that would have failed prod's deploy: c6i is not offered in ap-southeast-3.
    message = rejection(tmp_path, head_node__instance_type="c6i.4xlarge", cpu_queue__instance_type="c6i.8xlarge")
    assert "  head_node.instance_type: c6i.4xlarge is not offered in ap-southeast-3; offered there: c7i.4xlarge," in message
    assert "  cpu_queue.instance_type: c6i.8xlarge is not offered in ap-southeast-3; offered there: c7i.8xlarge," in message
    # Reservation-only GPU types count as offered (moto's offerings data, not the price list).
    assert "gpu_queue.instance_type" not in message


def test_alternatives_keep_the_processor_architecture(tmp_path):
    message = rejection(tmp_path, cpu_queue__instance_type="c6i.8xlarge")
    offered = message.split("offered there: ")[1]
    assert "c7g" not in offered and "c8g" not in offered  # Graviton would need another AMI


def test_region_without_offerings_data_says_how_to_refresh(tmp_path):
    message = rejection(tmp_path, region="xx-north-9", availability_zone="xx-north-9a")
    assert "no instance offerings data for 'xx-north-9'" in message
    assert "scripts/refresh_instance_offerings.py" in message


def test_grafana_in_a_region_without_amazon_managed_grafana_is_refused_naming_the_field(tmp_path):
    # Found by synthesizing prod with it on: CloudFormation has no AWS::Grafana::Workspace in ap-southeast-3.
    message = rejection(tmp_path, alerts__grafana=True)
    assert "alerts.grafana: Amazon Managed Grafana is not offered in ap-southeast-3" in message
    assert "set it to false" in message


def test_grafana_regions_are_those_where_cloudformation_has_the_workspace():
    import cfnlint  # the pinned cfn-lint's region schemas (requirements.txt)

    providers = Path(cfnlint.__file__).parent / "data/schemas/providers"
    commercial = [p for p in providers.glob("*-*-[0-9].json") if not p.stem.startswith(("us-iso", "eu-iso", "cn-", "us-gov", "eusc-"))]
    assert len(commercial) > 20
    with_grafana = {p.stem for p in commercial if '"AWS::Grafana::Workspace"' in p.read_text()}
    assert with_grafana == GRAFANA_REGIONS


CR_A, CR_B, CR_C = "cr-0a1b2c3d4e5f60718", "cr-0a1b2c3d4e5f60729", "cr-0123456789abcdef0"


def reservations(*entries) -> list[dict]:
    """capacity_reservations entries from (id, instance_count, kind) triples."""
    return [{"id": id_, "instance_count": count, "kind": kind} for id_, count, kind in entries]


def odcr_rejection(tmp_path, *entries, **changes) -> str:
    """The rejection of prod's settings on On-Demand Capacity Reservations (dynamic nodes) with ``changes``."""
    return rejection(tmp_path, gpu_queue__capacity_reservations=reservations(*entries), gpu_queue__min_count=0, **changes)


def test_prod_holds_two_capacity_blocks_of_at_most_64():
    queue = load_settings("prod").gpu_queue
    assert [(r.kind, r.instance_count) for r in queue.capacity_reservations] == [("capacity_block", 40)] * 2
    assert queue.capacity_type == "CAPACITY_BLOCK"
    assert queue.min_count == queue.max_count == queue.reserved_count == 80
    assert queue.node_counts() == [(40, 40), (40, 40)]


def test_capacity_block_above_64_instances_is_refused_citing_the_ec2_limit(tmp_path):
    # prod's 80 nodes as one block: what the single capacity_reservation used to allow.
    message = rejection(tmp_path, gpu_queue__capacity_reservations=reservations((CR_A, 80, "capacity_block")))
    assert ("gpu_queue.capacity_reservations.0: instance_count 80 is above 64, the most instances one Capacity Block "
            "holds (EC2 User Guide, Capacity Blocks for ML)") in message
    assert "list each block you bought as its own capacity_reservations entry (e.g. 80 nodes as two blocks of 40)" in message


def test_an_odcr_has_no_64_instance_limit(tmp_path):
    write_env(tmp_path, gpu_queue__capacity_reservations=reservations((CR_A, 80, "odcr")), gpu_queue__min_count=0)
    queue = load_settings("prod", config_dir=tmp_path).gpu_queue
    assert queue.capacity_type == "ONDEMAND" and queue.node_counts() == [(0, 80)]


def test_the_old_single_capacity_reservation_key_names_the_new_list(tmp_path):
    message = rejection(tmp_path, gpu_queue__capacity_reservation={"id": CR_A, "instance_count": 80})
    assert "gpu_queue: capacity_reservation is now capacity_reservations, a list" in message
    assert "capacity_reservations: [{id: cr-..., instance_count: N, kind: odcr}]" in message


def test_reservation_ids_must_be_unique(tmp_path):
    message = rejection(tmp_path, gpu_queue__capacity_reservations__1__id=CR_A)
    assert f"gpu_queue: capacity_reservations lists {CR_A} more than once; list each reservation once" in message


def test_mixed_reservation_kinds_are_refused(tmp_path):
    message = rejection(tmp_path, gpu_queue__capacity_reservations__1__kind="odcr",
                        gpu_queue__capacity_reservations__1__end="DELETE")  # an ODCR has no end that stops nodes
    assert (f"gpu_queue: capacity_reservations mixes kinds (capacity_block: {CR_A}; odcr: {CR_B}), but ParallelCluster's "
            "CapacityType is per queue") in message
    assert "keep one kind in gpu_queue" in message


def test_capacity_blocks_need_max_count_equal_to_their_total(tmp_path):
    message = rejection(tmp_path, gpu_queue__max_count=72, gpu_queue__min_count=72)
    assert ("gpu_queue: max_count 72 differs from the Capacity Blocks' total instance_count 80 (40 + 40): ParallelCluster "
            "runs each block's instances as static nodes, all of them; set max_count: 80") in message


def test_capacity_block_needs_static_nodes(tmp_path):
    # A Capacity Block with min_count 0 would render an ONDEMAND-style dynamic queue that never launches.
    message = rejection(tmp_path, gpu_queue__min_count=0)
    assert "gpu_queue: min_count 0 differs from max_count 80, but capacity_reservations are of kind capacity_block" in message
    assert "set min_count: 80" in message


def test_capacity_block_refuses_a_placement_group(tmp_path):
    message = rejection(tmp_path, gpu_queue__placement_group=True)
    assert "gpu_queue: placement_group is true, but a Capacity Block places its instances itself" in message
    assert "set placement_group: false" in message


def test_reservation_kind_must_be_known(tmp_path):
    message = rejection(tmp_path, gpu_queue__capacity_reservations__0__kind="spot")
    assert "gpu_queue.capacity_reservations.0.kind: Input should be 'odcr' or 'capacity_block'" in message


def test_max_count_above_the_reservations_is_rejected(tmp_path):
    message = odcr_rejection(tmp_path, (CR_A, 40, "odcr"), (CR_B, 40, "odcr"), gpu_queue__max_count=96)
    assert "gpu_queue: max_count 96 is above the capacity reservations' total instance_count 80 (40 + 40)" in message
    assert "lower max_count to 80 or enlarge the reservations" in message


def test_max_count_that_leaves_a_reservation_unused_is_rejected(tmp_path):
    message = odcr_rejection(tmp_path, (CR_A, 70, "odcr"), (CR_B, 10, "odcr"), gpu_queue__max_count=70)
    assert f"gpu_queue: max_count 70 leaves the last of capacity_reservations ({CR_B}) no node" in message
    assert f"raise max_count above 70 or remove {CR_B}" in message


def test_odcr_nodes_fill_the_reservations_in_order(tmp_path):
    write_env(tmp_path, gpu_queue__capacity_reservations=reservations((CR_A, 50, "odcr"), (CR_B, 20, "odcr"), (CR_C, 20, "odcr")),
              gpu_queue__min_count=55, gpu_queue__max_count=80)
    assert load_settings("prod", config_dir=tmp_path).gpu_queue.node_counts() == [(50, 50), (5, 20), (0, 10)]


@pytest.mark.parametrize("bad_id", ["cr-123", "0a1b2c3d4e5f60718", "cr-0A1B2C3D4E5F60718"])
def test_malformed_capacity_reservation_id_is_rejected(tmp_path, bad_id):
    message = rejection(tmp_path, gpu_queue__capacity_reservations__1__id=bad_id)
    assert f"gpu_queue.capacity_reservations.1.id: {bad_id!r} is not a capacity reservation id" in message
    assert "e.g. cr-0123456789abcdef0" in message


@pytest.mark.parametrize(("key", "field"), [("head_node__bootstrap_timeout_s", "head_node.bootstrap_timeout_s"),
                                            ("compute_bootstrap_timeout_s", "compute_bootstrap_timeout_s")])
def test_bootstrap_timeouts_below_parallelclusters_default_are_refused(tmp_path, key, field):
    message = rejection(tmp_path, **{key: 1800})
    assert (f"{field}: 1800 s is below ParallelCluster's default bootstrap timeout of 2100 s, and a bootstrap that "
            f"runs out of it fails the node; set {field}: 2100 or more") in message


def test_bootstrap_timeouts_default_to_an_hour_for_the_head_node_and_parallelclusters_for_compute():
    for env in available_environments():
        settings = load_settings(env)
        assert (settings.head_node.bootstrap_timeout_s, settings.compute_bootstrap_timeout_s) == (3600, 2100)


def test_ssh_from_the_whole_internet_is_rejected(tmp_path):
    message = rejection(tmp_path, network__ssh_allowed_cidrs=["198.51.100.0/24", "0.0.0.0/0"])
    assert "network.ssh_allowed_cidrs: 0.0.0.0/0 opens SSH to the whole internet" in message
    assert "SSM Session Manager" in message


def test_ssh_cidr_must_be_a_cidr_block(tmp_path):
    message = rejection(tmp_path, network__ssh_allowed_cidrs=["office"])
    assert "network.ssh_allowed_cidrs: 'office' is not an IPv4 CIDR block" in message


@pytest.mark.parametrize("cidr", ["10.0.0.0/24", "10.0.0.0/8"])
def test_vpc_block_must_be_between_16_and_20(tmp_path, cidr):
    message = rejection(tmp_path, network__vpc_cidr=cidr)
    assert f"network.vpc_cidr: {cidr} is not a usable VPC block; use a /16 to /20 block" in message


def test_missing_environment_lists_the_available_ones(tmp_path):
    write_env(tmp_path, "dev")
    write_env(tmp_path, "prod")
    with pytest.raises(SettingsError) as caught:
        load_settings("missing", config_dir=tmp_path)
    message = str(caught.value)
    assert "no environment 'missing'" in message
    assert "Available: dev, prod" in message


def test_missing_required_key_is_named(tmp_path):
    message = rejection(tmp_path, gpu_queue__instance_type="DELETE")
    assert "gpu_queue.instance_type: required; add it" in message


def test_account_must_be_twelve_digits(tmp_path):
    message = rejection(tmp_path, account="2222")
    assert "account: '2222' is not an AWS account id" in message


def test_zone_must_be_in_the_region(tmp_path):
    message = rejection(tmp_path, availability_zone="us-east-1a")
    assert "availability_zone 'us-east-1a' is not in region 'ap-southeast-3'" in message


def test_min_count_above_max_count_is_rejected(tmp_path):
    message = rejection(tmp_path, cpu_queue__min_count=9)
    assert "cpu_queue: min_count 9 is above max_count 8; lower min_count" in message


def test_plan_needing_more_nodes_than_the_queue_is_rejected(tmp_path):
    message = rejection(tmp_path, gpu_queue__max_count=70, gpu_queue__min_count=70,
                        gpu_queue__capacity_reservations__1__instance_count=30)
    assert "models: the plan needs 80 nodes but gpu_queue.max_count is 70" in message


def test_file_systems_must_mount_in_different_directories(tmp_path):
    message = rejection(tmp_path, storage__logs__mount_dir="/fsx/data")
    assert "mount_dir values must differ" in message


def test_name_must_match_the_file(tmp_path):
    message = rejection(tmp_path, name="staging")
    assert "name: 'staging' differs from the file name; set name: prod" in message


def test_invalid_yaml_is_reported_with_the_file(tmp_path):
    path = tmp_path / "prod.yaml"
    path.write_text("account: [unclosed\n")
    with pytest.raises(SettingsError, match="not valid YAML") as caught:
        load_settings("prod", config_dir=tmp_path)
    assert str(path) in str(caught.value)
