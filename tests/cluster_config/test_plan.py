"""The multi-model plan: settings refuse plans that do not fit; the report adds up."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from cluster_config.plan import build_plan, format_plan
from cluster_config.settings import CONFIG_DIR, SettingsError, load_settings


def prod_raw() -> dict:
    return yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())


def test_prod_plan_is_seven_models_on_80_nodes_at_2768_per_hour():
    plan = build_plan(load_settings("prod"))
    assert [row.nodes for row in plan.rows] == [11] * 6 + [14]
    assert (plan.nodes, plan.gpus) == (80, 640)
    assert plan.cost_per_hour_usd == pytest.approx(2768.0)
    assert plan.reserved == 80


def test_prod_as_shipped_has_enough_data_throughput():
    plan = build_plan(load_settings("prod"))
    assert plan.data_demand_mb_s == pytest.approx(640 * 2)
    assert not plan.storage_under_provisioned
    assert "WARNING" not in format_plan(plan)


def test_a_read_heavy_plan_warns_that_the_data_file_system_is_under_provisioned(write_env, tmp_path):
    raw = prod_raw()
    raw["storage"]["data_read_mb_s_per_gpu"] = 20
    plan = build_plan(load_settings("prod", write_env(tmp_path, "prod", storage=raw["storage"])))
    # 640 GPUs x 20 MB/s = 12,800 MB/s against 7.03 TiB x 1,000 MB/s/TiB = 7,031 MB/s.
    assert plan.data_demand_mb_s == pytest.approx(12800)
    assert plan.data_throughput_mb_s == pytest.approx(7031.25)
    assert plan.storage_under_provisioned
    assert "WARNING: the data file system is under-provisioned" in format_plan(plan)


def test_enough_throughput_gives_no_warning(write_env, tmp_path):
    raw = prod_raw()
    raw["storage"]["data_read_mb_s_per_gpu"] = 20
    raw["storage"]["data"]["storage_capacity_gib"] = 14400  # 14,062 MB/s at 1,000 MB/s/TiB
    settings = load_settings("prod", write_env(tmp_path, "prod", storage=raw["storage"]))
    text = format_plan(build_plan(settings))
    assert "WARNING" not in text
    assert "14,062 MB/s: 1.10x" in text


def test_plan_above_max_count_fails_naming_the_fix(write_env, tmp_path):
    raw = prod_raw()
    raw["models"][6]["nodes"] = 15  # 81 nodes on a queue of 80
    with pytest.raises(SettingsError, match="the plan needs 81 nodes but gpu_queue.max_count is 80"):
        load_settings("prod", write_env(tmp_path, "prod", models=raw["models"]))


def test_plan_above_the_capacity_reservation_fails(write_env, tmp_path):
    raw = prod_raw()
    raw["gpu_queue"]["capacity_reservation"]["instance_count"] = 72
    with pytest.raises(SettingsError, match="max_count 80 is above the capacity reservation's instance_count 72"):
        load_settings("prod", write_env(tmp_path, "prod", gpu_queue=raw["gpu_queue"]))


def test_cli_plan_prints_the_table():
    out = subprocess.run(
        [sys.executable, "-m", "cluster_config", "plan", "--env", "prod"], capture_output=True, text=True, check=True
    ).stdout
    assert "Plan for prod: 80 x p5e.48xlarge of max 80, reservation 80" in out
    assert "model7     llama2-70b      14   112     484.40" in out
    assert "total                      80   640   2,768.00" in out


def test_cli_fsx_expected_prints_provisioned_throughput_per_mount():
    out = subprocess.run([sys.executable, "-m", "cluster_config", "fsx-expected", "--env", "prod"],
                         capture_output=True, text=True, check=True).stdout
    # 7,200 GiB x 1,000 MB/s/TiB and 4,800 GiB x 500 MB/s/TiB
    assert out.strip() == "/fsx/data=7031.2,/fsx/checkpoints=7031.2,/fsx/logs=2343.8"
