"""Per-rank timing (training/stragglers.py): the detector on figures, then a real rank slowed on gloo.

The slowed rank is stopped and continued by the test (SIGSTOP/SIGCONT, 8 ms of every 10 ms): its
process, device and data are healthy, it only gets less time, as a throttled GPU or a host with a
noisy neighbour gives it; nothing in the trainer knows."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

from conftest import SHORT

from training.stragglers import Detector, probe

import torch

HOSTS = ["node1", "node2", "node3", "node4"]


def test_a_rank_slow_for_enough_intervals_in_a_row_is_reported_once():
    detector = Detector(HOSTS, margin=0.10, intervals=3)
    fast, slow = [1.0, 1.01, 0.99, 1.0], [1.0, 1.3, 0.99, 1.0]
    reports = [detector.update(p, [0, 0, 0, 0], [10, 10, 10, 10]) for p in (slow, slow, slow, slow, fast, slow)]
    assert [r.slowest_rank for r in reports[:4]] == [1, 1, 1, 1]
    assert [r.intervals_over for r in reports] == [1, 2, 3, 4, 0, 1]
    assert [r.new_straggler for r in reports] == [False, False, True, False, False, False]
    assert reports[2].slowest_host == "node2" and round(reports[2].excess, 3) == 0.3


def test_noise_under_the_margin_or_a_different_rank_each_time_is_not_a_straggler():
    detector = Detector(HOSTS, margin=0.10, intervals=3)
    rounds = [[1.0, 1.09, 1.0, 1.0], [1.2, 1.0, 1.0, 1.0], [1.0, 1.0, 1.2, 1.0], [1.0, 1.0, 1.0, 1.2]]
    assert not any(detector.update(p, [0] * 4, [0] * 4).new_straggler for p in rounds)


def test_data_wait_and_collective_wait_name_who_waited():
    report = Detector(HOSTS, margin=0.10, intervals=3).update([1, 1, 1, 1], [0.1, 2.5, 0.0, 0.2],
                                                              [100.0, 100.5, 103.0, 101.0])
    assert (report.data_wait_max_rank, report.data_wait_max_s) == (1, 2.5)
    assert report.collective_wait_s == [3.0, 2.5, 0.0, 2.0]  # rank 2 arrived last: the others waited for it
    assert report.fields()["collective_wait_max_s"] == 3.0


def test_the_probe_is_the_same_work_on_every_call():
    times = [probe(torch.device("cpu")) for _ in range(3)]
    assert all(t > 0 for t in times)


def slow_down(pid: int, stop: threading.Event, stopped_ms: float = 8, period_ms: float = 10) -> None:
    while not stop.is_set():
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stopped_ms / 1000)
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        time.sleep((period_ms - stopped_ms) / 1000)


def test_a_rank_given_less_cpu_is_named_with_its_node(run, tiny_data):
    steps = ("train.steps=60", "log.interval=2", "train.straggler_margin=0.5", "train.straggler_intervals=2")
    run.start(tiny_data, *SHORT, *steps)
    run.wait_for_step(2, timeout=120)  # past start-up: both workers are training
    victim = run.worker_pids()[1]  # rank 1: the workers are forked in rank order
    stop = threading.Event()
    slower = threading.Thread(target=slow_down, args=(victim, stop), daemon=True)
    slower.start()
    try:
        assert run.wait(timeout=300) == 0, run.output[-3000:]
    finally:
        stop.set()
        slower.join()
        try:
            os.kill(victim, signal.SIGCONT)
        except ProcessLookupError:
            pass
    events = [r for r in run.records() if r.get("event") == "straggler"]
    assert events, [r.get("slowest_excess_pct") for r in run.records() if "loss" in r]
    assert events[0]["rank"] == 1 and events[0]["node"] == socket.gethostname() and events[0]["excess_pct"] > 50
    assert f"straggler: rank {events[0]['rank']} on {socket.gethostname()}" in run.output
    lines = [r for r in run.records() if "loss" in r]
    assert all("slowest_rank" in r and "collective_wait_max_s" in r and "data_wait_max_s" in r for r in lines)
