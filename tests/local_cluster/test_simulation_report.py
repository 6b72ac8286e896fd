"""The simulation's report by hand: one model, one failure, a record written here (no cluster).

Scale 100 (a wall second is 100 simulated seconds), a step of 10 simulated seconds (10 steps per wall
second), a checkpoint every 100 steps (10 wall seconds). The window is 100 wall seconds; a GPU fails at
40 s, the last checkpoint is at step 300 (30 s), and training starts again from it at 50 s.
"""

from __future__ import annotations

import pytest

from cluster_config.goodput import Goodput
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
    model = ModelSim(name="m", nodes=2, gpus=16, steps=10_000, step_s=STEP_S, save_s=SAVE_S, every=EVERY, plan=plan)
    lines = [{"time": t, "step": 10 * t, "loss": 1.0} for t in range(1, 41)]  # 10 steps per wall second
    lines += [{"time": t, "step": 300 + 10 * (t - 50), "loss": 1.0} for t in range(51, 101)]  # from step 300
    starts = [{"time": 0.0, "step": 0, "event": "start"}, {"time": 50.0, "step": 300, "event": "start"}]
    record = RunRecord(scenario=Scenario(spares=0, days=100 * SCALE / 86400, scale=SCALE, failures_per_1000_node_days=0),
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
