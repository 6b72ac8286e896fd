"""Exact continuation across interruptions, with real 2-process torch.distributed (gloo) runs."""

from __future__ import annotations

import os
import signal

from conftest import SHORT


def test_run_trains_and_checkpoints(run, tiny_data, reference_losses):
    losses = [reference_losses[s][0] for s in sorted(reference_losses)]
    assert losses[-1] < losses[0] - 1.0, losses  # it learns


def test_resume_after_signals_continues_exactly(run, tiny_data, reference_losses):
    # SIGUSR1 (Slurm's warning before the time limit) to the workers only, as under srun.
    run.start(tiny_data, *SHORT)
    run.wait_for_step(5)
    for pid in run.worker_pids():
        os.kill(pid, signal.SIGUSR1)
    assert run.wait() == 0, run.output[-4000:]
    assert run.status() == "stopped"
    first_stop = max(run.losses())
    assert first_stop < 16
    assert "stopped at step" in run.output and "SIGUSR1" in run.output

    # SIGTERM (scancel, time limit) to the whole process group: torchrun forwards it, workers save.
    run.start(tiny_data, *SHORT)
    run.wait_for_step(first_stop + 3)
    os.killpg(run.process.pid, signal.SIGTERM)
    run.wait()
    assert run.status() == "stopped"
    second_stop = max(run.losses())
    assert first_stop < second_stop < 16

    assert run.run(tiny_data, *SHORT) == 0, run.output[-4000:]
    assert run.status() == "complete"
    assert "resumed from" in run.output
    # Every step's loss and samples equal the uninterrupted run's, bit for bit.
    assert run.losses() == reference_losses


def test_killed_rank_ends_the_run_and_a_rerun_continues_exactly(run, tiny_data, reference_losses):
    run.start(tiny_data, *SHORT, "train.timeout_s=60")
    run.wait_for_step(9)  # the step-8 checkpoint is on its way
    os.kill(run.worker_pids()[-1], signal.SIGKILL)
    assert run.wait(timeout=90) != 0  # ends on its own: no hang
    assert (run.checkpoints / "latest").exists()

    assert run.run(tiny_data, *SHORT) == 0, run.output[-4000:]
    assert "resumed from" in run.output
    assert run.losses() == reference_losses
