"""A training job on the local cluster and the faults done to it, for the recovery tests and benchmark.

    job = TrainingJob(cluster, "sigkill").submit("train.steps=24")
    job.wait_for_step(8)
    job.kill_worker(signal.SIGKILL, node="node2")     # what an Xid error or an OOM kill does
    state, code = job.wait()

Each job gets its own checkpoint and log folders under /fsx/tests/recovery/<name>-<id>/ (FSX_CHECKPOINTS
and FSX_LOGS, from a cluster.env of root's: ``job_folders``), so jobs never share a ``latest``; Slurm's own
output goes to /fsx/logs/<model>/ as in
production (dev's model1 by default; ``TrainingJob(cluster, name, model="model2")`` for its 1-node share).
The job is submitted and runs as the model's own user, as on the cluster (docs/cluster.md, "Seven models,
seven users"), who owns its folders; the faults are root's, as a failing node's or an operator's are.
The nodes share the host's /proc, so the workers are found (and signalled) from here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from local_cluster.client import LocalCluster, give_to, hostnames, job_folders, slurm_cluster_name, slurm_conf_env
from training.status import read_metrics

TINY = ("--config", "jobs/training/configs/tiny.yaml")
OPTIONS = ["--nodes=2", "--gpus-per-node=0"]  # the local nodes have CPUs only


class TrainingJob:
    def __init__(self, cluster: LocalCluster, name: str, model: str = "model1"):
        self.cluster = cluster
        self.model = model  # whose job script, account and QOS (dev's: model1 2 nodes, model2 1)
        self.root = f"tests/recovery/{name}-{uuid.uuid4().hex[:8]}"
        self.host_root = cluster.fsx / self.root
        self.id = ""

    def submit(self, *overrides: str, options: tuple[str, ...] = (), **extra_env: str) -> "TrainingJob":
        # The model's folders as the node setup makes them, its user's: Slurm's output folder (Slurm does not
        # create it) and this job's own, with what a test or the head node put there first (a copy of jobs/,
        # the capacity-end action's log folder).
        output = self.cluster.fsx / f"logs/{self.model}"
        if not output.exists():
            output.mkdir(parents=True)
            give_to(self.model, output)
        self.host_root.mkdir(parents=True, exist_ok=True)
        give_to(self.model, self.host_root)
        env = {**job_folders(self.cluster.fsx, self.root), "OMP_NUM_THREADS": "1", **extra_env}
        self.id = self.cluster.sbatch(f"jobs/train_{self.model}.sh", *TINY, *overrides, env=env,
                                      options=[*OPTIONS, *options], user=self.model)
        return self

    def wait(self, timeout: float = 600) -> tuple[str, int]:
        return self.cluster.wait(self.id, timeout=timeout)

    def record(self) -> dict[str, str]:
        return self.cluster.jobs(self.id)[0]

    # --- what the job wrote ---------------------------------------------------------------------
    @property
    def log_dir(self) -> Path:
        return self.host_root / f"logs/{self.model}"

    @property
    def checkpoint_dir(self) -> Path:
        return self.host_root / f"checkpoints/{self.model}"

    def records(self) -> list[dict]:
        return read_metrics(self.log_dir / "metrics.jsonl")

    def events(self, kind: str) -> list[dict]:
        return [r for r in self.records() if r.get("event") == kind]

    def losses(self) -> dict[int, tuple[float, int]]:
        """step -> (loss, CRC of rank 0's samples); the last line for a step wins, as after a resume."""
        return {r["step"]: (r["loss"], r["samples_crc"]) for r in self.records() if "loss" in r}

    def output(self) -> str:
        """The job's Slurm stdout then stderr (training logs go to stderr)."""
        paths = [self.cluster.fsx / f"logs/{self.model}/{self.model}_{self.id}.{ext}" for ext in ("out", "err")]
        return "".join(p.read_text(errors="replace") for p in paths if p.exists())

    # --- waiting --------------------------------------------------------------------------------
    def wait_until(self, what: str, done, timeout: float = 300) -> float:
        """Poll the metrics until ``done(records)``; the monotonic time it became true."""
        deadline = time.monotonic() + timeout
        while not done(self.records()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id}: no {what} within {timeout} s:\n{self.output()[-3000:]}")
            time.sleep(0.1)
        return time.monotonic()

    def wait_for_step(self, step: int, *, after: int = 0, timeout: float = 300) -> float:
        """Wait for a loss line for ``step`` or later, among the lines after the first ``after`` records."""
        return self.wait_until(f"step {step}", lambda rs: any("loss" in r and r["step"] >= step for r in rs[after:]),
                               timeout)

    # --- faults ---------------------------------------------------------------------------------
    def worker_pids(self, node: str | None = None) -> list[int]:
        """Training workers of this job (children of its torchruns), optionally only those on ``node``."""
        return worker_pids(self.id, node)

    def nodes(self) -> list[str]:
        """The nodes the job runs on now (expanded from NodeList)."""
        nodelist = self.record().get("NodeList", "")
        return hostnames(nodelist) if nodelist and nodelist != "(null)" else []

    def kill_worker(self, sig: int, node: str | None = None) -> int:
        """Send ``sig`` to one training worker (on ``node`` if given); its pid."""
        deadline = time.monotonic() + 30
        while not (pids := self.worker_pids(node)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {self.id}: no training worker{' on ' + node if node else ''}")
            time.sleep(0.1)
        os.kill(pids[-1], sig)
        return pids[-1]


class TrainingJobs:
    """The training jobs a test module or benchmark submits, cancelled together at its end, so that a failed
    test leaves none behind: ``jobs.submit("evict", *overrides, **env)``."""

    def __init__(self, cluster: LocalCluster):
        self.cluster, self.submitted = cluster, []

    def submit(self, name: str, *overrides: str, **env: str) -> TrainingJob:
        job = TrainingJob(self.cluster, name)
        self.submitted.append(job)
        return job.submit(*overrides, **env)

    def cancel_all(self) -> None:
        ids = [job.id for job in self.submitted if job.id]
        if ids:
            subprocess.run(["scancel", *ids], check=False)


def release_node(cluster: LocalCluster, node: str, why: str) -> None:
    """The operator's release of a drained or quarantined node (node_scripts/slurm_health_hook.sh --release):
    back into service, recorded in the failure history, its earlier failures no longer counted."""
    subprocess.run(["bash", str(cluster.repo / "node_scripts/slurm_health_hook.sh"), "--release", node, why],
                   env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HEALTH_LOG": "/dev/null",
                        "HEALTH_HISTORY": str(cluster.fsx / "logs/node-health/history.tsv"),
                        **slurm_conf_env()}, check=False)


def continue_stopped(pid: int) -> None:
    """Let a SIGSTOPped process go on (or die of the SIGKILL Slurm already sent it)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def worker_pids(job_id: str, node: str | None = None) -> list[int]:
    """Training workers of Slurm job ``job_id`` of this process's cluster: children of its torchruns (the nodes
    share the host's /proc)."""
    pids, cluster = [], f"SLURM_CLUSTER_NAME={slurm_cluster_name()}".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmd = (proc / "cmdline").read_bytes()
            ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
            parent_cmd = Path(f"/proc/{ppid}/cmdline").read_bytes()
        except OSError:
            continue
        is_python = b"python" in cmd.split(b"\0")[0]  # not srun, whose command line names torchrun too
        if (f"SLURM_JOB_ID={job_id}".encode() in env and cluster in env and is_python and b"training.train" in cmd
                and b"torchrun" in parent_cmd
                and (node is None or f"SLURMD_NODENAME={node}".encode() in env)):
            pids.append(int(proc.name))
    return sorted(pids)
