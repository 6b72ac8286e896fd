"""Every rejected settings input fails at load time with a message naming the file, the field and the fix."""

from pathlib import Path

import pytest

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
def test_fsx_capacity_must_be_a_persistent_2_increment(tmp_path, capacity, nearest):
    message = rejection(tmp_path, storage__checkpoints__storage_capacity_gib=capacity)
    assert (
        f"storage.checkpoints.storage_capacity_gib: {capacity} GiB is not a valid PERSISTENT_2 size; "
        f"use 1200, 2400 or a multiple of 2400 (nearest: {nearest})"
    ) in message


def test_fsx_throughput_must_be_an_offered_tier(tmp_path):
    message = rejection(tmp_path, storage__logs__throughput_per_tib=200)
    assert "storage.logs.throughput_per_tib: 200 MB/s/TiB is not offered for PERSISTENT_2; use one of 125, 250, 500, 1000" in message


def test_max_count_above_the_reservation_is_rejected(tmp_path):
    message = rejection(tmp_path, gpu_queue__max_count=96)
    assert "gpu_queue: max_count 96 is above the capacity reservation's instance_count 80" in message
    assert "lower max_count to 80 or enlarge the reservation" in message


@pytest.mark.parametrize("bad_id", ["cr-123", "0a1b2c3d4e5f60718", "cr-0A1B2C3D4E5F60718"])
def test_malformed_capacity_reservation_id_is_rejected(tmp_path, bad_id):
    message = rejection(tmp_path, gpu_queue__capacity_reservation__id=bad_id)
    assert f"gpu_queue.capacity_reservation.id: {bad_id!r} is not an On-Demand Capacity Reservation id" in message
    assert "e.g. cr-0123456789abcdef0" in message


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
    message = rejection(tmp_path, gpu_queue__max_count=70, gpu_queue__capacity_reservation__instance_count=70)
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
