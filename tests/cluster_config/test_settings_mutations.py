"""Every setting fails when the settings load, or not at all: mutations of the shipped prod.yaml and
dev.yaml that used to pass, or to fail only at deploy, cluster creation or job start, are refused with
a message naming the field and the fix."""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone

import pytest

from cluster_config import __main__ as cli
from cluster_config.goodput import p_no_spare, poisson_quantile
from cluster_config.offerings import known_regions, zones
from cluster_config.settings import SettingsError, load_settings
from tests.settings_files import write_env

# prod.yaml with an account and Capacity Blocks of one's own: the settings of a real deploy, whose dates
# count (the shipped examples' dates are illustrations; deploy-check refuses the examples themselves).
OWN_BLOCKS = {"account": "123456789012", "gpu_queue__capacity_reservations__0__id": "cr-0123456789abcdef0",
              "gpu_queue__capacity_reservations__1__id": "cr-0123456789abcdef1"}

MUTATIONS = [
    # GPUs per instance follow from the instance type.
    ("prod", {"gpu_queue__gpus_per_instance": 16},
     "gpu_queue: gpus_per_instance 16 differs from the 8 GPUs of a p5e.48xlarge"),
    # Reserved nodes with no model to train on them.
    ("prod", {"models": []}, "models: none listed, but gpu_queue holds 80 nodes"),
    # Queues the jobs bundle submits to by name.
    ("prod", {"cpu_queue__name": "batch"},
     "cpu_queue.name: 'batch': the jobs bundle submits to the partition 'cpu' by name (jobs/backup.sh, jobs/preprocess.sh "
     "and jobs/sync_dataset.sh); set cpu_queue.name: cpu"),
    ("dev", {"gpu_queue__name": "p5"}, "gpu_queue.name: 'p5': the jobs bundle submits to the partition 'gpu' by name"),
    # SSH from far too many addresses.
    ("prod", {"network__ssh_allowed_cidrs": ["0.0.0.0/1"]},
     "network.ssh_allowed_cidrs: 0.0.0.0/1 opens SSH to 2,147,483,648 addresses, more than a /8"),
    ("prod", {"network__ssh_allowed_cidrs": ["198.0.0.0/12"]},
     "network.ssh_allowed_cidrs: 198.0.0.0/12 is an internet range of 1,048,576 addresses, and the head node has a public"),
    # ParallelCluster's limit with Slurm accounting.
    ("prod", {"cluster_name": "llm-prod-" + "x" * 32},
     "cluster_name: 'llm-prod-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' is not a valid ParallelCluster name with Slurm accounting"),
    # File systems mounted inside each other, or over the system's directories.
    ("prod", {"storage__checkpoints__mount_dir": "/fsx/data/checkpoints"},
     "storage: checkpoints.mount_dir /fsx/data/checkpoints lies inside data.mount_dir /fsx/data"),
    ("prod", {"storage__logs__mount_dir": "/opt"}, "storage.logs.mount_dir: '/opt' mounts the file system on or under /opt"),
    ("dev", {"storage__data__mount_dir": "/home/fsx"},
     "storage.data.mount_dir: '/home/fsx' mounts the file system on or under /home"),
    ("dev", {"storage__logs__mount_dir": "/mnt"}, "storage.logs.mount_dir: '/mnt' mounts the file system on /mnt"),
    ("dev", {"storage__logs__mount_dir": "/"}, "storage.logs.mount_dir: '/' must be an absolute path"),
    # Paths the jobs' shell would split or expand.
    ("prod", {"models__0__dataset": "tokenized/model 1"},
     "models.0.dataset: 'tokenized/model 1' holds a space or a character the shell treats specially; use letters"),
    ("prod", {"models__2__tokenizer": "tokenizers/$(id)"}, "models.2.tokenizer: 'tokenizers/$(id)' holds a space"),
    ("dev", {"models__1__tokenizer": "../tokenizer"}, "models.1.tokenizer: '../tokenizer' must be a folder under"),
    # Numbers out of any sane range (they crashed or hung the plan).
    ("prod", {"models__6__steps": 10**13}, "models.6.steps: Input should be less than or equal to 100000000"),
    ("prod", {"goodput__failures_per_1000_node_days": 1e9},
     "goodput.failures_per_1000_node_days: Input should be less than or equal to 1000"),
    ("prod", {"plan__mfu": float("nan")}, "plan.mfu: Input should be a finite number"),
    ("prod", {"plan__mfu": 0.001}, "plan.mfu: Input should be greater than or equal to 0.01"),
    ("prod", {"gpu_queue__root_volume__size_gib": 10**6}, "gpu_queue.root_volume.size_gib: Input should be less than or equal to 16384"),
    ("dev", {"gpu_queue__max_count": 10**5}, "gpu_queue.max_count: Input should be less than or equal to 1000"),
    ("dev", {"head_node__bootstrap_timeout_s": 10**9}, "head_node.bootstrap_timeout_s: 1000000000 s is above 14400 s"),
    ("dev", {"storage__data__storage_capacity_gib": 2400 * 10**6}, "storage.data.storage_capacity_gib: 2400000000 GiB is above"),
    # A model's identity is not an override.
    ("prod", {"models__1__overrides": {"checkpoint.dir": "/fsx/checkpoints/model1"}},
     "models.1: model2: overrides set checkpoint.dir, but a model's checkpoints and logs lie in folders named after it"),
    ("prod", {"models__0__overrides": {"name": "model2"}},
     "models.0: model1: overrides set name, which the entry sets itself; set name: in the entry instead"),
    ("dev", {"models__0__overrides": {"log": {"dir": "/fsx/logs/model2"}}}, "models.0: model1: overrides set log.dir"),
    ("dev", {"models__1__overrides": {"data.path": "/fsx/data/other"}},
     "models.1: model2: overrides set data.path, which the entry sets itself; set dataset: in the entry instead"),
    ("dev", {"models__1__overrides": {"train.steps": 5}}, "set steps: in the entry instead"),
    # A public range as the VPC's block: inside the VPC those addresses would be the VPC's.
    ("prod", {"network__vpc_cidr": "8.8.0.0/16"},
     "network.vpc_cidr: 8.8.0.0/16 is an internet range, and inside the VPC it would hide the internet hosts at those "
     "addresses; use a block of RFC 1918's 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16, e.g. 10.0.0.0/16"),
    ("dev", {"network__vpc_cidr": "100.64.0.0/16"}, "network.vpc_cidr: 100.64.0.0/16 is not a private range of RFC 1918"),
    # AWS's tag rules.
    ("prod", {"tags__aws:owner": "ml-team"},
     "tags: key 'aws:owner' starts with 'aws:', a prefix AWS reserves for its own tags (in any case); rename it, e.g. owner"),
    ("dev", {"tags__AWS:Owner": "ml-team"}, "tags: key 'AWS:Owner' starts with 'AWS:', a prefix AWS reserves"),
    ("prod", {"tags__description": "x" * 300},
     "tags: description: the value is 300 characters; AWS takes at most 256: shorten it"),
    ("prod", {"tags__" + "k" * 129: "x"}, "is 129 characters; AWS takes at most 128: shorten it"),
    ("prod", {"tags__cost-center!": "42"},
     "tags: key 'cost-center!' holds '!'; AWS tags take letters, digits, spaces and _ . : / = + - @ only: replace it"),
    ("dev", {"tags__owner": "ml-team, infra"}, "tags: owner: the value holds ','; AWS tags take letters"),
    ("dev", {"tags__parallelcluster:queue": "gpu"},
     "tags: key 'parallelcluster:queue' starts with 'parallelcluster:', which ParallelCluster reserves"),
    ("dev", {"tags": {f"tag{i}": "x" for i in range(41)}}, "tags: 41 tags, but ParallelCluster takes at most 40"),
    # A zone the region does not have (offline: cluster_config/availability_zones.json).
    ("prod", {"availability_zone": "ap-southeast-3z"},
     "availability_zone 'ap-southeast-3z' is not a zone of ap-southeast-3 (its zones: ap-southeast-3a, ap-southeast-3b, "
     "ap-southeast-3c); use the zone of the capacity reservation"),
    ("dev", {"availability_zone": "us-east-1g"}, "availability_zone 'us-east-1g' is not a zone of us-east-1"),
    # Dates long past, on Capacity Blocks of one's own (the clock of the test run).
    ("prod", {**OWN_BLOCKS, "gpu_queue__capacity_reservations__0__end": "2020-01-18T11:30:00Z",
              "gpu_queue__capacity_reservations__1__end": "2020-01-18T11:30:00Z",
              "goodput__training_start": "2020-01-04T13:30:00Z"},
     "gpu_queue.capacity_reservations.0.end: 2020-01-18T11:30:00+00:00 has passed (it is now "),
    # A boolean is not a count: pydantic would take true as 1.
    ("prod", {"models__0__nodes": True},
     "models.0.nodes: true is a boolean, not a whole number (YAML reads true/false, yes/no and on/off as booleans); "
     "write a whole number"),
    ("prod", {"plan__mfu": True}, "plan.mfu: true is a boolean, not a number"),
]


