"""Every setting fails when the settings load, or not at all: mutations of the shipped prod.yaml and
dev.yaml that used to pass, or to fail only at deploy, cluster creation or job start, are refused with
a message naming the field and the fix."""

from __future__ import annotations

import math
import time

import pytest

from cluster_config import __main__ as cli
from cluster_config.goodput import p_no_spare, poisson_quantile
from cluster_config.settings import SettingsError, load_settings
from tests.settings_files import write_env

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
])
def test_sane_values_still_load(tmp_path, env, changes):
    write_env(tmp_path, env, **changes)
    load_settings(env, config_dir=tmp_path)


def test_an_unknown_gpu_instance_type_needs_its_gpu_count(tmp_path):
    write_env(tmp_path, "dev", gpu_queue__instance_type="g6.12xlarge")
    with pytest.raises(SettingsError, match="gpu_queue.gpus_per_instance: required; add it"):
        load_settings("dev", config_dir=tmp_path)
    write_env(tmp_path, "dev", gpu_queue__instance_type="g6.12xlarge", gpu_queue__gpus_per_instance=4)
    assert load_settings("dev", config_dir=tmp_path).gpu_queue.gpus_per_instance == 4


def test_plan_exits_non_zero_when_it_prints_an_error(tmp_path, monkeypatch, capsys):
    # Failures outpacing progress (every node failing daily): the plan used to raise OverflowError here.
    write_env(tmp_path, "prod", goodput__failures_per_1000_node_days=1000)
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
