"""Full disks, time-based checkpoints and two-phase timeouts, with real 2-process gloo runs (no Slurm needed).

The full disk is real: a small tmpfs mounted where the checkpoints go (needs root, as the Slurm tests do).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import SHORT
from tests.marks import needs_root


@pytest.fixture
def small_disk(run):
    """The run's checkpoint file system: a 6 MiB tmpfs, room for two of the tiny run's ~2.3 MB checkpoints."""
    mount = run.root / "checkpoints"
    mount.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@needs_root  # mounts a tmpfs
def test_full_checkpoint_disk_skips_saves_keeps_latest_and_stops_cleanly(run, tiny_data, reference_losses, small_disk):
    failure = run.root / "FAILURE"
    os.environ["TRAIN_FAILURE_FILE"] = str(failure)  # where jobs/train.sh reads why a run stopped
    try:
        code = run.run(tiny_data, *SHORT, "checkpoint.keep=2")
    finally:
        del os.environ["TRAIN_FAILURE_FILE"]
    # Steps 4 and 8 fit; step 12 does not: skipped with the path and the numbers, training goes on.
    assert "checkpoint step 12 needs" in run.output and f"but {run.checkpoints} has" in run.output
    assert "skipping this checkpoint, training goes on and `latest` stays at step 8" in run.output
    # The final save cannot be skipped: the workers exit 2 and report a user error (a human must make
    # room; jobs/train.sh exits 2 without requeueing: torchrun's own exit code is 1 whatever the workers').
    assert code != 0 and "cannot save the final checkpoint. Free space there" in run.output
    assert failure.read_text().startswith("user: checkpoint step 16 needs")
    assert (run.checkpoints / "latest").read_text() == "step_00000008\n"
    assert json.loads((run.checkpoints / "step_00000008/train_meta.json").read_text())["step"] == 8
    assert not (run.checkpoints / "step_00000012").exists() and not (run.checkpoints / "STATUS").exists()
    assert run.losses() == {s: v for s, v in reference_losses.items() if s <= 16}

    # Room made: the run resumes from step 8 and ends exactly like the uninterrupted one.
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    assert run.run(tiny_data, *SHORT, "checkpoint.keep=2") == 0, run.output[-4000:]
    assert "resumed from" in run.output and "step_00000008" in run.output
    assert run.losses() == reference_losses


def test_time_based_checkpoints_are_taken_between_step_intervals(run, tiny_data):
    # every=100 steps never comes in a 12-step run: every save before the last is the clock's.
    assert run.run(tiny_data, "train.steps=12", "checkpoint.every=100", "checkpoint.every_minutes=0.002",
                   "checkpoint.keep=50", "optim.warmup_steps=2", "log.interval=1") == 0, run.output[-4000:]
    saved = sorted(p.name for p in run.checkpoints.glob("step_*"))
    assert len(saved) >= 3 and saved[-1] == "step_00000012", saved


def test_collective_timeout_is_long_for_start_up_and_short_after_the_first_step(run, tiny_data):
    """A rank that stops after the first step is given up on after train.timeout_s, not init_timeout_s."""
    run.start(tiny_data, *SHORT, "train.init_timeout_s=300", "train.timeout_s=5", "train.watchdog_floor_s=600")
    run.wait_for_step(3)
    pid = run.worker_pids()[-1]
    os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    try:
        assert run.wait(timeout=120) != 0
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert time.monotonic() - start < 60  # 5 s collective timeout (+ torchrun's teardown), not 300 s
    assert "timed out" in run.output.lower() or "timeout" in run.output.lower(), run.output[-3000:]