@pytest.mark.parametrize(("env", "changes", "message"), MUTATIONS, ids=[m[2][:48] for m in MUTATIONS])
def test_mutation_is_refused_naming_the_field(tmp_path, env, changes, message):
    path = write_env(tmp_path, env, **changes)
    with pytest.raises(SettingsError) as caught:
        load_settings(env, config_dir=tmp_path)
    assert str(path) in str(caught.value)
    assert message in str(caught.value)


@pytest.mark.parametrize(("env", "changes"), [
    ("prod", {"network__ssh_allowed_cidrs": ["10.0.0.0/8"]}),  # a private range over the VPN
    ("prod", {"network__ssh_allowed_cidrs": ["203.0.113.0/24"]}),  # an office's egress
    ("prod", {"gpu_queue__gpus_per_instance": 8}),  # the instance type's own count, written out
    ("dev", {"models": []}),  # nothing reserved, nothing static: no model, no cost
    ("dev", {"storage__logs__mount_dir": "/mnt/logs"}),
    ("prod", {"network__vpc_cidr": "172.16.0.0/16"}),  # every RFC 1918 range
    ("prod", {"network__vpc_cidr": "192.168.0.0/20"}),
    ("prod", {"tags__cost-center": "Ünïcode 42 _.:/=+-@", "tags__empty": ""}),  # AWS's characters, an empty value
    ("prod", {"tags__" + "k" * 128: "v" * 256}),  # the longest key and value
    ("prod", {"availability_zone": "ap-southeast-3c"}),
    ("prod", {"containers": True}),  # a boolean where one belongs
])
def test_sane_values_still_load(tmp_path, env, changes):
    write_env(tmp_path, env, **changes)
    load_settings(env, config_dir=tmp_path)


