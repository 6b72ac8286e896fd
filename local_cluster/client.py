"""Python handle on the local two-node Slurm cluster (local_cluster/cluster.sh), for tests, and the one
helper that waits for a Slurm job (``wait_for_job``; from a shell: ``python -m local_cluster.client wait JOB``).

Tests get one through the session fixture ``slurm_cluster`` (tests/conftest.py)::

    def test_my_job(slurm_cluster):
        job = slurm_cluster.sbatch("jobs/my_job.sh", "--steps", "10", options=["--nodes=2"])
        state, exit_code = slurm_cluster.wait(job, timeout=120)
        assert (state, exit_code) == ("COMPLETED", 0)
        log = slurm_cluster.fsx / "logs" / "validation" / f"my-job_{job}.out"

Jobs see the stand-in FSx as /fsx (``.fsx`` on the host) and get the environment of ``.env``
(sbatch exports the submitting environment), which points JOBS_VENV at the repository's venv and
CLUSTER_ENV at nothing (HARNESS_ENV).
Job state comes from ``scontrol show job``, which keeps finished jobs for MinJobAge (5 minutes);
``sacct`` (slurmdbd + MariaDB) keeps them for good.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cli import ArgumentParser

REPO = Path(__file__).resolve().parent.parent
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
FIELD = re.compile(r"(\w+)=(\S*)")
# Jobs the tests and demos submit as root from the checkout run without the deployment's facts:
# /opt/llm-jobs/cluster.env names dev's buckets, which nothing serves here, so every finished training
# would queue a backup (and every preprocess a sync) that fails. The cluster user's jobs read it.
HARNESS_ENV = {"CLUSTER_ENV": "/dev/null"}


def unsupported_reason() -> str | None:
    """Why this machine cannot run the local cluster, or None if it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the local Slurm cluster needs root (packages, network namespaces, mounts)"
    if shutil.which("unshare") is None:
        return "the local Slurm cluster needs unshare (util-linux) for its node namespaces"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"this machine cannot create network/UTS/mount namespaces: {probe.stderr.strip()}"
    return None


def cluster_name() -> str:
    """The local cluster this process talks to: the default one, or the one LOCAL_CLUSTER_NAME names (then
    SLURM_CONF names its slurm.conf, and LOCAL_CLUSTER_NET and LOCAL_CLUSTER_PORT_OFFSET its network: see
    cluster.sh). ``make test`` runs the tests marked any_cluster on a second one (scripts/test_all.sh)."""
    return os.environ.get("LOCAL_CLUSTER_NAME", "")


def slurm_cluster_name() -> str:
    """Its ClusterName, which Slurm puts in every job's environment (SLURM_CLUSTER_NAME): two local clusters
    number their jobs alike, so a job's processes are told apart by it."""
    return cluster_name() or "localcluster"


def slurm_conf_env() -> dict[str, str]:
    """SLURM_CONF where this process has it, for a command run with an environment of its own: without it,
    Slurm's commands reach the default cluster."""
    return {"SLURM_CONF": os.environ["SLURM_CONF"]} if "SLURM_CONF" in os.environ else {}


class LocalCluster:
    def __init__(self, repo: Path = REPO):
        self.repo = repo
        self.base = repo / ".local_cluster" / cluster_name()  # its state, logs, shared folders
        self.fsx = self.base / "fsx"  # what jobs see as /fsx
        # The environment jobs are submitted with; HEALTH_CONF: the node health check's settings where ParallelCluster
        # has /opt/slurm/etc/llm/health.conf (jobs/train.sh's probe before a relaunch runs it, as the prolog does).
        self.env = {**os.environ, **HARNESS_ENV, "JOBS_VENV": str(repo / ".venv"),
                    "HEALTH_CONF": str(self.base / "opt/slurm/etc/llm/health.conf")}

    def cluster_sh(self, command: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.repo / "local_cluster" / "cluster.sh"), command],
                              capture_output=True, text=True, timeout=600)

    def is_up(self) -> bool:
        return self.cluster_sh("status").returncode == 0

    def up(self) -> None:
        self._checked("up")

    def down(self) -> None:
        self._checked("down")

    def _checked(self, command: str) -> None:
        result = self.cluster_sh(command)
        if result.returncode != 0:
            raise RuntimeError(f"cluster.sh {command} failed ({result.returncode}):\n"
                               f"{result.stdout}{result.stderr}")

    def sbatch(self, script: str | Path, *args: str, env: Mapping[str, str] | None = None,
               options: Sequence[str] = (), user: str | None = None) -> str:
        """Submit ``script`` (relative to the repo root, or absolute) from the repo root, as ``user`` if given
        (else root); return the job id."""
        cmd = [*(["runuser", "-u", user, "--"] if user else []), "sbatch", "--parsable", *options, str(script), *args]
        result = subprocess.run(cmd, cwd=self.repo, env={**self.env, **(env or {})},
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")
        return result.stdout.strip().split(";")[0]

    def jobs(self, job_id: str) -> list[dict[str, str]]:
        return job_records(job_id)

    def wait(self, job_id: str, timeout: float = 180) -> tuple[str, int]:
        return wait_for_job(job_id, timeout)


# --- the one "wait for a Slurm job" helper: tests, the demos (also from shell: main below) -------

def hostnames(nodelist: str) -> list[str]:
    """A Slurm node list expanded (node[1-2] -> node1 node2), in Slurm's order."""
    return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                          timeout=30, check=True).stdout.split()


