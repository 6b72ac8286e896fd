"""The simulation's report by hand: one model, one failure or one slow node, a record written here (no cluster).

Scale 100 (a wall second is 100 simulated seconds), a step of 10 simulated seconds (10 steps per wall
second), a checkpoint every 100 steps (10 wall seconds). The window is 100 wall seconds; a GPU fails at
40 s, the last checkpoint is at step 300 (30 s), and training starts again from it at 50 s. Or a node
turns 50 % slow at 20.5 s, is named a straggler after 5 log intervals of 10 steps and evicted.
"""

from __future__ import annotations

import pytest

from cluster_config.goodput import Goodput, Stragglers
from local_cluster.simulation.report import model_result
from local_cluster.simulation.run import Calibration, ModelSim, RunRecord, Scenario

SCALE = 100.0
STEP_S = 10.0  # simulated
EVERY = 100  # steps
SAVE_S = 50.0  # simulated


def record_with_one_failure(calibrated_restart_wall: float) -> tuple[ModelSim, RunRecord, Calibration]:
    plan = Goodput(name="m", nodes=2, gpus=16, cost_per_hour_usd=1.0, failure_free_days=1.0, failures_per_day=1.0,
                   checkpoint_interval_s=EVERY * STEP_S, save_s=SAVE_S, recovery_s=600.0, replacement_s=1500.0,
                   p_no_spare=0.0)
    slow = Stragglers(name="m", gpus=16, days=1.0, per_day=0.01, slowdown=0.1, unattended_s=86400.0,
                      detect_s=5 * 10 * STEP_S, evict_s=2100.0)  # the plan's; the report keeps its detection window
    model = ModelSim(name="m", nodes=2, gpus=16, steps=10_000, step_s=STEP_S, save_s=SAVE_S, every=EVERY, plan=plan,
                     plan_stragglers=slow)
    lines = [{"time": t, "step": 10 * t, "loss": 1.0} for t in range(1, 41)]  # 10 steps per wall second
    lines += [{"time": t, "step": 300 + 10 * (t - 50), "loss": 1.0} for t in range(51, 101)]  # from step 300
    starts = [{"time": 0.0, "step": 0, "event": "start"}, {"time": 50.0, "step": 300, "event": "start"}]
    record = RunRecord(scenario=Scenario(spares=0, days=100 * SCALE / 86400, scale=SCALE, failures_per_1000_node_days=0,
                                         stragglers_per_1000_node_days=0, straggler_slowdown=0.5,
                                         straggler_unattended_h=24),
                       models=[model], t0=0.0, end=100.0,
                       failures=[{"time": 40.0, "node": "node1", "kind": "GPU failed", "model": "m"}],
                       metrics={"m": starts + lines}, final={"m": {"job_state": "RUNNING", "latest_step": 800}})
    calibration = Calibration(recovery_wall={"m": {"GPU failed": calibrated_restart_wall}}, replacement_wall=[1.0],
                              nodes={"m": 2})
    return model, record, calibration


def test_a_failure_costs_its_time_to_resume_and_the_steps_since_the_checkpoint():
    model, record, calibration = record_with_one_failure(calibrated_restart_wall=10.0)
    row = model_result(model, record, calibration)
    # 1,000 steps of wall time, 800 reached: 100 steps lost to the restart (10 s), 100 to the rework
    assert row["ettr"] == pytest.approx(0.8, abs=0.01)
    assert row["resume_h"] == [pytest.approx(10.1 * SCALE / 3600)]  # to the first step after the start
    # the goodput model's rework: half an interval plus the save (550 s), beside the 1,010 s to resume
    assert row["ettr_given_resumes"] == pytest.approx(1 - (1010 + 550) / 10_000)
    assert row["ettr_given_failures"] == pytest.approx(1 - (1000 + 550) / 10_000)  # the calibrated 10 s
    assert not row["stuck"] and row["end"] == "training"