# Every count and amount of the settings, each refusing a boolean by its own name.
NUMBERS = ["models__0__nodes", "models__0__seq_len", "models__0__global_batch_size", "models__0__steps",
           "gpu_queue__min_count", "gpu_queue__max_count", "gpu_queue__spare_nodes", "gpu_queue__capacity_end_lead_min",
           "gpu_queue__capacity_reservations__0__instance_count", "gpu_queue__price_per_instance_hour_usd",
           "gpu_queue__root_volume__size_gib", "gpu_queue__root_volume__iops", "gpu_queue__root_volume__throughput_mib_s",
           "cpu_queue__min_count", "cpu_queue__max_count", "head_node__root_volume_gib", "head_node__bootstrap_timeout_s",
           "compute_bootstrap_timeout_s", "storage__data__storage_capacity_gib", "storage__data__throughput_per_tib",
           "storage__data_read_mb_s_per_gpu", "plan__mfu", "plan__deadline_days", "plan__vocab_size",
           "plan__memory_headroom", "plan__gpu_memory_gib", "plan__gpu_peak_tflops", "goodput__failures_per_1000_node_days",
           "goodput__recovery_s", "goodput__node_replacement_min", "goodput__stragglers_per_1000_node_days",
           "goodput__straggler_slowdown", "goodput__straggler_unattended_h", "goodput__min_ettr", "alerts__stall_floor_s"]


@pytest.mark.parametrize("key", NUMBERS)
@pytest.mark.parametrize("boolean", [True, False])
def test_a_boolean_is_no_number(tmp_path, key, boolean):
    write_env(tmp_path, "prod", **{key: boolean})
    with pytest.raises(SettingsError) as caught:
        load_settings("prod", config_dir=tmp_path)
    field = key.replace("__", ".")
    assert f"{field}: {str(boolean).lower()} is a boolean, not a" in str(caught.value)


NOW = datetime(2026, 11, 28, tzinfo=timezone.utc)


