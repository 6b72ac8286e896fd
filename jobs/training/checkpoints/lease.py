"""One writer per model: an exclusive lease on a model's checkpoint folder.

Slurm's per-model QOS (one running job) is the first guard, but ``--account=ops`` or a cluster
without accounting gets past it, and two jobs writing one lineage destroy each other's
checkpoints. So the trainer's rank 0 takes ``<checkpoint dir>/LEASE`` before anything is written:

    {"job": "1234", "host": "gpu-st-p5-1", "pid": 4711, "since": 1793000000.0, "token": "9f2c..."}

- Taking it: the lease is written whole to a temporary name and linked to ``LEASE``; the link
  fails if ``LEASE`` exists, so of two jobs starting together only one gets it.
- A lease already there is the job's own when it names the same Slurm job (a requeue, a restart
  of torchrun) or, outside Slurm, the same host and pid: taken back. Otherwise it is stale when
  Slurm says the holder's job no longer runs (``squeue``: gone, or in a state other than the
  running ones below). Without an answer from Slurm (no job id, no ``squeue``, the controller
  down) a holder on this host is stale when its process is gone; one on another host is taken
  to be alive, and the job refuses to start saying how to clear it. No age makes a lease stale:
  a stall of the holder (a slow file system, a long checkpoint load) must not let a second
  writer in.
- A stale lease is renamed to a name of this job's own (only one job's rename of it succeeds)
  and compared with what was judged stale before this job links its own.
- The holder checks the lease is still its own before each checkpoint commit and removes it
  when the run ends; a job that crashes leaves it behind, stale once its Slurm job has ended.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from atomic_file import temporary_name

log = logging.getLogger(__name__)
LEASE = "LEASE"
# Slurm job states in which the job's processes may still write (squeue --format=%T).
LIVE_STATES = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT",
               "RESIZING"}


class CheckpointInUse(RuntimeError):
    """Another live job holds the model's checkpoint folder: this one must not write there."""


@dataclass(frozen=True)
class Holder:
    job: str  # Slurm job id; "" outside Slurm
    host: str
    pid: int
    since: float  # epoch seconds
    token: str  # tells this holder's lease and temporary folders from any other's

    @classmethod
    def me(cls) -> Holder:
        return cls(os.environ.get("SLURM_JOB_ID", ""), socket.gethostname(), os.getpid(), time.time(),
                   os.urandom(4).hex())

    @property
    def name(self) -> str:
        """For the names of this holder's temporary folders: ``job1234-9f2c0a1b`` or ``pid4711-9f2c0a1b``."""
        return f"job{self.job}-{self.token}" if self.job else f"pid{self.pid}-{self.token}"

    def same_writer(self, other: Holder) -> bool:
        if self.job or other.job:
            return self.job == other.job
        return (self.host, self.pid) == (other.host, other.pid)

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        who = f"Slurm job {self.job}" if self.job else "a run outside Slurm"
        return f"{who} (host {self.host}, pid {self.pid}, since {started})"

    def text(self) -> str:
        return json.dumps(asdict(self)) + "\n"


def acquire(directory: Path) -> Holder:
    """Take the lease on ``directory`` for this process; raises ``CheckpointInUse`` naming a live holder."""
    me, path = Holder.me(), directory / LEASE
    for _ in range(3):  # another round only when a concurrent start changed the lease under us
        if _create(path, me):
            return me
        text = _read_text(path)
        if text is None:
            continue  # removed meanwhile (its holder ended): try to create it again
        holder = _parse(text)
        if holder is None:
            log.warning("%s cannot be read: taking it over", path)
        elif holder.same_writer(me):
            log.info("taking back the lease on %s from this job's previous start, %s", directory, holder.describe())
        elif alive := _alive(holder):
            raise CheckpointInUse(
                f"{directory} is in use by {holder.describe()}: {alive}. One job writes a model's "
                f"checkpoints at a time; this job stops without touching them. Wait for that job or cancel one "
                f"of the two{f' (scancel {holder.job})' if holder.job else ''}")
        else:
            log.warning("taking over the lease on %s from %s, which no longer runs", directory, holder.describe())
        _take_over(path, text, me)
    raise CheckpointInUse(f"could not take the lease {path}: other jobs are taking it at the same time")


def holds(directory: Path, me: Holder) -> bool:
    return _read_text(directory / LEASE) == me.text()


def release(directory: Path, me: Holder) -> None:
    if holds(directory, me):
        (directory / LEASE).unlink(missing_ok=True)


def _create(path: Path, me: Holder) -> bool:
    """Write the lease whole, then link it into place: False if a lease is there already."""
    tmp = temporary_name(path)
    try:
        with open(tmp, "w") as f:
            f.write(me.text())
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _take_over(path: Path, judged: str, me: Holder) -> None:
    """Remove the lease judged stale (text ``judged``), unless another job replaced it meanwhile."""
    claimed = path.with_name(f"{LEASE}.taken-{me.name}")
    try:
        os.rename(path, claimed)  # of several jobs taking it over, one succeeds
    except FileNotFoundError:
        return
    if _read_text(claimed) != judged:  # a lease written after ours was judged: not ours to take
        try:
            os.link(claimed, path)
        except FileExistsError:
            pass
    claimed.unlink()


def _alive(holder: Holder) -> str:
    """Why ``holder`` counts as alive ('' when its lease is stale)."""
    if holder.job:
        state = slurm_state(holder.job)
        if state is not None:
            return f"its job is {state} (squeue)" if state in LIVE_STATES else ""
    if holder.host == socket.gethostname():
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return ""
        except PermissionError:
            pass
        return "its process is running on this host"
    return (f"neither Slurm nor this host ({socket.gethostname()}) can tell whether it still runs; if it does "
            f"not, delete the lease file {LEASE} in that folder")


def slurm_state(job: str) -> str | None:
    """The Slurm state of ``job`` ('' when Slurm no longer knows it); None when Slurm cannot be asked."""
    try:
        result = subprocess.run(["squeue", "--noheader", f"--jobs={job}", "--format=%T"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode == 0:
        lines = result.stdout.split()
        return lines[0] if lines else ""
    if "Invalid job id" in result.stderr:  # ended longer ago than Slurm's MinJobAge
        return ""
    return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _parse(text: str) -> Holder | None:
    """The holder a lease names; None for a lease that cannot be read, which counts as stale."""
    try:
        return Holder(**json.loads(text))
    except (ValueError, TypeError):
        return None
