"""Peer heartbeats (training/resilience/heartbeat.py): a lost node ends the others' step in seconds, a slow one never.

Four gloo ranks forked from this process, as two nodes of two (torchrun's GROUP_RANK, LOCAL_RANK and
LOCAL_WORLD_SIZE), rank 0 hosting the job's store as it does without torchrun. The fault is signalled to a
whole node's processes: SIGSTOP is an instance lost (its sockets stay open and say nothing: the others'
collectives would wait out train.timeout_s), SIGKILL a node whose processes died. ``pytest -s`` prints each
survivor's seconds from the fault to its exit.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from conftest import free_port

from training.config import ConfigError, validate_config
from training.resilience import heartbeat

PEER_TIMEOUT_S = 2.0
INTERVAL_S = PEER_TIMEOUT_S / heartbeat.BEATS_PER_TIMEOUT
WORLD, PER_NODE = 4, 2
SLACK_S = 1.5  # a loaded 2-core machine: forked ranks scheduled late


def rank_main(rank: int, port: int, failure_file: str, scenario: str, ready) -> None:
    """One rank: its heartbeat, then training-like collectives until the scenario ends them."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_WORLD_SIZE=str(PER_NODE), LOCAL_RANK=str(rank % PER_NODE), GROUP_RANK=str(rank // PER_NODE))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=100))
    beat = heartbeat.start(rank=rank, world_size=WORLD, peer_timeout_s=PEER_TIMEOUT_S, failure_file=failure_file)
    node = rank // PER_NODE
    t, said = torch.ones(1), False
    for step in range(1, 10**6):
        time.sleep(0.05)  # a step's compute
        try:
            dist.all_reduce(t)
        except RuntimeError:  # gloo hears a killed peer's sockets close; NCCL on a lost instance hears nothing
            time.sleep(100)
        if not said and len(beat.heard) == WORLD // PER_NODE:  # the fault comes once this rank has heard every node
            said = True
            ready.put(rank)
        if scenario == "slow" and step == 5 and node == 1:
            # a long step, a synchronous save, a data wait: the others wait in all_reduce meanwhile
            time.sleep(1.5 * PEER_TIMEOUT_S)
        if scenario == "slow" and step == 8:
            break
    # The end of training: node 1 finishes first and leaves; node 0's last save goes on (its rank 0 keeps the store).
    if node == 0:
        time.sleep(1.5 * PEER_TIMEOUT_S)
    beat.close()
    os._exit(0)


def launch(tmp_path, scenario: str):
    ctx = multiprocessing.get_context("fork")  # torch is imported once, here
    ready = ctx.Queue()
    port, failure = free_port(), tmp_path / "FAILURE"
    ranks = [ctx.Process(target=rank_main, args=(r, port, str(failure), scenario, ready)) for r in range(WORLD)]
    for p in ranks:
        p.start()
    for _ in ranks:
        ready.get(timeout=60)
    return ranks, failure


def node_processes(ranks, node: int):
    return ranks[node * PER_NODE:(node + 1) * PER_NODE]


def fault(ranks, node: int, sig: int) -> float:
    for p in node_processes(ranks, node):
        os.kill(p.pid, sig)
    return time.monotonic()


def exits_after(ranks, node: int, since: float, limit: float) -> list[tuple[int, float]]:
    """(exit code, seconds after the fault) of each rank of ``node``, waiting at most ``limit``."""
    found = []
    for p in node_processes(ranks, node):
        p.join(timeout=max(0.0, since + limit - time.monotonic()))
        found.append((p.exitcode, round(time.monotonic() - since, 2)))
    return found


def kill_all(ranks) -> None:
    for p in ranks:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        p.join()


# The last beat read up to an interval after the fault, the silence by a read up to an interval late, and judged up
# to an interval later.
LIMIT_S = PEER_TIMEOUT_S + 3 * INTERVAL_S + SLACK_S


def lose_node(tmp_path, node: int, sig: int) -> tuple[list, str]:
    """Two nodes training; ``node`` stopped or killed: the other node's ranks' (exit code, seconds after the fault),
    and the failure file's cause."""
    ranks, failure = launch(tmp_path, "train")
    try:
        at = fault(ranks, node, sig)
        survivors = exits_after(ranks, 1 - node, at, LIMIT_S + 10)
    finally:
        kill_all(ranks)
    return survivors, failure.read_text()


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["lost", "killed"])
def test_the_others_exit_within_the_peer_timeout_naming_the_lost_node(tmp_path, sig):
    survivors, cause = lose_node(tmp_path, 1, sig)
    print(f"\nnode 1 {signal.Signals(sig).name}: node 0's ranks exited (code, s after the fault) {survivors}")
    assert all(code == heartbeat.EXIT_NODE_LOST for code, _ in survivors), survivors
    # not sooner than the peer timeout after the last beat, which came at most an interval before the fault
    assert all(PEER_TIMEOUT_S - INTERVAL_S <= seconds <= LIMIT_S for _, seconds in survivors), survivors
    assert cause.startswith("node lost: node 0 (") and "node 1 (" in cause and "last heard" in cause, cause


