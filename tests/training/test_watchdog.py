"""The progress watchdog: its window follows the measured step time, and when it fires it leaves the stacks."""

from __future__ import annotations

import threading
import time

from training.resilience.watchdog import EXIT_HANG, ProgressWatchdog


def test_window_is_the_start_up_timeout_then_a_multiple_of_the_median_step_with_a_floor(tmp_path):
    dog = ProgressWatchdog(log_dir=tmp_path, rank=0, init_timeout_s=300, floor_s=2, factor=10)
    assert dog.window() == 300
    for step in range(1, 6):
        dog.step_done(step)
        time.sleep(0.01)
    assert dog.window() == 2  # 10 x ~0.01 s is under the floor
    dog._durations.extend([0.5] * 50)
    assert dog.window() == 5.0
    with dog.allow(60):
        assert dog.window() == 65.0
    assert dog.window() == 5.0


def stuck_in_a_collective(release: threading.Event) -> None:
    release.wait()


def test_fires_with_every_threads_stack_and_the_cause(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    exits = []
    failure = tmp_path / "FAILURE"
    dog = ProgressWatchdog(log_dir=tmp_path, rank=1, init_timeout_s=0.5, floor_s=0.5, failure_file=str(failure),
                           linger_s=0, exit=exits.append)
    release = threading.Event()
    worker = threading.Thread(target=stuck_in_a_collective, args=(release,), name="main-loop")
    worker.start()
    start = time.monotonic()
    dog.start()
    while not exits and time.monotonic() - start < 10:
        time.sleep(0.05)
    release.set()
    assert exits == [EXIT_HANG]
    assert time.monotonic() - start < 3  # 0.5 s window, checked every 0.125 s
    text = (tmp_path / "hang_99_rank1.txt").read_text()
    assert "rank 1 of job 99: no training step completed" in text
    assert "stuck_in_a_collective" in text  # the hung thread's frame, not only the watchdog's
    assert failure.read_text().startswith("hang: rank 1 of job 99")
