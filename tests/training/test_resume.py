"""Exact continuation across interruptions, with real 2-process torch.distributed (gloo) runs."""

from __future__ import annotations

import os
import shutil
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


def test_fsdp_resume_from_a_checkpoint_continues_exactly(tmp_path, tiny_data):
    """FSDP2 (sharded DTensor model and optimizer state): resume from step 4 of a run, compare steps 5-8."""
    from conftest import Run

    fsdp = ("train.parallelism=fsdp", "train.steps=8", "checkpoint.every=4", "log.interval=1",
            "train.micro_batch_size=8", "optim.warmup_steps=2")
    full = Run(tmp_path / "full")
    assert full.run(tiny_data, *fsdp) == 0, full.output[-4000:]
    resumed = Run(tmp_path / "resumed")
    resumed.checkpoints.mkdir(parents=True)
    shutil.copytree(full.checkpoints / "step_00000004", resumed.checkpoints / "step_00000004")
    (resumed.checkpoints / "latest").write_text("step_00000004\n")
    assert resumed.run(tiny_data, *fsdp) == 0, resumed.output[-4000:]
    assert "resumed from" in resumed.output
    expected = {s: v for s, v in full.losses().items() if s > 4}
    assert resumed.losses() == expected and sorted(expected) == [5, 6, 7, 8]


def test_ddp_on_four_ranks_resumes_bit_for_bit_with_train_deterministic(tmp_path, tiny_data):
    """DDP lays its gradient buckets out again after a run's first step; more than two ranks sum each
    element in an order that depends on the layout, so a resumed run's first step summed differently
    (found by the local cluster's corruption drill: losses an ulp apart from step 6). Deterministic runs
    reduce each parameter alone (distributed.reduce_each_parameter): resume from step 4, compare 5-8."""
    from conftest import Run

    ddp = ("train.parallelism=ddp", "train.deterministic=true", "train.steps=8", "checkpoint.every=4",
           "log.interval=1", "train.micro_batch_size=8", "optim.warmup_steps=2", "data.num_workers=0")
    full = Run(tmp_path / "full")
    assert full.run(tiny_data, *ddp, nproc=4) == 0, full.output[-4000:]
    resumed = Run(tmp_path / "resumed")
    resumed.checkpoints.mkdir(parents=True)
    shutil.copytree(full.checkpoints / "step_00000004", resumed.checkpoints / "step_00000004")
    (resumed.checkpoints / "latest").write_text("step_00000004\n")
    assert resumed.run(tiny_data, *ddp, nproc=4) == 0, resumed.output[-4000:]
    assert "resumed from" in resumed.output
    expected = {s: v for s, v in full.losses().items() if s > 4}
    assert resumed.losses() == expected and sorted(expected) == [5, 6, 7, 8]