def controller_address() -> str:
    """The controller's address on the cluster bridge, which every node reaches (a test's S3 server listens there)."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30, check=True).stdout
    found = re.search(r"SlurmctldHost\S*\s*=\s*\S+\(([\d.]+)\)", config)
    if not found:
        raise RuntimeError(f"no SlurmctldHost address in scontrol show config:\n{config}")
    return found.group(1)


def login(typed: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """A Session Manager session on the head node (``cluster.sh login``): ``typed`` goes in line by line, as at
    the prompt, `sudo su - <user>` included."""
    return subprocess.run([str(REPO / "local_cluster/cluster.sh"), "login"], input=textwrap.dedent(typed),
                          capture_output=True, text=True, timeout=timeout)


CLUSTER_USER = "ec2-user"  # the cluster's default user (cluster.sh's cfnconfig): data, validation, acceptance


def give_to(user: str, *paths: Path) -> None:
    """Hand ``paths``, and everything in those that are folders, to ``user`` (and its group), as the node setup
    makes a user's folders: what the tests make as root for a job that runs as that user."""
    entry = pwd.getpwnam(user)
    for top in paths:
        os.chown(top, entry.pw_uid, entry.pw_gid)
        for folder, subfolders, files in os.walk(top):
            for name in subfolders + files:
                os.chown(os.path.join(folder, name), entry.pw_uid, entry.pw_gid)


def job_folders(fsx: Path, root: str) -> dict[str, str]:
    """The environment that gives a model's test job checkpoint and log folders of its own, /fsx/<root>/{checkpoints,
    logs}, so that jobs never share a ``latest``. A model's job takes its FSx folders from the cluster, never from
    the submitting shell (jobs/train.sh): from cluster.env, which must be root's, as the node setup writes
    /opt/llm-jobs/cluster.env; so the test writes one, as root, in a folder of root's beside the job's."""
    path = fsx / f"{root}.env"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# The folders of test job {root} (local_cluster/client.py job_folders).\n"
                    f"export FSX_CHECKPOINTS=/fsx/{root}/checkpoints FSX_LOGS=/fsx/{root}/logs\n")
    os.chown(path, 0, 0)
    return {"CLUSTER_ENV": f"/fsx/{root}.env"}


def as_user(user: str, typed: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``typed`` as ``user`` the way the runbook has it (``local_cluster/as_user.sh``: a login, ``sudo su -
    <user>``, ``cd /opt/llm-jobs/bundle``); its exit status is what ``typed`` returned."""
    return subprocess.run([str(REPO / "local_cluster/as_user.sh"), user, typed], capture_output=True, text=True,
                          timeout=timeout)


def submitted(result: subprocess.CompletedProcess) -> str:
    """The id of the one job whose submission ``result`` printed."""
    found = re.findall(r"Submitted batch job (\d+)", result.stdout)
    if len(found) != 1:
        raise AssertionError(f"expected one submission, got {found}: {result.stdout}{result.stderr}")
    return found[0]


def job_records(job_id: str) -> list[dict[str, str]]:
    """``scontrol show job`` records for a job (several for a job array)."""
    result = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                            text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"scontrol show job {job_id}: {result.stderr.strip()}")
    return [dict(FIELD.findall(line)) for line in result.stdout.splitlines() if line.strip()]


def wait_for(what: str, condition: Callable[[], object], timeout: float, interval: float = 1.0,
             detail: Callable[[], str] = lambda: ""):
    """Poll ``condition()`` until it returns something true, and return that. After ``timeout`` s:
    TimeoutError naming ``what``, followed by ``detail()`` (what the caller can show of the cause)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f} s{detail()}")
        time.sleep(interval)
    return value


def wait_for_job(job_id: str, timeout: float = 180, *, on_poll: Callable[[], None] | None = None,
                 interval: float = 0.5) -> tuple[str, int]:
    """Wait until the job (every task of an array) has ended; return (state, exit code).

    For an array the state is COMPLETED only if every task completed, and the exit code is
    the largest. ``on_poll`` runs at every poll (the training demo interrupts the job from it).
    Raises TimeoutError with the last records if it does not end in time.
    """
    deadline = time.monotonic() + timeout
    while True:
        if on_poll is not None:
            on_poll()
        records = job_records(job_id)
        if records and all(r.get("JobState") in TERMINAL_STATES for r in records):
            states = [r["JobState"] for r in records]
            failed = [s for s in states if s != "COMPLETED"]
            code = max(int(r.get("ExitCode", "0:0").split(":")[0]) for r in records)
            return (failed[0] if failed else "COMPLETED"), code
        if time.monotonic() > deadline:
            summary = "; ".join(f"{r.get('JobId')} {r.get('JobState')} {r.get('Reason')}" for r in records)
            raise TimeoutError(f"job {job_id} not finished after {timeout:.0f} s: {summary}")
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    """``python -m local_cluster.client wait JOB [--timeout S]``: exit 0 if it completed, 1 if not."""
    parser = ArgumentParser(prog="python -m local_cluster.client", description="Wait for a Slurm job.")
    commands = parser.add_subparsers(dest="command", required=True)
    wait = commands.add_parser("wait", help="wait until the job has ended; print its state and exit code")
    wait.add_argument("job")
    wait.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    try:
        state, code = wait_for_job(args.job, args.timeout)
    except (TimeoutError, RuntimeError) as exc:
        print(f"error: {exc} — see squeue / scontrol show job {args.job}", file=sys.stderr)
        return 2 if isinstance(exc, RuntimeError) else 1
    print(f"job {args.job}: {state} (exit {code})", file=sys.stdout if state == "COMPLETED" else sys.stderr)
    return 0 if state == "COMPLETED" else 1


if __name__ == "__main__":
    sys.exit(main())
