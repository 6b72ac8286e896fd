"""KillWait through CustomSlurmSettings: sized for the largest planned model's save, accepted by ParallelCluster."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cluster_config.pcluster_schema import DEFAULT_TARGET
from cluster_config.render import ClusterResources, render_cluster_config
from cluster_config.settings import load_settings
from cluster_config.slurm_timeouts import kill_wait_seconds, save_seconds


def test_prod_kill_wait_holds_two_saves_of_the_70b_model_and_a_step():
    settings = load_settings("prod")
    # 68.98e9 parameters x 12 bytes over 7200 GiB x 1000 MB/s/TiB of checkpoint FSx.
    one_save = 68_976_648_192 * 12 / (7200 / 1024 * 1000 * 1e6)
    assert save_seconds(settings) == pytest.approx(one_save)
    assert one_save == pytest.approx(117.7, abs=0.1)
    assert kill_wait_seconds(settings) == 360 >= 2 * one_save + 60


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_rendered_config_carries_kill_wait_and_parallelcluster_allows_the_keys(env):
    settings = load_settings(env)
    slurm = render_cluster_config(settings, ClusterResources.placeholders(settings))["Scheduling"]["SlurmSettings"]
    custom = {k: v for item in slurm["CustomSlurmSettings"] for k, v in item.items()}
    # (and the per-model QOS enforcement the accounting database makes possible: render.py)
    assert custom == {"KillWait": kill_wait_seconds(settings), "UnkillableStepTimeout": 180,
                      "AccountingStorageEnforce": "associations,limits,qos"}
    assert custom["KillWait"] >= 120 > 30  # Slurm's default of 30 s fits no save
    # ParallelCluster refuses some slurm.conf keys (it owns Prolog, Epilog, ...): ours are not among them.
    denied = subprocess.run(
        [sys.executable, "-c", "import json; from pcluster.validators.slurm_settings_validator import "
         "SLURM_SETTINGS_DENY_LIST as d; print(json.dumps(d['SlurmConf']))"],
        env={"PYTHONPATH": str(DEFAULT_TARGET)}, capture_output=True, text=True, check=True)
    deny = {key for keys in json.loads(denied.stdout).values() for key in keys}
    assert "prolog" in deny and not {k.lower() for k in custom} & deny