@pytest.mark.parametrize(("changes", "message"), [
    ({"gpu_queue__capacity_reservations__1__end": "2026-11-27T11:30:00Z", "goodput__training_start": "2026-11-20T00:00:00Z"},
     "gpu_queue.capacity_reservations.1.end: 2026-11-27T11:30:00+00:00 has passed (it is now 2026-11-28T00:00+00:00), and "
     "no node starts in an ended Capacity Block; set the end of cr-0123456789abcdef1 (aws ec2 "
     "describe-capacity-reservations --capacity-reservation-ids cr-0123456789abcdef1 shows it as EndDate), or, to "
     "destroy the environment after the block, remove end"),
    ({"goodput__training_start": "2020-01-04T13:30:00Z"},
     "goodput.training_start: 2020-01-04T13:30:00+00:00 has passed (it is now 2026-11-28T00:00+00:00), and the plan "
     "counts the models' days from it to check them against the Capacity Blocks' end; set when the models' jobs will "
     "start, or remove training_start once they have started"),
])
def test_dates_already_past_are_refused(tmp_path, changes, message):
    path = write_env(tmp_path, "prod", **OWN_BLOCKS, **changes)
    with pytest.raises(SettingsError) as caught:
        load_settings("prod", config_dir=tmp_path, now=NOW)
    assert str(path) in str(caught.value)
    assert message in str(caught.value)


def test_dates_ahead_load_and_the_shipped_examples_never_expire(tmp_path):
    write_env(tmp_path, "prod", **OWN_BLOCKS)
    assert load_settings("prod", config_dir=tmp_path, now=NOW).goodput.training_start > NOW
    # The shipped prod.yaml's blocks and account are examples, refused by deploy-check: their dates are
    # illustrations, and the file keeps loading after them.
    later = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert load_settings("prod", now=later).gpu_queue.capacity_end < later
    with pytest.raises(SettingsError, match="gpu_queue.capacity_reservations.0.end: 2027-01-18T11:30:00"):
        load_settings("prod", config_dir=tmp_path, now=later)


def test_every_region_with_offerings_data_has_its_zones():
    assert [region for region in known_regions() if not zones(region)] == []
    assert zones("ap-southeast-3") == ["ap-southeast-3a", "ap-southeast-3b", "ap-southeast-3c"]
    assert "us-west-1c" in zones("us-west-1")  # some accounts' second zone there, not moto's account's


def test_an_unknown_gpu_instance_type_needs_its_gpu_count(tmp_path):
    write_env(tmp_path, "dev", gpu_queue__instance_type="g6.12xlarge")
    with pytest.raises(SettingsError, match="gpu_queue.gpus_per_instance: required; add it"):
        load_settings("dev", config_dir=tmp_path)
    write_env(tmp_path, "dev", gpu_queue__instance_type="g6.12xlarge", gpu_queue__gpus_per_instance=4)
    assert load_settings("dev", config_dir=tmp_path).gpu_queue.gpus_per_instance == 4


def test_plan_exits_non_zero_when_it_prints_an_error(tmp_path, monkeypatch, capsys):
    # Failures outpacing progress (every node failing daily, each failure waiting for a replacement): the plan used
    # to raise OverflowError here.
    write_env(tmp_path, "prod", goodput__failures_per_1000_node_days=1000, models__6__min_nodes="DELETE")
    monkeypatch.setattr(cli, "load_settings", lambda env: load_settings(env, config_dir=tmp_path))
    assert cli.main(["plan", "--env", "prod"]) == 1
    out, err = capsys.readouterr()
    assert "ERROR: model7: failures outpace progress" in out
    assert "error: the prod plan cannot run (1 ERROR line(s) above)" in err
    monkeypatch.setattr(cli, "load_settings", load_settings)
    assert cli.main(["plan", "--env", "prod"]) == 0


def test_poisson_tails_neither_hang_nor_overflow():
    start = time.monotonic()
    assert poisson_quantile(50, 0.95) == 62  # the exact sum
    assert poisson_quantile(2000, 0.95) == 2074  # the normal approximation, equal to the sum here
    assert poisson_quantile(1e15, 0.95) == pytest.approx(1e15 + 1.645 * math.sqrt(1e15), rel=1e-9)
    assert p_no_spare(1e6, 5) == 1.0
    assert time.monotonic() - start < 1
