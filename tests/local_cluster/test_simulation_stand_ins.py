"""The goodput simulation's parts that need no Slurm: the stand-in trainer (checkpoint rules, resume, a stop
request, ranks failing together, a slow node's pace, detection and eviction), Slurm host lists and the failure
draw."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from local_cluster.simulation.cluster import expand_hostlist
from local_cluster.simulation.faults import failure_times

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "local_cluster" / "stand_ins" / "trainer.py"
TINY = REPO / "jobs" / "training" / "configs" / "tiny.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tmp_path: Path, rank: int, world: int, port: int, *overrides: str, **env_extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "jobs"), "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world),
           "SLURM_STEP_NODELIST": "localhost", "RDZV_PORT": str(port), "SIM_TIME_SCALE": "1000",
           "SIM_STEP_S": "2", "SIM_SAVE_S": "10", "FSX_DATA": str(tmp_path), **env_extra}  # 2 ms steps, 10 ms saves
    args = ["--config", str(TINY), "name=sim", f"checkpoint.dir={tmp_path}/ckpt", f"log.dir={tmp_path}/logs",
            "checkpoint.every=20", "checkpoint.every_minutes=0", "checkpoint.keep=2", "log.interval=10",
            "optim.warmup_steps=1", *overrides]
    return subprocess.Popen([sys.executable, str(TRAINER), *args], env=env, stderr=subprocess.PIPE, text=True)


def records(tmp_path: Path) -> list[dict]:
    path = tmp_path / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_start(tmp_path: Path, count: int = 1) -> None:
    deadline = time.monotonic() + 30
    while sum(r.get("event") == "start" for r in records(tmp_path)) < count:
        assert time.monotonic() < deadline, records(tmp_path)
        time.sleep(0.05)


def test_stand_in_trainer_saves_by_the_checkpoint_rules_and_resumes_from_latest(tmp_path):
    first = start(tmp_path, 0, 1, free_port(), "train.steps=60")
    assert first.wait(timeout=60) == 0, first.stderr.read()
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "STATUS").read_text() == "complete\n"
    assert (ckpt / "latest").read_text() == "step_00000060\n"
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_00000040", "step_00000060"]  # keep 2
    assert all((p / ".metadata").is_file() and (p / "train_meta.json").is_file() for p in ckpt.glob("step_*"))
    lines = records(tmp_path)
    assert [r["event"] for r in lines if "event" in r] == ["start", "complete"]
    assert [r["step"] for r in lines if "loss" in r] == [10, 20, 30, 40, 50, 60]
    assert all(r["time"] > 0 and r["step_time_s"] > 0 for r in lines if "loss" in r)

    again = start(tmp_path, 0, 1, free_port(), "train.steps=100")
    assert again.wait(timeout=60) == 0, again.stderr.read()
    resumed = [r for r in records(tmp_path) if r.get("event") == "start"][-1]
    assert resumed["step"] == 60 and resumed["resumed"]
    assert (ckpt / "latest").read_text() == "step_00000100\n"


def test_a_stop_request_saves_and_releases_every_rank(tmp_path):
    port = free_port()
    ranks = [start(tmp_path, rank, 2, port, "train.steps=1000000") for rank in range(2)]
    wait_for_start(tmp_path)
    for rank in ranks:  # Slurm signals every task
        rank.send_signal(signal.SIGTERM)
    assert [rank.wait(timeout=30) for rank in ranks] == [0, 0]
    stopped = [r for r in records(tmp_path) if r.get("event") == "stopped"]
    assert len(stopped) == 1 and stopped[0]["signal"] == "SIGTERM"
    assert (tmp_path / "ckpt" / "STATUS").read_text() == "stopped\n"
    assert (tmp_path / "ckpt" / "latest").read_text() == f"step_{stopped[0]['step']:08d}\n"


def test_a_stop_signal_ends_rank_0s_wait_for_the_others(tmp_path):
    """A job requeued while its rank 0 waits (another node's prolog failed): it leaves, not after KillWait."""
    alone = start(tmp_path, 0, 2, free_port(), "train.steps=1000000")
    waiting = alone.stderr.readline()  # printed once its stop handlers are in place
    assert waiting.startswith("rank 0: waiting for 1 more ranks"), waiting
    alone.send_signal(signal.SIGTERM)
    assert alone.wait(timeout=10) == 1
    assert "stopped by SIGTERM" in alone.stderr.read()


@pytest.mark.parametrize("killed", [1, 0])
def test_ranks_fail_together_and_save_nothing_when_one_dies(tmp_path, killed):
    port = free_port()
    ranks = [start(tmp_path, rank, 3, port, "train.steps=1000000") for rank in range(3)]
    wait_for_start(tmp_path)
    ranks[killed].kill()  # its node failed
    codes = [rank.wait(timeout=30) for rank in ranks]
    assert codes[killed] == -signal.SIGKILL
    assert [c for i, c in enumerate(codes) if i != killed] == [1, 1]
    assert not (tmp_path / "ckpt" / "STATUS").exists()
    assert not [r for r in records(tmp_path) if r.get("event") in ("stopped", "complete")]


def start_with_a_slow_node(tmp_path: Path, *overrides: str) -> list[subprocess.Popen]:
    """Three ranks on nodes n0, n1, n2 (one job, id 7); n2 is 50 % slow from the start."""
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "n2").write_text("0.5\n")
    port = free_port()
    return [start(tmp_path, rank, 3, port, *overrides, SLURMD_NODENAME=f"n{rank}", SLURM_JOB_ID="7",
                  SIM_SLOW_MARKERS=str(tmp_path / "slow"), NODE_SUSPECT_DIR=str(tmp_path),
                  TRAIN_FAILURE_FILE=str(tmp_path / "FAILURE")) for rank in range(3)]


