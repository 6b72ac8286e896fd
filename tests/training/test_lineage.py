"""One writer per model: the lease on a checkpoint folder, commits by rename, prunes and saves that a killed
process cannot turn into a fake checkpoint, and a ``latest`` that never goes back."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from conftest import REPO, Run, free_port
from training.checkpoints.checkpointer import LEFTOVER, STEP_DIR, CheckpointInUse, Checkpointer
from training.checkpoints.lease import LEASE, Holder

IDENTITY = {"preset": "tiny", "vocab_size": 512}
CRASH = Path(__file__).with_name("lineage_crash.py")


def state(value: float, step: int) -> dict:
    return {"model": {"w": torch.full((256, 256), value)}, "step": step}


class Squeue:
    """A stand-in ``squeue`` first on PATH, answering from ``jobs`` (job id -> state; absent: ended long ago)."""

    def __init__(self, bin_dir: Path):
        self.file = bin_dir / "jobs.json"
        self.set({})
        script = bin_dir / "squeue"
        script.write_text(f"""#!{sys.executable}
import json, sys
job = next(arg.split("=", 1)[1] for arg in sys.argv if arg.startswith("--jobs="))
state = json.load(open({str(self.file)!r})).get(job)
if state is None:
    sys.exit("slurm_load_jobs error: Invalid job id specified")
