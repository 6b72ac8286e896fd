"""What Slurm says on the head node: controller, accounting database, nodes, jobs and their restarts.

One command per question, each with a timeout: with slurmdbd down ``sacctmgr`` can wait for
minutes, and a busy controller stalls the others. A command that is missing, fails or does not
answer in time raises SlurmError saying why (its last error line). The formats are Slurm 22.05's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from dataclasses import dataclass

TIMEOUT_S = 5.0
# sinfo's suffixes to a node state: not responding, powered down, powering up, pending power down,
# powering down, maintenance, reboot pending, reboot issued, planned; "+": jobs completing too.
STATE_FLAGS = "*~#!%$@^-+"
UNAVAILABLE = ("down", "drained", "draining", "fail", "failing")


class SlurmError(RuntimeError):
    pass


def run(args: list[str], timeout: float = TIMEOUT_S) -> str:
    """stdout of ``args``; SlurmError if it cannot start, does not answer in time or fails."""
    try:
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
    except OSError as exc:
        raise SlurmError(exc.strerror) from None
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # The whole group: a wrapper's children would keep the pipes open and communicate() waiting.
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise SlurmError(f"no answer in {timeout:g} s") from None
    if process.returncode != 0:
        lines = (err.strip() or out.strip()).splitlines()
        # Slurm starts its error lines with the command's name ("sinfo: error: ..."): the caller names it.
        raise SlurmError(lines[-1].removeprefix(f"{args[0]}: ") if lines else f"exit code {process.returncode}")
    return out


def controller_up(timeout: float = TIMEOUT_S) -> bool:
    """True if ``scontrol ping`` finds a controller UP ("Slurmctld(primary) at head is UP"; a backup
    has a line too), else SlurmError saying why not."""
    out = run(["scontrol", "ping"], timeout)
    if " is UP" not in out:
        raise SlurmError(out.strip() or "no controller in the answer")
    return True


def database_up(timeout: float = TIMEOUT_S) -> bool:
    """True if slurmdbd answers ``sacctmgr show cluster``, else SlurmError saying why not."""
    run(["sacctmgr", "-n", "show", "cluster"], timeout)
    return True


@dataclass(frozen=True)
class Node:
    name: str
    state: str  # base state, lower case: idle, allocated, mixed, down, drained, draining, ...
    flags: str  # sinfo's suffixes (STATE_FLAGS), e.g. "*" when not responding
    reason: str  # why it is unavailable, as Slurm records it ("" if none)

    @property
    def unavailable(self) -> str | None:
        """The state that takes it out of service, else None."""
        if self.state in UNAVAILABLE:
            return self.state
        return "not_responding" if "*" in self.flags else None


def parse_nodes(out: str) -> list[Node]:
    nodes = {}
    for line in out.splitlines():
        if line.strip():
            name, state, reason = line.split("|", 2)
            base = state.rstrip(STATE_FLAGS)
            # A node in two partitions has a line in each.
            nodes[name] = Node(name, base.lower(), state[len(base):], "" if reason == "none" else reason)
    return list(nodes.values())


def nodes(timeout: float = TIMEOUT_S) -> list[Node]:
    """Every node once, from ``sinfo -N`` (the reason last: it may hold anything)."""
    return parse_nodes(run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], timeout))


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    account: str
    qos: str
    state: str  # RUNNING, PENDING, COMPLETING, ...
    reason: str  # why it waits: Resources, Priority, BeginTime, ...; None when running


def parse_jobs(out: str) -> list[Job]:
    jobs = []
    for line in out.splitlines():
        if line.strip():
            job_id, account, qos, state, reason, name = line.split("|", 5)
            jobs.append(Job(job_id, name, account, qos, state, reason))
    return jobs


def jobs(timeout: float = TIMEOUT_S) -> list[Job]:
    """The jobs ``squeue`` shows (pending, running, completing); the name last: it may hold anything."""
    return parse_jobs(run(["squeue", "-h", "-o", "%i|%a|%q|%T|%r|%j"], timeout))


RECORD = re.compile(r"^JobId=(\S+) .*?\bJobName=(.*?) UserId=.*?\bRestarts=(\d+)")


def parse_restarts(out: str) -> list[tuple[str, str, int]]:
    return [(m[1], m[2], int(m[3])) for m in map(RECORD.match, out.splitlines()) if m]


def restarts(timeout: float = TIMEOUT_S) -> list[tuple[str, str, int]]:
    """(job id, name, restarts) of every job the controller still knows, finished ones included
    (for MinJobAge): one ``scontrol -o show job`` for all of them."""
    return parse_restarts(run(["scontrol", "-o", "show", "job"], timeout))