def test_a_slow_node_paces_every_step_and_is_evicted_after_its_intervals(tmp_path):
    ranks = start_with_a_slow_node(tmp_path, "train.steps=1000000", "train.straggler_intervals=3")
    assert [rank.wait(timeout=60) for rank in ranks] == [1, 1, 1]
    lines = records(tmp_path)
    slow = [r for r in lines if "loss" in r]
    assert [r["slowest_node"] for r in slow] == ["n2"] * 3 and all(r["slowest_excess_pct"] == 50 for r in slow)
    # What the rule saw: 1.5 x the median of 8 noisy probes (the H200's measured noise), about 50 % over the others.
    assert [r["probe_node"] for r in slow] == ["n2"] * 3 and all(45 < r["probe_excess_pct"] < 55 for r in slow)
    assert len({r["probe_excess_pct"] for r in slow}) == 3  # noisy: no two intervals alike
    assert sum(r["step_time_s"] for r in slow) / 3 >= 1.5 * 0.002  # the slowest rank's pace
    events = [r for r in lines if r.get("event") in ("straggler", "evict")]
    assert [(e["event"], e["step"], e["node"]) for e in events] == [("straggler", 30, "n2"), ("evict", 30, "n2")]
    assert (tmp_path / "ckpt" / "latest").read_text() == "step_00000030\n"  # saved before it left
    assert not (tmp_path / "ckpt" / "STATUS").exists()
    reason = (tmp_path / "llm-node-suspect.7").read_text()  # written by n2's own rank, for its epilog
    assert reason.startswith("straggler: rank 2 on n2 gpu ") and "saved step 30" in reason
    assert "% slower than the other nodes in 3 of 5 intervals (margin 0.1)" in reason
    assert (tmp_path / "FAILURE").read_text() == reason


@pytest.mark.parametrize("keep", ["train.straggler_evict=false",
                                  "train.straggler_evict_cost_s=1e9"])  # an eviction dearer than the slowdown
def test_without_eviction_a_slow_node_is_reported_once_and_stays(tmp_path, keep):
    ranks = start_with_a_slow_node(tmp_path, "train.steps=100", "train.straggler_intervals=3", keep)
    assert [rank.wait(timeout=60) for rank in ranks] == [0, 0, 0]
    lines = records(tmp_path)
    assert [r["event"] for r in lines if "event" in r] == ["start", "straggler", "complete"]
    assert all(r["slowest_node"] == "n2" for r in lines if "loss" in r)
    assert not (tmp_path / "llm-node-suspect.7").exists() and not (tmp_path / "FAILURE").exists()


def test_host_lists_expand_as_slurm_writes_them():
    assert expand_hostlist("node[1-3,7],node9") == ["node1", "node2", "node3", "node7", "node9"]
    assert expand_hostlist("node12") == ["node12"]
    assert expand_hostlist("node[08-10]") == ["node08", "node09", "node10"]


def test_failures_arrive_at_the_plans_rate():
    times = failure_times(3.8, nodes=80, days=1000, rng=random.Random(7))
    expected = 3.8 / 1000 * 80 * 1000  # 304
    assert abs(len(times) - expected) < 3 * expected**0.5
    assert times == sorted(times) and 0 < times[0] and times[-1] < 1000 * 86400