def test_a_lost_first_node_is_a_store_that_no_longer_answers(tmp_path):
    survivors, cause = lose_node(tmp_path, 0, signal.SIGSTOP)  # rank 0 hosts the store, as torchrun's agent does
    print(f"\nnode 0 SIGSTOP: node 1's ranks exited (code, s after the fault) {survivors}")
    assert all(code == heartbeat.EXIT_NODE_LOST for code, _ in survivors), survivors
    assert all(seconds <= LIMIT_S for _, seconds in survivors), survivors
    assert "the job's store at 127.0.0.1:" in cause


def test_a_slow_node_and_a_finished_one_are_not_lost(tmp_path):
    """Node 1 stops for 1.5 peer timeouts inside the loop (its heartbeat thread goes on), then finishes first;
    node 0 goes on for 1.5 more (a last save) after node 1 has left: nothing fires, every rank exits 0."""
    ranks, failure = launch(tmp_path, "slow")
    try:
        for p in ranks:
            p.join(timeout=60)
        codes = [p.exitcode for p in ranks]
    finally:
        kill_all(ranks)
    assert codes == [0] * WORLD and not failure.exists(), (codes, failure.exists() and failure.read_text())


def longest_gap(beat: heartbeat.Heartbeat, call) -> tuple[float, float]:
    """(seconds ``call`` took, the longest time between two of ``beat``'s rounds meanwhile)."""
    rounds, gaps, done = beat.rounds, [], threading.Event()

    def watch():
        nonlocal rounds
        last = time.monotonic()
        while not done.wait(0.01):
            if beat.rounds != rounds:
                now = time.monotonic()
                gaps.append(now - last)
                rounds, last = beat.rounds, now

    watcher = threading.Thread(target=watch)
    watcher.start()
    start = time.monotonic()
    call()
    took = time.monotonic() - start
    done.set()
    watcher.join()
    return took, max(gaps, default=took)


def test_beats_go_on_through_long_calls_and_cost_one_store_round_trip(capsys):
    """A long operator (a matmul) or wait releases the GIL: the beats go on every interval meanwhile. A serialization
    into memory (torch.save to bytes, as a snapshot's writer does) may hold it: its longest gap is printed. The
    overhead: one add and one multi_get of 34 nodes' counters (prod's largest model) per interval."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=5), wait_for_workers=False)
    interval, fired = 0.05, []
    beat = heartbeat.Heartbeat(connect=lambda s: dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=s),
                                                               wait_for_workers=False),
                               node=0, nodes=34, writer=True, peer_timeout_s=60, interval_s=interval,
                               store_at=f"127.0.0.1:{port}", exit=fired.append)
    for n in range(1, 34):  # the other nodes, as their writers leave them
        store.set(f"{heartbeat.PREFIX}/node{n}/host", f"node{n}")
        store.add(f"{heartbeat.PREFIX}/node{n}", 1)
    beat.start()
    a, x = torch.randn(2000, 2000), torch.randn(16 * 2**20)  # 64 MB; 8 matmuls: many intervals even on a fast CPU
    calls = {"matmul": lambda: [a @ a for _ in range(8)], "sleep": lambda: time.sleep(1),
             "torch.save 64 MB to bytes": lambda: torch.save(x, io.BytesIO())}
    gaps = {name: longest_gap(beat, call) for name, call in calls.items()}
    cpu = time.thread_time()
    start = time.perf_counter()
    for _ in range(200):
        beat.round()
    round_trip = (time.perf_counter() - start) / 200
    beat.close()
    assert store.get(f"{heartbeat.PREFIX}/node0") == heartbeat.STOPPED
    with capsys.disabled():
        print("\nlongest time between beats (every %.2f s): %s; a beat's store round trip %.0f us (%.0f us of CPU)"
              % (interval, ", ".join(f"{n} {t:.2f} s: {g:.2f} s" for n, (t, g) in gaps.items()), round_trip * 1e6,
                 (time.thread_time() - cpu) / 200 * 1e6))
    assert all(gap < took / 2 for took, gap in (gaps["matmul"], gaps["sleep"])) and not fired, gaps


def test_a_peer_timeout_the_collective_timeout_would_beat_is_refused_naming_the_fix(monkeypatch):
    with pytest.raises(ConfigError, match=r"train.peer_timeout_s 120 is above train.timeout_s 100: .* lower "
                                          r"peer_timeout_s to at most 100, or 0 to turn them off"):
        validate_config({"train": {"peer_timeout_s": 120}})
    with pytest.raises(ConfigError, match=r"train.peer_timeout_s 0.5: .* use at least 1 s"):
        validate_config({"train": {"peer_timeout_s": 0.5}})
    assert validate_config({"train": {"peer_timeout_s": 0}}).train.peer_timeout_s == 0  # off
    # Left at its default under a shorter collective timeout: accepted, and the heartbeat stays off (that timeout
    # finds a lost node as soon).
    assert validate_config({"train": {"timeout_s": 5}}).train.peer_timeout_s == 30
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # 2 nodes of 2: only the timeouts keep it off
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")  # nothing listens: a heartbeat started would fail to connect
    assert heartbeat.start(rank=0, world_size=4, peer_timeout_s=30, collective_timeout_s=5) is None