print(state)
""")
        script.chmod(0o755)

    def set(self, jobs: dict[str, str]) -> None:
        self.file.write_text(json.dumps(jobs))


@pytest.fixture
def squeue(tmp_path, monkeypatch) -> Squeue:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return Squeue(bin_dir)


def holder(directory: Path) -> dict:
    return json.loads((directory / LEASE).read_text())


def sound_checkpoints(directory: Path) -> dict[int, float]:
    """Every folder that counts as a complete checkpoint, loaded: step -> the value it holds (raises if one fails)."""
    found = {}
    for path in sorted(p for p in directory.iterdir() if STEP_DIR.fullmatch(p.name)):
        if (path / ".metadata").is_file() and (path / "train_meta.json").is_file():
            target = state(0.0, 0)
            dcp.load(target, checkpoint_id=path)
            assert target["step"] == json.loads((path / "train_meta.json").read_text())["step"]
            found[target["step"]] = target["model"]["w"][0, 0].item()
    return found


def crash(directory: Path, keep: int, *actions: str) -> str:
    """Run lineage_crash.py in a process of its own; its output. It must end killed by SIGKILL."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "jobs"), "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}
    result = subprocess.run([sys.executable, str(CRASH), str(directory), str(keep), *actions], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    return result.stdout


def test_second_job_of_a_model_is_refused_naming_the_first(tmp_path, d, squeue, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "1001")
    first = Checkpointer(tmp_path, keep=2, async_save=True, d=d, identity=IDENTITY)
    first.save(10, state(10.0, 10))
    squeue.set({"1001": "RUNNING"})
    monkeypatch.setenv("SLURM_JOB_ID", "1002")
    with pytest.raises(CheckpointInUse) as err:
        Checkpointer(tmp_path, keep=2, async_save=True, d=d, identity=IDENTITY)
    message = str(err.value)
    assert f"{tmp_path} is in use by Slurm job 1001 (host {socket.gethostname()}, pid {os.getpid()}, since " in message
    assert "its job is RUNNING (squeue)" in message and "(scancel 1001)" in message
    first.save(20, state(20.0, 20))  # the first job goes on as if nothing happened
    first.close()
    assert (tmp_path / "latest").read_text() == "step_00000020\n" and not (tmp_path / LEASE).exists()


@pytest.mark.parametrize("slurm_says", [{}, {"1001": "PENDING"}], ids=["ended", "requeued-and-pending"])
def test_lease_of_a_job_that_no_longer_runs_is_taken_over(tmp_path, d, squeue, monkeypatch, slurm_says):
    monkeypatch.setenv("SLURM_JOB_ID", "1001")
    crashed = Checkpointer(tmp_path, keep=2, async_save=False, d=d, identity=IDENTITY)
    crashed.save(10, state(10.0, 10))  # ... and never closed: its lease stays behind
    squeue.set(slurm_says)
    monkeypatch.setenv("SLURM_JOB_ID", "1002")
    taker = Checkpointer(tmp_path, keep=2, async_save=False, d=d, identity=IDENTITY)
    assert holder(tmp_path)["job"] == "1002"
    assert taker.load(state(0.0, 0)) == 10
    taker.save(20, state(20.0, 20))
    with pytest.raises(CheckpointInUse, match="no longer names this run"):
        crashed.save(30, state(30.0, 30))  # the old holder, were it still alive, commits nothing more
    taker.close()
    assert sound_checkpoints(tmp_path) == {10: 10.0, 20: 20.0} and (tmp_path / "latest").read_text() == "step_00000020\n"


def test_requeued_job_takes_its_own_lease_back(tmp_path, d, squeue, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "1001")
    Checkpointer(tmp_path, keep=2, async_save=False, d=d, identity=IDENTITY).save(10, state(10.0, 10))
    squeue.set({"1001": "RUNNING"})  # the job itself, restarted
    again = Checkpointer(tmp_path, keep=2, async_save=False, d=d, identity=IDENTITY)
    assert holder(tmp_path)["job"] == "1001" and again.load(state(0.0, 0)) == 10
    again.close()


def test_without_slurm_a_lease_is_judged_by_its_process(tmp_path, d, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    sleeper = subprocess.Popen(["/bin/sleep", "60"])
    try:
        lease = Holder("", socket.gethostname(), sleeper.pid, time.time(), "0badc0de")
        (tmp_path / LEASE).write_text(lease.text())
        with pytest.raises(CheckpointInUse, match=f"pid {sleeper.pid}, .*its process is running on this host"):
            Checkpointer(tmp_path, keep=2, async_save=False, d=d, identity=IDENTITY)
    finally:
        sleeper.kill()
        sleeper.wait()
    Checkpointer(tmp_path, keep=2, async_save=False, d=d, identity=IDENTITY).close()  # its process is gone
    elsewhere = Holder("", "another-host", 4711, time.time(), "0badc0de")
    (tmp_path / LEASE).write_text(elsewhere.text())
    with pytest.raises(CheckpointInUse, match="neither Slurm nor this host .* can tell whether it still runs; if it "
                                              "does not, delete the lease file LEASE"):
        Checkpointer(tmp_path, keep=2, async_save=False, d=d, identity=IDENTITY)


def test_latest_never_moves_backwards(tmp_path, d):
    ckpt = Checkpointer(tmp_path, keep=5, async_save=False, d=d, identity=IDENTITY)
    ckpt.save(10, state(10.0, 10))
    ckpt.save(20, state(20.0, 20))
    (tmp_path / "latest").write_text("step_00000040\n")  # another writer got past the lease
    with pytest.raises(CheckpointInUse, match="'latest' in .* names step 40, newer than this run's checkpoint "
                                              "step 30: another job has written"):
        ckpt.save(30, state(30.0, 30), wait=True)
    assert (tmp_path / "latest").read_text() == "step_00000040\n" and not (tmp_path / "step_00000030").exists()
    ckpt.close()


def test_killed_mid_prune_leaves_no_half_deleted_checkpoint_and_the_next_start_clears_it(tmp_path, d):
    assert "resumed from step None" in crash(tmp_path, 2, "save:10:10", "save:20:20", "save:30:30", "kill:in-prune:10")
    # keep=2: 20 and 30 stay; step 10's shards are gone but its metadata files were not yet deleted.
    assert sound_checkpoints(tmp_path) == {20: 20.0, 30: 30.0}
    assert [p.name for p in tmp_path.iterdir() if LEFTOVER.fullmatch(p.name)]

    ckpt = Checkpointer(tmp_path, keep=2, async_save=False, d=d, identity=IDENTITY)  # the crashed holder is dead
    assert ckpt.load(state(0.0, 0)) == 30
    ckpt.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000020", "step_00000030"]


def test_killed_mid_save_leaves_a_lineage_that_resumes_from_the_newest_committed_step(tmp_path, d):
    # A commit killed before `latest`, then the resumed run killed while writing the same step again.
    crash(tmp_path, 5, "save:10:10", "save:20:20", "save:30:30", "kill:before-latest:30")
    assert "resumed from step 20" in crash(tmp_path, 5, "save:30:31", "kill:in-write:30")
    assert (tmp_path / "latest").read_text() == "step_00000020\n"
    assert sound_checkpoints(tmp_path) == {10: 10.0, 20: 20.0, 30: 30.0}  # no half-rewritten step 30

    ckpt = Checkpointer(tmp_path, keep=5, async_save=True, d=d, identity=IDENTITY)  # the crashed holder is dead
    assert ckpt.load(state(0.0, 0)) == 20
    ckpt.save(30, state(32.0, 30))  # the uncommitted step 30 is replaced at this commit
    ckpt.close()
    assert sound_checkpoints(tmp_path) == {10: 10.0, 20: 20.0, 30: 32.0}
    assert (tmp_path / "latest").read_text() == "step_00000030\n"
    assert not [p.name for p in tmp_path.iterdir() if LEFTOVER.fullmatch(p.name)]  # cleaned by the new holder


def test_second_training_job_stops_as_a_user_error_naming_the_first(run, tiny_data, squeue, monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_JOB_ID", "1001")
    run.start(tiny_data, "train.steps=100000", "checkpoint.every=5", "log.interval=1", nproc=1)
    run.wait_for_step(2)
    squeue.set({"1001": "RUNNING"})
    failure = tmp_path / "FAILURE-1002"
    monkeypatch.setenv("SLURM_JOB_ID", "1002")
    monkeypatch.setenv("TRAIN_FAILURE_FILE", str(failure))
    second = Run(run.root)
    assert second.run(tiny_data, "train.steps=4", "optim.warmup_steps=1", "checkpoint.every=2") != 0
    assert f"{run.checkpoints} is in use by Slurm job 1001" in second.output
    assert "[rank1] ERROR" in second.output  # every rank learns the answer
    assert failure.read_text().startswith(f"user: {run.checkpoints} is in use by Slurm job 1001")  # no requeue
    assert holder(run.checkpoints)["job"] == "1001" and not list(run.checkpoints.glob("*job1002*"))
    for pid in run.worker_pids():  # the first job was not disturbed: it stops as at its time limit
        os.kill(pid, signal.SIGUSR1)
    assert run.wait() == 0, run.output[-4000:]
    assert run.status() == "stopped" and not (run.checkpoints / LEASE).exists()