def test_given_resumes_takes_the_measured_restart_where_the_calibration_was_another_chance():
    """A lost node's restart is 14 s or 78 s by where it sat in Slurm's tree: a calibration of 40 s
    misses this run's 10 s; the measured time to resume does not."""
    model, record, calibration = record_with_one_failure(calibrated_restart_wall=40.0)
    row = model_result(model, record, calibration)
    assert abs(row["ettr"] - row["ettr_given_resumes"]) <= 0.2 * row["ettr_given_resumes"]
    assert abs(row["ettr"] - row["ettr_given_failures"]) > 0.2 * row["ettr_given_failures"]


def test_a_straggler_costs_its_slowed_steps_then_the_eviction():
    model, record, calibration = record_with_one_failure(calibrated_restart_wall=10.0)
    record.failures = []
    starts = [{"time": 0.0, "step": 0, "event": "start"}, {"time": 37.75, "step": 250, "event": "start"}]
    lines = [{"time": float(t), "step": 10 * t, "loss": 1.0, "step_time_s": 0.1, "slowest_excess_pct": 0.0,
              "slowest_node": "n1"} for t in range(1, 21)]
    # slow from 20.5 s: 5 steps at 0.1 s then 5 at 0.15 s, then 4 intervals of 10 steps at 0.15 s
    ends = [21.25, 22.75, 24.25, 25.75, 27.25]
    lines += [{"time": t, "step": 200 + 10 * (i + 1), "loss": 1.0, "step_time_s": 0.125 if i == 0 else 0.15,
               "slowest_excess_pct": 50.0, "slowest_node": "n2"} for i, t in enumerate(ends)]
    events = [{"time": 27.25, "event": "straggler", "step": 250, "node": "n2"},
              {"time": 27.75, "event": "evict", "step": 250, "node": "n2"}]  # after the save, 0.5 s
    lines += [{"time": 37.75 + t, "step": 250 + 10 * t, "loss": 1.0, "step_time_s": 0.1, "slowest_excess_pct": 0.0,
               "slowest_node": "n1"} for t in range(1, 63)]
    record.metrics = {"m": sorted(starts + lines + events, key=lambda r: r["time"])}
    record.stragglers = [{"time": 20.5, "node": "n2", "model": "m", "job": "1", "gone": 28.0,
                          "reason_after": "job 1: straggler: rank 1 on n2 50 % slower"}]
    record.final = {"m": {"job_state": "RUNNING", "latest_step": 800}}
    row = model_result(model, record, calibration)
    slow = row["stragglers"]
    assert slow["met"] == 1 and slow["detected"] == 1 and slow["evicted"] == 1
    assert slow["slowed_h"] == pytest.approx(7.25 * SCALE / 3600)
    assert slow["lost_h"] == pytest.approx(2.25 * SCALE / 3600)  # 7.25 s for 50 steps of 0.1 s
    # the goodput model: the detection window's 500 s of steps last 750 s run 50 % slow, longer than the 725 s
    # this node held the model back (its first interval was a partial one): 725 x 0.5 / 1.5 lost
    assert slow["detection_predicted_h"] == pytest.approx(750 / 3600)
    assert slow["lost_slowed_given_h"] == pytest.approx(725 / 3 / 3600)
    assert slow["detection_h"] == [pytest.approx(6.75 * SCALE / 3600)]
    assert slow["eviction_h"] == [pytest.approx(10.6 * SCALE / 3600)]  # the save, the restart, its first step
    assert slow["drained_as"] == ["job 1: straggler: rank 1 on n2 50 % slower"]
    # 1,000 steps of wall time, 870 reached: 22.5 lost slowed, 105 to the eviction (its save and restart)
    assert row["ettr"] == pytest.approx(0.87, abs=0.005)
    assert row["ettr_given_resumes"] == pytest.approx(1 - (725 / 3 + 1060) / 10_000)
