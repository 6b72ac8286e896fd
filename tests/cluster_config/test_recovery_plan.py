"""The plan side of recovery inside the job: each model's snapshot interval in its training config, the host
memory its snapshots take, and what a failure costs with and without a free hot spare, at 1x and 6x the
failure rate."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import yaml

from cluster_config.goodput import Goodput, p_no_hot_spare, p_no_spare
from cluster_config.model_configs import model_config, training_config
from cluster_config.model_jobs import TIME_LIMIT, job_files
from cluster_config.plan import PlanError, build_plan, check_plan
from cluster_config.settings import CONFIG_DIR, SettingsError, load_settings
from stacks.app import settings_for


@pytest.fixture(scope="module")
def prod_plan():
    return build_plan(load_settings("prod"))


def row_of(plan, name):
    return next(row for row in plan.rows if row.name == name)


def with_model_changes(tmp_path, write_env, name, **changes):
    models = yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())["models"]
    next(m for m in models if m["name"] == name).update(changes)
    return write_env(tmp_path, "prod", models=models)


# --- the snapshot interval -----------------------------------------------------------------------

def test_every_model_snapshots_at_most_five_minutes_of_training_apart(prod_plan):
    minutes = load_settings("prod").goodput.snapshot_minutes
    assert minutes <= 5
    for row in prod_plan.rows:
        assert row.snapshot_every >= 1
        assert row.snapshot_every * row.step_s <= minutes * 60  # no more than goodput.snapshot_minutes between two
        assert (row.snapshot_every + 1) * row.step_s > minutes * 60  # and not needlessly more often
    model7 = row_of(prod_plan, "model7")  # ~23.6 s a step: 10 steps in 4 minutes
    assert model7.snapshot_every == 10 and 3.5 < model7.snapshot_interval_s / 60 <= 4


def test_the_rendered_training_config_carries_the_snapshot_interval_and_the_trainer_accepts_it():
    settings = load_settings("prod")
    plan = build_plan(settings)
    for model in settings.models:
        rendered = yaml.safe_load(job_files(settings)[f"models/{model.name}.yaml"])
        every = rendered["checkpoint"]["snapshot_every"]
        assert every == row_of(plan, model.name).snapshot_every
        assert model_config(settings, model).checkpoint.snapshot_every == every  # the trainer's own config model


def test_a_shorter_snapshot_budget_snapshots_more_often(tmp_path, write_env):
    settings = load_settings("prod", write_env(tmp_path, "prod", goodput__snapshot_minutes=1))
    row = row_of(build_plan(settings), "model7")
    assert row.snapshot_every == math.floor(60 / row.step_s) == 2


def test_an_override_keeps_the_entrys_snapshot_interval_and_zero_turns_snapshots_off(tmp_path, write_env):
    settings = load_settings("prod", with_model_changes(tmp_path, write_env, "model7",
                                                        overrides={"checkpoint.snapshot_every": 0}))
    model7 = settings.models[6]
    assert training_config(settings, model7)["checkpoint"]["snapshot_every"] == 0
    row = row_of(build_plan(settings), "model7")
    assert row.snapshot_every == 0 and row.host_memory["own"] == row.host_memory["buddy"] == 0
    # No snapshots: a hot spare is never used; going on with fewer nodes redoes the work since the last checkpoint.
    good = row.goodput
    assert good.p_no_hot_spare == 1 and good.lost_per_failure_s == good.fewer_lost_s
    assert good.fewer_lost_s == pytest.approx(good.detection_s + good.relaunch_s + good.transfer_s + good.rework_s
                                              + 2 / 34 * good.replacement_s + good.grow_back_s)


# --- host memory ---------------------------------------------------------------------------------

def test_model7_needs_about_24_gb_for_its_snapshot_and_24_for_its_buddys_per_node(prod_plan):
    model7 = row_of(prod_plan, "model7")
    # 69B parameters x (4 bytes fp32 master + 8 bytes of AdamW moments) over its 34 nodes (FSDP x TP 8)
    assert model7.snapshot_bytes_per_node == pytest.approx(model7.checkpoint_bytes / 34)
    assert 23e9 < model7.snapshot_bytes_per_node < 25e9
    memory = model7.host_memory
    assert memory["own"] == memory["buddy"] == memory["staging"]  # the async save's pinned copy of the same shards
    # 8 ranks x 4 workers (llama2-70b recipe's data.num_workers) x 259 MB, plus the pinned batches
    assert memory["loaders"] == pytest.approx(8 * 4 * 259e6 / 2**30, rel=0.01)
    assert memory["previous"] == 2 * memory["own"]  # kept until every rank holds the new snapshot
    assert memory["total"] == pytest.approx(sum(memory[k] for k in ("own", "buddy", "previous", "staging", "loaders")))
    assert prod_plan.host_memory_gib == 2048 and prod_plan.host_usable_gib == pytest.approx(2048 * 0.9)


def test_hsdp_models_snapshot_a_whole_replica_per_node(prod_plan):
    model1 = row_of(prod_plan, "model1")  # llama2-7b, HSDP sharded over one node's 8 GPUs
    assert model1.snapshot_bytes_per_node == pytest.approx(model1.checkpoint_bytes)
    assert all(row.host_memory["total"] < prod_plan.host_usable_gib for row in prod_plan.rows)


def test_prod_plan_prints_the_snapshots_and_the_host_memory():
    out = subprocess.run([sys.executable, "-m", "cluster_config", "plan", "--env", "prod"],
                         capture_output=True, text=True, check=True).stdout
    assert "host memory per node, GiB, usable 1,843 of 2,048:" in out
    line = next(line.split() for line in out.splitlines() if line.split()[:2] == ["model7", "10"])
    assert line[3:5] == ["22.7", "22.7"]  # own and buddy, GiB (24.4 GB)


def test_snapshots_that_do_not_fit_in_host_memory_stop_synth_naming_the_field_and_the_fix(tmp_path, write_env):
    write_env(tmp_path, "prod", plan={"host_memory_gib": 64})
    with pytest.raises(PlanError) as caught:
        settings_for("prod", tmp_path)  # what synth loads
    message = str(caught.value)
    assert ("model7: host memory per node: its snapshot 23 GiB + its buddy's 23 GiB + the previous two while a snapshot is "
            "written 45 GiB + pinned staging 23 GiB") in message
    assert "more than the 58 GiB usable of a p5e.48xlarge's 64 GiB (less plan.host_memory_headroom 10%)" in message
    assert "in cluster_config/prod.yaml models: model7: give it more nodes" in message
    assert "set checkpoint.snapshot_every: 0 in its overrides" in message
    assert "set checkpoint.async_save: false in its overrides" in message


def test_ddp_is_told_to_shard_when_its_snapshots_do_not_fit(tmp_path, write_env):
    settings = load_settings("prod", write_env(tmp_path, "prod", plan={"host_memory_gib": 512}))
    settings = settings.model_copy(update={"models": [settings.models[0].model_copy(update={
        "overrides": {"train.parallelism": "ddp"}})]})
    errors = [e for e in build_plan(settings).errors if "host memory per node" in e]
    assert len(errors) == 1 and "use train.parallelism: fsdp (DDP keeps the whole state on every rank)" in errors[0]


@pytest.mark.parametrize(("plan", "message"), [
    ({"host_memory_headroom": 1}, "plan.host_memory_headroom"),
    ({"host_memory_gib": 0}, "plan.host_memory_gib"),
])
def test_bad_host_memory_settings_are_refused(tmp_path, write_env, plan, message):
    with pytest.raises(SettingsError, match=message.replace(".", r"\.")):
        load_settings("prod", write_env(tmp_path, "prod", plan=plan))


# --- a failure's cost ----------------------------------------------------------------------------

def hand_case(**changes) -> Goodput:
    """The requeue path of tests/cluster_config/test_goodput.py (3,400 s a failure) and the recovery inside the
    job: 30 s detection, 60 s relaunch, 2 s transfer, snapshots 240 s apart (120 s redone)."""
    inputs = dict(name="m", nodes=10, gpus=80, cost_per_hour_usd=346.0, failure_free_days=10.0,
                  failures_per_day=0.038, checkpoint_interval_s=3600.0, save_s=100.0, recovery_s=600.0,
                  replacement_s=1500.0, p_no_spare=1.0, snapshot_interval_s=240.0, hot_spares=1, detection_s=30.0,
                  relaunch_s=60.0, transfer_s=2.0, p_no_hot_spare=0.1)
    return Goodput(**{**inputs, **changes})


def test_a_failure_costs_the_in_job_recovery_or_the_requeue_by_hand():
    g = hand_case()
    assert g.in_job_lost_s == 30 + 60 + 2 + 120
    assert g.requeue_lost_s == 600 + 1800 + 100 + 900
    assert g.lost_per_failure_s == pytest.approx(0.9 * 212 + 0.1 * 3400)  # 530.8 s
    assert g.ettr == pytest.approx(1 - 0.038 * g.lost_per_failure_s / 86400)
    assert hand_case(p_no_hot_spare=1.0).lost_per_failure_s == 3400  # no spare free: today's path
    assert hand_case(p_no_hot_spare=0.0).lost_per_failure_s == 212


def test_probability_that_every_hot_spare_is_used_by_hand():
    # Spares used at u a day, back every T days; X = u T. One spare: 1 - (1 - e^-X) / X.
    assert p_no_hot_spare(0.5, 1, 1.0) == pytest.approx(1 - (1 - math.exp(-0.5)) / 0.5)  # 0.213
    # Two: 1 - (P(Poisson(X) >= 1) + P(Poisson(X) >= 2)) / X
    x = 0.8
    assert p_no_hot_spare(0.8, 2, 1.0) == pytest.approx(1 - ((1 - math.exp(-x)) + (1 - math.exp(-x) * (1 + x))) / x)
    # Small X: about X^H / (H + 1)!: the failure must come after H uses in its job
    assert p_no_hot_spare(0.001, 1, 1.0) == pytest.approx(0.001 / 2, rel=0.01)
    assert p_no_hot_spare(0.01, 2, 1.0) == pytest.approx(0.01**2 / 6, rel=0.02)
    assert p_no_hot_spare(1.0, 0, 1.0) == 1 and p_no_hot_spare(0.0, 1, 1.0) == 0
    assert p_no_hot_spare(0.5, 1, 1.0) == pytest.approx(1 - sum(p_no_spare(0.5, k) for k in (1,)) / 0.5)
    # More spares, or a quicker return, leave fewer failures without one.
    assert p_no_hot_spare(2.0, 3, 1.0) < p_no_hot_spare(2.0, 2, 1.0) < p_no_hot_spare(2.0, 1, 1.0)
    assert p_no_hot_spare(2.0, 1, 0.5) < p_no_hot_spare(2.0, 1, 1.0)


def test_the_refill_time_is_the_jobs_time_limit():
    hours, minutes, seconds = map(int, TIME_LIMIT.split(":"))
    assert load_settings("prod").goodput.hot_spare_refill_h == hours + minutes / 60 + seconds / 3600


def test_prod_model7_with_and_without_a_hot_spare_by_hand(prod_plan):
    settings = load_settings("prod")
    model7 = row_of(prod_plan, "model7")
    g = model7.goodput
    assert g.hot_spares == 0 and g.p_no_hot_spare == 1  # prod holds none: every failure requeues
    assert g.in_job_lost_s == pytest.approx(settings.goodput.detection_s + 60
                                            + model7.snapshot_bytes_per_node / (400e9 * 0.8)
                                            + model7.snapshot_interval_s / 2)
    assert g.in_job_lost_s < 5 * 60  # what a free hot spare would make of a failure
    two = next(t for t in model7.trades if t.spares == 2 and t.failure_factor == 1)
    # 34 + 2 nodes at 3.8 per 1,000 node-days, back every 24 h: X = 0.137
    x = 3.8 / 1000 * 36
    assert two.with_spares.p_no_hot_spare == pytest.approx(1 - (p_no_spare(x, 1) + p_no_spare(x, 2)) / x)
    assert two.with_spares.lost_per_failure_s / 60 < 5
    assert two.idle_gpu_hours == pytest.approx(2 * 8 * two.with_spares.days * 24)
    assert two.saved_gpu_hours == pytest.approx(g.lost_gpu_hours - two.with_spares.lost_gpu_hours)
    stressed = model7.stress
    assert stressed.failures_per_day == pytest.approx(6 * g.failures_per_day)
    assert stressed.expected_failures > 5 * g.expected_failures
    assert settings.goodput.stress_factor == 6


def test_prods_settings_follow_the_hot_spare_trade(prod_plan):
    """A hot spare held for the whole run keeps more GPU-hours idle than the failures it saves cost, for every
    model at 1x and at 6x the failure rate: prod holds none."""
    for row in prod_plan.rows:
        assert all(not trade.pays for trade in row.trades), row.name
        assert row.hot_spares == 0


def test_prod_plan_prints_minutes_per_failure_ettr_and_p95_at_1x_and_6x():
    out = subprocess.run([sys.executable, "-m", "cluster_config", "plan", "--env", "prod"],
                         capture_output=True, text=True, check=True).stdout
    assert "at 1x and 6x the failure rate (goodput.stress_factor): minutes lost per failure, ETTR" in out
    assert "hot spares (models.<m>.hot_spares), 1/2/3 of them against none" in out
    assert "at 6x the failure rate the last 95th-percentile finish (model7" in out
    header = next(line for line in out.splitlines() if "min/fail" in line and "requeue min" in line)
    assert header.split()[:5] == ["model", "hot", "fails", "ckpt", "h"]


# --- hot spares in the settings -------------------------------------------------------------------

def test_hot_spares_count_against_the_gpu_queue(tmp_path, write_env):
    with pytest.raises(SettingsError, match=r"models: the plan needs 80 nodes and 1 hot spares \(models' hot_spares\) "
                                            r"but gpu_queue.max_count is 80; give fewer nodes to some models, lower "
                                            r"some models' hot_spares or raise max_count"):
        load_settings("prod", with_model_changes(tmp_path, write_env, "model7", hot_spares=1))


def test_a_hot_spare_makes_a_failure_cost_minutes(tmp_path, write_env):
    models = yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())["models"]
    models[4].update(nodes=11, global_batch_size=1144, steps=72504)  # model5 gives up a node (plan --spares 1)
    models[6]["hot_spares"] = 1
    settings = load_settings("prod", write_env(tmp_path, "prod", models=models))
    model7 = row_of(build_plan(settings), "model7").goodput
    assert model7.hot_spares == 1 and 0 < model7.p_no_hot_spare < 0.1
    assert model7.lost_per_failure_s < 10 * 60 < model7.requeue_lost_s


def test_negative_hot_spares_are_refused(tmp_path, write_env):
    with pytest.raises(SettingsError, match="hot_spares"):
        load_settings("prod", with_model_changes(tmp_path, write_env, "model1", hot_spares=-1))


# --- going on with fewer nodes ---------------------------------------------------------------------

def test_with_no_spare_each_model_goes_on_with_the_most_nodes_its_global_batch_divides_on(prod_plan):
    fewer = {row.name: (row.fewer_nodes, row.nodes) for row in prod_plan.rows}
    # HSDP shards of 8 GPUs, micro-batch 2 (1) over 8 GPUs a node: 1024 = 2 x 16 x 32 on 2 of model1's 4 nodes;
    # 1120 = 2 x 40 x 14 on 5 of 7; 1152 = 1 x 72 x 16 on 9 of 12; model7 (tensor parallel 8): 1088 = 2 x 32 x 17
    assert fewer == {"model1": (2, 4), "model2": (2, 4), "model3": (5, 7), "model4": (5, 7), "model5": (9, 12),
                     "model6": (9, 12), "model7": (32, 34)}
    for row in prod_plan.rows:
        assert row.goodput.lost_per_failure_s == row.goodput.fewer_lost_s < row.goodput.requeue_lost_s / 2 + 60
    job = job_files(load_settings("prod"))["train_model7.sh"]
    assert 'export MIN_TRAIN_NODES="${MIN_TRAIN_NODES:-32}"' in job


def test_a_min_nodes_not_below_the_models_nodes_is_refused(tmp_path, write_env):
    with pytest.raises(SettingsError, match=r"model7: min_nodes 34 must be below its nodes \(34\)"):
        load_settings("prod", with_model_changes(tmp_path, write_env, "model7", min_nodes=34))


def test_a_min_nodes_its_batch_divides_on_none_of_is_flagged(tmp_path, write_env):
    plan = build_plan(load_settings("prod", with_model_changes(tmp_path, write_env, "model7", min_nodes=33)))
    assert row_of(plan, "model7").fewer_nodes == 0  # 1088 sequences do not divide over 33 nodes
    assert any(w.startswith("model7: min_nodes 33") and "lower min_nodes to 32" in w for w in plan.warnings)
