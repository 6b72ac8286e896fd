"""Fixtures for the training tests: the tiny CPU dataset (built once) and a torchrun launcher."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from local_cluster import demo_data

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "jobs/training/configs/tiny.yaml"
# torchrun, its workers forked from one process that imported torch and the trainer (fork_torchrun.py); the
# command itself for a worker that ends with os._exit(0) (a forked worker must return to report success)
TORCHRUN = [sys.executable, str(Path(__file__).with_name("fork_torchrun.py"))]
TORCHRUN_COMMAND = [str(Path(sys.executable).with_name("torchrun"))]


@pytest.fixture(scope="module")
def d():
    """A real one-process gloo group (what DCP coordinates over)."""
    from training.parallel import distributed  # torch: only for the tests that use it

    mp = pytest.MonkeyPatch()
    mp.setenv("MASTER_ADDR", "127.0.0.1")
    mp.setenv("MASTER_PORT", str(free_port()))
    mp.setenv("RANK", "0")
    mp.setenv("WORLD_SIZE", "1")
    yield distributed.init(timeout_s=60)
    distributed.shutdown()
    mp.undo()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """The sample corpus packed at seq_len 128 (what configs/tiny.yaml expects)."""
    return demo_data.build(tmp_path_factory.mktemp("data") / "sample").path


START_S = 90  # a forked launch logs its start within seconds, on a loaded machine too


@dataclass
class Run:
    """One training launch: its directories and, once finished, its output."""

    root: Path
    process: subprocess.Popen | None = None
    output: str = ""

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints/model1"

    @property
    def logs(self) -> Path:
        return self.root / "logs/model1"

    def env(self) -> dict:
        return {**os.environ, "PYTHONPATH": str(REPO / "jobs"), "OMP_NUM_THREADS": "1",
                "FSX_DATA": str(self.root / "data"), "FSX_CHECKPOINTS": str(self.root / "checkpoints"),
                "FSX_LOGS": str(self.root / "logs")}

    def start(self, data: Path, *overrides: str, nproc: int = 2, program: tuple[str, ...] = ("-m", "training.train")
              ) -> "Run":
        """Launch like the sbatch payload does: torchrun ignores SIGUSR1, only the workers handle it.

        ``program``: what torchrun runs, the trainer or a script wrapping it (``checkpoint_io.py``)."""
        cmd = [*TORCHRUN, f"--nproc-per-node={nproc}", "--standalone", *program,
               "--config", str(CONFIG), f"data.path={data}", *overrides]
        self.process = subprocess.Popen(
            cmd, env=self.env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN))
        return self

    def wait(self, timeout: float = 120) -> int:
        try:
            self.output, _ = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.output, _ = self.process.communicate()
            pytest.fail(f"training did not finish within {timeout} s (hang?):\n{self.output[-4000:]}")
        return self.process.returncode

    def run(self, data: Path, *overrides: str, nproc: int = 2, program: tuple[str, ...] = ("-m", "training.train")
            ) -> int:
        """start, then wait. A launch that ends nothing and logs nothing within START_S is one whose forked
        worker deadlocked at birth (forking a process that runs threads: the agent's store; fork_torchrun.py):
        it printed nothing, wrote no metrics line, and sits at 0 % CPU. It is killed and launched once more
        from the folders as they were, with a line saying so; a second such launch fails as a hang."""
        metrics = self.logs / "metrics.jsonl"
        before = metrics.stat().st_size if metrics.exists() else 0
        self.start(data, *overrides, nproc=nproc, program=program)
        deadline = time.monotonic() + START_S
        while self.process.poll() is None and (metrics.stat().st_size if metrics.exists() else 0) == before:
            if time.monotonic() > deadline:
                os.killpg(self.process.pid, signal.SIGKILL)
                stuck, _ = self.process.communicate()
                print(f"launch stuck before its first metrics line ({START_S} s, output: {stuck[-500:]!r}): "
                      "launched again", file=sys.stderr)
                self.start(data, *overrides, nproc=nproc, program=program)
                break
            time.sleep(0.2)
        return self.wait()

    def records(self) -> list[dict]:
        path = self.logs / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def losses(self) -> dict[int, tuple[float, int]]:
        """step -> (loss, CRC of the samples), the last record for each step."""
        return {r["step"]: (r["loss"], r["samples_crc"]) for r in self.records() if "loss" in r}

    def wait_for_step(self, step: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"training ended before step {step}:\n{self.process.stdout.read()[-4000:]}")
            if any(s >= step for s in self.losses()):
                return
            time.sleep(0.05)
        pytest.fail(f"step {step} not reached within {timeout} s")

    def status(self) -> str:
        return (self.checkpoints / "STATUS").read_text().strip()

    def worker_pids(self) -> list[int]:
        """The training processes torchrun started (children of the torchrun process)."""
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.process.pid:
                children.append(int(stat.parent.name))
        return sorted(children)


@pytest.fixture
def run(tmp_path) -> Run:
    return Run(tmp_path)


def torchrun_script(script: Path, *args: str, nproc: int = 4, timeout: float = 120, launcher: list[str] = TORCHRUN
                    ) -> tuple[int | None, str]:
    """Run ``script`` on ``nproc`` gloo processes: (exit code, None if it was stopped at ``timeout``; output)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "jobs"), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([*launcher, f"--nproc-per-node={nproc}", "--standalone", str(script), *args],
                               env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        process.terminate()  # torchrun stops its workers (each in a session of its own) on SIGTERM
        output, _ = process.communicate(timeout=60)
        return None, output


# Short runs for the resume tests: 16 steps, a checkpoint every 4, every step logged, and two
# micro-batches per rank so gradient accumulation is part of what must continue exactly.
SHORT = ("train.steps=16", "checkpoint.every=4", "log.interval=1", "train.micro_batch_size=8",
         "optim.warmup_steps=4")


@pytest.fixture(scope="module")
def training_jobs(slurm_cluster):
    """Training jobs on the local Slurm cluster, with dev's sample dataset in place; the module's jobs are
    cancelled at its end."""
    from local_cluster.training_job import TrainingJobs

    demo_data.build(slurm_cluster.fsx / "data/tokenized/sample")
    jobs = TrainingJobs(slurm_cluster)
    yield jobs
    jobs.cancel_all()


@pytest.fixture(scope="session")
def reference_losses(tiny_data, tmp_path_factory) -> dict[int, tuple[float, int]]:
    """Per-step (loss, samples) of an uninterrupted 2-process run of SHORT."""
    ref = Run(tmp_path_factory.mktemp("reference"))
    assert ref.run(tiny_data, *SHORT) == 0, ref.output[-4000:]
    losses = ref.losses()
    assert sorted(losses) == list(range(1, 17))
    return losses
