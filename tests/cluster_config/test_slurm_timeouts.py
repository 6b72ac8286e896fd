"""KillWait through CustomSlurmSettings and the USR1 lead: sized for every planned model saving at once,
accepted by ParallelCluster."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from cluster_config.pcluster_schema import DEFAULT_TARGET
from cluster_config.render import ClusterResources, render_cluster_config
from cluster_config.settings import CONFIG_DIR, load_settings
from cluster_config.slurm_timeouts import kill_wait_seconds, save_seconds, usr1_lead_seconds
from training.models.llama import count_parameters, hf_config
from training.models.presets import resolve


def test_prod_kill_wait_and_usr1_lead_hold_two_saves_of_all_seven_models_at_once_and_a_step():
    settings = load_settings("prod")
    # Two 7B, two 13B, two 18.4B and the 70B, x 12 bytes, over 7200 GiB x 1000 MB/s/TiB of checkpoint FSx:
    # at a Capacity Block's end every job's limit ends at the same moment, so all save together.
    params = sum(count_parameters(hf_config(m.preset, settings.plan.vocab_size, 4096))[0] for m in settings.models)
    one_round = params * 12 / (7200 / 1024 * 1000 * 1e6)
    assert save_seconds(settings) == pytest.approx(one_round)
    assert one_round == pytest.approx(248.3, abs=0.5)  # the 70B alone: 117.7 s
    assert kill_wait_seconds(settings) == usr1_lead_seconds(settings) == 660 >= 2 * one_round + 120


def test_dev_keeps_the_ten_minute_usr1_lead():
    assert usr1_lead_seconds(load_settings("dev")) == 600


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


def test_a_save_counts_the_vocabulary_an_architectures_config_json_fixes(tmp_path, write_env):
    """model1 on Llama 3.1 8B: its checkpoint holds 128,256-token embeddings, not plan.vocab_size's 32,000."""
    models = yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())["models"]
    models[0]["preset"] = "llama3.1-8b"
    settings = load_settings("prod", write_env(tmp_path, "prod", models=models))
    grown = 12 * (resolve("llama3.1-8b").parameters(128256) - resolve("llama2-7b").parameters(32000))
    assert save_seconds(settings) - save_seconds(load_settings("prod")) == pytest.approx(
        grown / (settings.storage.checkpoints.throughput_mb_s * 1e6))
