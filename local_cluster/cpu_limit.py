"""A CPU limit on some processes: a node whose ranks get a fraction of a CPU, as one whose GPUs throttle
or that shares its host with a noisy neighbour does, without stopping them.

    with CpuLimit(pids, 0.1):     # 10 % of one CPU, all of them together
        ...

A cgroup of its own with a CFS quota: cgroup v1's ``cpu`` controller (``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``, at /sys/fs/cgroup/cpu) or cgroup v2's ``cpu.max``; the processes are moved in
(their threads with them) and back to the cgroup they came from afterwards. Where neither can be
used (no root, no cpu controller), the SIGSTOP/SIGCONT duty cycle of local_cluster.alert_drills.Throttle
stands in, with the same share of every second. ``how`` says which one ran.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from local_cluster.alert_drills import Throttle

CGROUP = Path("/sys/fs/cgroup")
# A short period (10 ms; the quota's floor is 1 ms): every stretch of work longer than the quota is slowed,
# the straggler probe's few milliseconds included. Over 100 ms a short probe could run whole on a fresh
# quota: a rank at 10 % measured ~15 % slow in about half of its intervals, ~1500 % in the others.
PERIOD_US = 10_000


def _v1_root() -> Path | None:
    for path in (CGROUP / "cpu", CGROUP / "cpu,cpuacct"):
        if (path / "cpu.cfs_quota_us").exists():
            return path
    return None


def _v2_root() -> Path | None:
    controllers = CGROUP / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return CGROUP
    return None


def _own_cgroup(pid: int, v1: bool) -> str:
    """The pid's cgroup path in the cpu hierarchy (v1) or the unified one (v2)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (v1 and "cpu" in controllers.split(",")) or (not v1 and controllers == ""):
            return path
    return "/"


class CpuLimit:
    def __init__(self, pids: list[int], fraction: float):
        self.pids, self.fraction = list(pids), fraction
        self.how = ""
        self._group: Path | None = None
        self._home: dict[int, Path] = {}
        self._throttle: Throttle | None = None

    def start(self) -> "CpuLimit":
        name = f"llm-drill-{uuid.uuid4().hex[:8]}"
        quota = max(1000, int(self.fraction * PERIOD_US))
        try:
            if (root := _v1_root()) is not None:
                group = root / name
                group.mkdir()
                (group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
                (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
                self.how = f"cgroup v1 {group}: cpu.cfs_quota_us {quota} per {PERIOD_US} us"
                self._move(group, root, v1=True)
            elif (root := _v2_root()) is not None:
                group = root / name
                group.mkdir()
                (group / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
                self.how = f"cgroup v2 {group}: cpu.max {quota} {PERIOD_US}"
                self._move(group, root, v1=False)
            else:
                raise OSError("no cgroup cpu controller")
        except OSError as exc:
            self._undo()
            self._throttle = Throttle(self.pids, duty=self.fraction)
            self._throttle.start()
            self.how = f"SIGSTOP/SIGCONT, running {self.fraction:g} of every second (no cgroup: {exc})"
        return self

    def _move(self, group: Path, root: Path, *, v1: bool) -> None:
        self._group = group
        for pid in self.pids:
            try:
                self._home[pid] = root / _own_cgroup(pid, v1).lstrip("/")
                (group / "cgroup.procs").write_text(f"{pid}\n")
            except (ProcessLookupError, FileNotFoundError):
                continue  # already gone

    def _undo(self) -> None:
        if self._group is None:
            return
        for pid, home in self._home.items():
            try:
                (home / "cgroup.procs").write_text(f"{pid}\n")
            except OSError:
                pass  # gone, or its cgroup gone: nothing to give back
        for pid in (self._group / "cgroup.procs").read_text().split():
            try:  # anything still inside (a thread group forked meanwhile) goes to the root
                (self._group.parent / "cgroup.procs").write_text(f"{pid}\n")
            except OSError:
                pass
        deadline = time.monotonic() + 10  # a process that was killed inside stays a member until it is reaped
        while True:
            try:
                self._group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    break  # left behind, empty once its last process is gone
                time.sleep(0.2)
        self._group = None

    def stop(self) -> None:
        if self._throttle is not None:
            self._throttle.stop()
            self._throttle = None
        self._undo()

    def __enter__(self) -> "CpuLimit":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
