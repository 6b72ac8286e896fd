"""Goodput: failures, what each costs, ETTR, spares and the Capacity Blocks' end, checked by hand."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster_config.goodput import (CONTROLLER_PARAMETERS_SETTABLE, Goodput, Stragglers, expedited_requeue, goodput,
                                    p_no_spare, poisson_quantile, young_interval_s)
from cluster_config.model_jobs import job_files
from cluster_config.pcluster_schema import DEFAULT_TARGET
from cluster_config.render import PCLUSTER_VERSION
from cluster_config.plan import build_plan, spares_alternative
from cluster_config.settings import SettingsError, load_settings

REPO = Path(__file__).resolve().parents[2]


def hand_case(**changes) -> Goodput:
    """10 nodes at 3.8 failures per 1,000 node-days, 10 days without failures, hourly saves of 100 s,
    600 s to recover, 25 min to replace a node and no spare."""
    inputs = dict(name="m", nodes=10, gpus=80, cost_per_hour_usd=346.0, failure_free_days=10.0,
                  failures_per_day=0.038, checkpoint_interval_s=3600.0, save_s=100.0, recovery_s=600.0,
                  replacement_s=1500.0, p_no_spare=1.0)
    return Goodput(**{**inputs, **changes})


def test_expected_failures_and_lost_time_by_hand():
    g = hand_case()
    # Each failure: 600 s recovery + 1,800 s (half an hour's interval) + 100 s (the save in flight) + 900 s
    # waiting: the replacement (1,500 s) runs while the job is found failed and requeued (600 s).
    assert g.replacement_wait_s == 900
    assert g.lost_per_failure_s == 3400
    assert g.ettr == pytest.approx(1 - 0.038 * 3400 / 86400)  # 99.85 %
    assert g.days == pytest.approx(10 / (1 - 0.038 * 3400 / 86400))  # 10.015
    assert g.expected_failures == pytest.approx(0.038 * g.days)  # 0.38
    assert g.expected_failures * g.lost_per_failure_s / 86400 == pytest.approx(g.days - 10)
    assert g.lost_gpu_hours == pytest.approx((g.days - 10) * 24 * 80)  # 33.8
    assert g.lost_usd == pytest.approx(g.lost_gpu_hours / 8 * 34.6)


def test_a_replacement_quicker_than_the_recovery_costs_nothing_more():
    # The node is back before the requeued job could start: only recovery and rework are lost.
    quick = hand_case(replacement_s=300.0)
    assert quick.replacement_wait_s == 0 and quick.lost_per_failure_s == 600 + 1800 + 100
    # With a spare free most of the time, only the rest waits for what the replacement has left.
    assert hand_case(p_no_spare=0.25).replacement_wait_s == pytest.approx(0.25 * 900)


def test_no_failures_lose_nothing_and_failures_faster_than_recovery_never_finish():
    assert hand_case(failures_per_day=0).days == 10 and hand_case(failures_per_day=0).lost_gpu_hours == 0
    hopeless = hand_case(failures_per_day=86400 / 3400)  # a failure every 3,400 s, each costing 3,400 s
    assert hopeless.ettr == 0 and hopeless.days == math.inf


def test_young_interval_by_hand():
    # sqrt(2 x 100 s / (1 per day = 1/86,400 per s)) = sqrt(17,280,000) s = 4,157 s
    assert young_interval_s(100, 1.0) == pytest.approx(4156.9, abs=0.1)
    # Four times the failure rate halves it; four times the save doubles it.
    assert young_interval_s(100, 4.0) == pytest.approx(young_interval_s(100, 1.0) / 2)
    assert young_interval_s(400, 1.0) == pytest.approx(2 * young_interval_s(100, 1.0))
    assert young_interval_s(100, 0) == math.inf


def test_prod_model7_by_hand():
    settings = load_settings("prod")
    row = next(r for r in build_plan(settings).rows if r.name == "model7")
    g = goodput(row, settings)
    assert g == row.goodput
    assert g.failures_per_day == pytest.approx(3.8 / 1000 * 34)  # 0.129 per day
    assert g.save_s == pytest.approx(row.checkpoint_bytes / 7031.25e6)  # 0.83 TB at 7,031 MB/s: 118 s
    assert g.checkpoint_interval_s == 3600  # every_minutes: 60 comes before 500 steps of ~24 s
    # 3.49 h: sqrt(2 x 118 s / 0.129 per day)
    assert g.young_interval_s / 3600 == pytest.approx(math.sqrt(2 * g.save_s * 86400 / (0.0038 * 34)) / 3600)
    assert 3.4 < g.young_interval_s / 3600 < 3.6
    assert g.requeue_lost_s == pytest.approx(1800 + g.save_s + 25 * 60)  # the 600 s recovery within the 25 min
    # No hot spare: it goes on with 32 of its 34 nodes (1088 sequences: 32 x 8 GPUs / tensor parallel 8 x micro-batch
    # 2 x 17), 2/34 slower for the 25 min, then stops with its state in memory and requeues onto all 34 (the stop and
    # the requeue, the relaunch, the returning node's shards over EFA): no save, no 600 s restart.
    assert g.fewer_nodes == 32 and g.p_no_hot_spare == 1
    grow_back = settings.goodput.grow_back_requeue_s + 60 + g.transfer_s
    assert g.grow_back_s == pytest.approx(grow_back) and g.grow_back_s < g.save_s + 600
    assert g.lost_per_failure_s == pytest.approx(settings.goodput.detection_s + 60 + g.transfer_s
                                                 + g.snapshot_interval_s / 2 + 2 / 34 * 25 * 60 + grow_back)
    assert 8 < g.lost_per_failure_s / 60 < 12
    assert g.expected_failures == pytest.approx(0.0038 * 34 * g.days)
    assert 1.7 < g.expected_failures < 1.9 and 0.999 < g.ettr < 0.9995


def test_probability_of_no_free_spare_by_hand():
    # prod: 80 nodes at 3.8 per 1,000 node-days, replaced in 25 min: 0.00528 nodes down at once on average.
    a = 3.8 / 1000 * 80 * 25 / 1440
    assert build_plan(load_settings("prod")).mean_nodes_down == pytest.approx(a)
    assert p_no_spare(a, 0) == 1
    assert p_no_spare(a, 1) == pytest.approx(1 - math.exp(-a))  # 0.53 %
    assert p_no_spare(a, 2) == pytest.approx(1 - math.exp(-a) * (1 + a))  # 0.0014 %: about a^2 / 2
    assert p_no_spare(2.0, 3) == pytest.approx(1 - 5 * math.exp(-2))  # 1 - e^-2 (1 + 2 + 2^2/2) = 0.323


def test_poisson_quantile_by_hand():
    # mean 1: P(<= 2) = 0.920, P(<= 3) = 0.981
    assert poisson_quantile(1.0, 0.95) == 3
    assert poisson_quantile(0.0, 0.95) == 0
    assert poisson_quantile(1000.0, 0.95) == pytest.approx(1000 + 1.645 * math.sqrt(1000), abs=3)  # no underflow
    assert poisson_quantile(math.inf, 0.95) == math.inf


def test_spares_remove_the_wait_for_a_replacement_node():
    settings = load_settings("prod")  # without going on with fewer nodes: every failure waits for a replacement
    settings = settings.model_copy(update={"models": [m.model_copy(update={"min_nodes": None}) for m in settings.models]})
    with_spares = spares_alternative(settings, 2)
    assert with_spares.gpu_queue.spare_nodes == 2
    assert sum(m.nodes for m in with_spares.models) == 78
    before, after = build_plan(settings), build_plan(with_spares)
    for a, b in zip(before.goodputs, after.goodputs):
        assert a.replacement_wait_s == 900  # 25 min, less the 600 s recovery it overlaps
        assert b.replacement_wait_s < 0.1  # 900 s x 0.0014 %
        assert b.lost_per_failure_s < a.lost_per_failure_s
        assert b.ettr > a.ettr
    assert after.ettr > before.ettr and after.lost_usd < before.lost_usd


def test_two_spares_come_from_the_models_with_room_keeping_their_tokens():
    settings = load_settings("prod")
    before, after = build_plan(settings), build_plan(spares_alternative(settings, 2))
    changed = {b.name: b for a, b in zip(before.rows, after.rows) if a.nodes != b.nodes}
    assert sorted(changed) == ["model5", "model6"]  # 12 -> 11 nodes; the others would finish after 14 days
    for row in changed.values():
        # HSDP on 88 GPUs at micro-batch 1: 1,152 sequences per step round down to 1,144 = 13 x 88.
        assert (row.nodes, row.global_batch_size, row.steps) == (11, 1144, 72504)
        assert row.global_batch_size * row.steps >= 1152 * 72000
    assert after.warnings == () and after.errors == ()
    assert all(g.days < 14 for g in after.goodputs)


def test_cli_plan_spares_prints_the_trade():
    out = subprocess.run([sys.executable, "-m", "cluster_config", "plan", "--env", "prod", "--spares", "2"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("Plan for prod: 78 x p5e.48xlarge (H200, 140 GiB) + 2 spare of max 80")
    assert "Spares for prod: 0 spares (the settings) vs 2 spares" in out
    assert "nodes: 11, global_batch_size: 1144, steps: 72504" in out
    assert "2 spares: failures cost" in out and "the spares stay out of training for" in out
    assert "WARNING" not in out


def test_cli_plan_refuses_more_spares_than_nodes():
    result = subprocess.run([sys.executable, "-m", "cluster_config", "plan", "--env", "prod", "--spares", "80"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--spares 80: choose 0 to 79" in result.stderr


def test_straggler_cost_unattended_and_evicted_by_hand():
    # 10 nodes at 1 slow node per 1,000 node-days for 10 days: 0.1 stragglers, each 10 % slow.
    s = Stragglers(name="m", gpus=80, days=10.0, per_day=0.01, slowdown=0.1, unattended_s=24 * 3600,
                   detect_s=600.0, evict_s=100 + 600 + 900)
    assert s.expected == pytest.approx(0.1)
    # Unattended: one arriving uniformly in the 240 h run stays 24 h unless the run ends first, 22.8 h on
    # average; at 1.1 x the step time that does 22.8 / 1.1 h of work. In 90 % of them the person acts in time:
    # a drain and requeue, which saves first (100 s), then recovery (600 s) and replacement wait (900 s).
    assert s.unattended_slow_s == pytest.approx(22.8 * 3600) and s.acted_on == pytest.approx(0.9)
    assert s.lost_h_unattended == pytest.approx(0.1 * (22.8 * 0.1 / 1.1 + 0.9 * 1600 / 3600))
    # Evicted: the window's 600 s of steps run 10 % slow (660 s, losing 60 s of work), then the same restart.
    assert s.detect_wall_s == pytest.approx(660)
    assert s.lost_h_evicted == pytest.approx(0.1 * (600 * 0.1 + 1600) / 3600)
    # A run shorter than its person's response time: half of it, on average, is slow, and nobody acts in time.
    short = Stragglers(**{**s.__dict__, "days": 0.5})
    assert short.acted_on == 0 and short.lost_h_unattended == pytest.approx(0.005 * 6 * 0.1 / 1.1)


def test_prod_plan_shows_what_stragglers_cost_with_and_without_eviction(tmp_path, write_env):
    plan = build_plan(load_settings("prod"))
    model7 = next(row for row in plan.rows if row.name == "model7")
    s, good = model7.stragglers, model7.goodput
    assert s.per_day == pytest.approx(34 / 1000) and s.days == good.days
    # Detection and false evictions: the seeded study's (cluster_config/straggler_study.json, which
    # tests/training/test_straggler_study.py holds to the study), for the rule it measured, prod's.
    study = json.loads((REPO / "cluster_config/straggler_study.json").read_text())
    p95, healthy = study["detection_intervals"]["at_margin"]["p95"], study["healthy"]
    assert s.measured and s.detect_intervals == p95 and s.detect_s == pytest.approx(p95 * 10 * model7.step_s)
    assert s.false_per_day == healthy["false_evictions"] / healthy["node_days"] * 34 == 0
    assert s.false_bound_per_day == pytest.approx(2.9957 / healthy["node_days"] * 34, rel=1e-3)  # 95 %: none seen
    assert s.evict_s == pytest.approx(good.save_s + good.recovery_s + good.replacement_wait_s)
    assert s.lost_h_evicted < s.lost_h_unattended / 3  # eviction is worth it at production sizes
    # The trainer weighs each eviction against that cost (train.straggler_evict_cost_s, from the plan).
    config = yaml.safe_load(job_files(load_settings("prod"))["models/model7.yaml"])
    assert config["train"]["straggler_evict_cost_s"] == round(s.evict_s)
    out = subprocess.run([sys.executable, "-m", "cluster_config", "plan", "--env", "prod"],
                         capture_output=True, text=True, check=True).stdout
    assert "stragglers (slow, not failed): 1 per 1,000 node-days, each making its model 10% slower" in out
    assert f"a node at the margin named in {p95:g} log intervals (95th percentile), 0 false eviction(s)" in out
    table = out.split("false-eviction bound GPU-h")[1].splitlines()[1:8]
    [row] = [line.split() for line in table if line.split()[:1] == ["model7"]]
    assert float(row[3]) == round(s.evict_s / 60, 1) and not row[2].endswith("*")
    none = build_plan(load_settings("prod", write_env(tmp_path, "prod", goodput__stragglers_per_1000_node_days=0)))
    assert all(row.stragglers.lost_h_unattended == row.stragglers.lost_h_evicted == 0 for row in none.rows)


def test_prod_plan_shows_goodput_and_fits_before_the_blocks_end():
    plan = build_plan(load_settings("prod"))
    assert plan.spare_nodes == 0 and plan.p_no_spare == 1
    assert plan.capacity_end.isoformat() == "2027-01-18T11:00:00+00:00"  # 30 minutes before the blocks' end
    assert plan.warnings == ()
    assert 3.5 < plan.expected_failures < 4.5 and 0.99 < plan.ettr < 1
    out = subprocess.run([sys.executable, "-m", "cluster_config", "plan", "--env", "prod"],
                         capture_output=True, text=True, check=True).stdout
    assert "goodput (cluster_config/goodput.py): 3.8 failures per 1,000 node-days" in out
    assert "0 spare nodes: a requeue finds none free 100% of the time" in out
    assert "AWS begins terminating the Capacity Blocks at 2027-01-18 11:00 UTC" in out


# --- flags ---------------------------------------------------------------------------------------

def test_a_low_ettr_is_flagged_with_its_causes(tmp_path, write_env):
    plan = build_plan(load_settings("prod", write_env(tmp_path, "prod", goodput__failures_per_1000_node_days=250)))
    low = [w for w in plan.warnings if "is below goodput.min_ettr 95%" in w]
    # Going on with fewer nodes: 1 - 0.25 x 34 x 0.16 h / 24 h = 94.3 % for model7 (32 of 34 nodes, under 10 min a
    # failure); model5's 12 nodes lose 0.25 x 12 x 0.24 h / 24 h = 3.0 %, and waiting would have cost them 0.92 h each
    assert [w.split(":")[0] for w in low] == ["model7"]
    assert "min to recover" in low[-1] and "waiting for a replacement node" in low[-1]
    assert re.search(r"going on with 32 nodes: (9|10)\.\d min", low[-1]), low[-1]
    assert "checkpoint.every_minutes" in low[-1] and "gpu_queue.spare_nodes" in low[-1]


def test_failures_alone_can_make_a_model_late(tmp_path, write_env):
    """model7's former 51,000 steps: 13.94 days without failures, after the 14-day deadline with them (each
    waiting for a replacement: no min_nodes)."""
    settings = load_settings("prod", write_env(tmp_path, "prod", models__6__steps=51000, models__6__min_nodes="DELETE",
                                               gpu_queue__capacity_reservations__0__end="DELETE",
                                               gpu_queue__capacity_reservations__1__end="DELETE"))
    late = [w for w in build_plan(settings).warnings if w.startswith("model7: finishes in")]
    assert len(late) == 1 and "(13.94 without failures)" in late[0] and "after plan.deadline_days 14" in late[0]


def test_a_finish_after_the_blocks_end_is_flagged(tmp_path, write_env):
    blocks = load_settings("prod").gpu_queue.capacity_reservations
    one_day_sooner = {f"gpu_queue__capacity_reservations__{i}__end": "2027-01-17T11:30:00Z" for i in range(len(blocks))}
    plan = build_plan(load_settings("prod", write_env(tmp_path, "prod", **one_day_sooner)))
    late = [w for w in plan.warnings if "when AWS begins terminating the Capacity Blocks' instances" in w]
    assert [w.split(":")[0] for w in late] == ["model7"]  # 13.85 days at the 95th percentile, 12.90 available
    assert "later than 2027-01-17 11:00 UTC" in late[0] and "or start earlier (goodput.training_start)" in late[0]


# --- settings ------------------------------------------------------------------------------------

def test_spares_that_do_not_fit_beside_the_models_are_refused(tmp_path, write_env):
    with pytest.raises(SettingsError, match=r"models: the plan needs 80 nodes and gpu_queue.spare_nodes keeps 2 out of "
                                            r"every share but gpu_queue.max_count is 80; give fewer nodes to some "
                                            r"models, lower spare_nodes or raise max_count"):
        load_settings("prod", write_env(tmp_path, "prod", gpu_queue__spare_nodes=2))


def test_a_start_after_the_blocks_end_is_refused(tmp_path, write_env):
    with pytest.raises(SettingsError, match=r"goodput.training_start 2027-01-18T11:15:00\+00:00 is not before "
                                            r"2027-01-18T11:00:00\+00:00, when AWS begins terminating"):
        load_settings("prod", write_env(tmp_path, "prod", goodput__training_start="2027-01-18T11:15:00Z"))


def test_dates_without_a_zone_and_an_odcr_end_are_refused(tmp_path, write_env):
    with pytest.raises(SettingsError, match=r"goodput.training_start: 2027-01-04T13:30:00 has no time zone; write it "
                                            r"in UTC with a Z, e.g. 2027-01-04T13:30:00Z"):
        load_settings("prod", write_env(tmp_path, "prod", goodput__training_start="2027-01-04T13:30:00"))
    odcr = [{"id": "cr-0a1b2c3d4e5f60718", "instance_count": 80, "end": "2027-01-18T11:30:00Z"}]
    with pytest.raises(SettingsError, match=r"end is set for cr-0a1b2c3d4e5f60718, an ODCR: its instances keep running"):
        load_settings("prod", write_env(tmp_path, "prod", gpu_queue__capacity_reservations=odcr, gpu_queue__min_count=0))


def test_the_requeue_is_expedited_only_where_slurm_has_it_and_parallelcluster_lets_it_be_enabled():
    """ParallelCluster 3.16.1's Slurm 25.11.8 has --requeue=expedite, but only with SlurmctldParameters=
    enable_expedited_requeue, which ParallelCluster's own deny list keeps out of CustomSlurmSettings: prod's jobs keep
    the plain --requeue (a submission asking for a disabled expedite is refused), and the plan says why."""
    denied = subprocess.run(
        [sys.executable, "-c", "import json; from pcluster.validators.slurm_settings_validator import "
         "SLURM_SETTINGS_DENY_LIST as d; print(json.dumps(d['SlurmConf']['Global']))"],
        env={"PYTHONPATH": str(DEFAULT_TARGET)}, capture_output=True, text=True, check=True)
    assert CONTROLLER_PARAMETERS_SETTABLE == ("slurmctldparameters" not in json.loads(denied.stdout))
    expedited, why = expedited_requeue("3.16.1")
    assert not expedited and "Slurm 25.11.8" in why and "SlurmctldParameters=enable_expedited_requeue" in why
    assert expedited_requeue(PCLUSTER_VERSION) == (expedited, why)  # the release the cluster stack deploys
    assert not expedited_requeue("3.9.0")[0]  # a release whose Slurm is not known here: never assumed
    script = job_files(load_settings("prod"))["train_model7.sh"]
    assert "#SBATCH --requeue\n" in script and "expedite" not in script
