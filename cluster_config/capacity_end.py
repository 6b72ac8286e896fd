"""The end of the GPU capacity: a Slurm maintenance reservation before the Capacity Blocks end.

A Capacity Block ends on a fixed date and AWS begins terminating its instances 30 minutes earlier
(``gpu_queue.capacity_end``). Before that every model must have saved, and no job may start that
cannot save in time. From the settings this module derives, at synth:

  reservation    ``capacity_end``, flags MAINT and IGNORE_JOBS, on every node of the GPU queue, from
                 ``start = capacity_end - gpu_queue.capacity_end_lead_min`` to the earliest block end.
                 The head node creates it (node_scripts/slurm_capacity_end.sh). Slurm starts no job
                 whose time limit reaches into it; a job with ``--time-min`` starts with its limit cut
                 to end at ``start``, and ``--signal=USR1@<lead>`` makes it save and stop before that.
                 Jobs running when it is created get their limits cut to ``start``.
  time-min       per model: the USR1 lead plus the shortest run worth a restart (three saves, at least
                 ten minutes): no shorter run starts (``#SBATCH --time-min``, cluster_config/model_jobs.py).
  backups        every model's backup job (jobs/backup.sh, on the CPU queue, outside the reservation)
                 begins once every save is over: ``start + KillWait + TIME_LIMIT_CHECK_S``.

What the lead must hold: a job whose last save overran its cut limit is sent SIGTERM at ``start``
(Slurm looks at time limits about once a minute) and keeps saving for up to ``KillWait`` (two saves
of every model at once and a step, cluster_config/slurm_timeouts.py) before SIGKILL:

    lead >= KillWait + TIME_LIMIT_CHECK_S

and the USR1 lead must hold what the trainer does after the signal, with every model doing it at
once: finish the save in flight, one step, a synchronous save, with Slurm's up to 60 s early
delivery in the step margin. ``usr1_lead_seconds`` sizes it so (cluster_config/slurm_timeouts.py).

``check_capacity_end`` raises SettingsError naming the field and the fix; synth runs it. The
reservation travels to the head node as a file beside the model list (``capacity_end_file``), because
ParallelCluster never lets OnNodeConfigured's arguments change on a running cluster.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Optional

from cluster_config.plan import build_plan
from cluster_config.settings import CAPACITY_BLOCK_END_NOTICE, CONFIG_PREFIX, Settings, SettingsError
from cluster_config.slurm_timeouts import kill_wait_seconds, usr1_lead_seconds

# Not "pcluster-...": ParallelCluster's clustermgtd deletes reservations of that prefix it did not make
# (slurm_plugin/capacity_block_manager.py, its own reservations for inactive Capacity Blocks).
RESERVATION = "capacity_end"
# slurmctld enforces time limits on a periodic pass (about once a minute): a job may run that much past its limit.
TIME_LIMIT_CHECK_S = 60
# The shortest run worth a restart, beyond the USR1 lead: this many saves of the model, at least the floor.
USEFUL_RUN_SAVES = 3
USEFUL_RUN_FLOOR_S = 600


@dataclass(frozen=True)
class CapacityEnd:
    """When the GPU queue stops taking jobs, and what follows (UTC)."""

    start: datetime  # the reservation starts: every job's limit ends here
    end: datetime  # the earliest Capacity Block end: the reservation ends with it
    terminate: datetime  # gpu_queue.capacity_end: AWS begins terminating the instances
    backups: datetime  # every save is over: the backups begin
    lead_s: int
    required_lead_s: int


def save_seconds(settings: Settings) -> dict[str, float]:
    """Seconds one checkpoint of each model takes: checkpoint bytes / the checkpoint file system's
    throughput (the plan's figure, cluster_config/plan.py)."""
    return {row.name: row.save_s for row in build_plan(settings).rows}


def time_min_s(save_s: float, usr1_lead_s: int) -> int:
    """A model's ``--time-min``: the USR1 lead + the shortest useful run, in whole minutes."""
    return math.ceil((usr1_lead_s + max(USEFUL_RUN_FLOOR_S, USEFUL_RUN_SAVES * save_s)) / 60) * 60


def required_lead_s(settings: Settings) -> int:
    return kill_wait_seconds(settings) + TIME_LIMIT_CHECK_S


def capacity_end(settings: Settings) -> Optional[CapacityEnd]:
    """The reservation and the backups' start, or None without a Capacity Block end."""
    queue = settings.gpu_queue
    terminate = queue.capacity_end
    if terminate is None:
        return None
    lead_s = queue.capacity_end_lead_min * 60
    start = terminate - timedelta(seconds=lead_s)
    kill_wait = kill_wait_seconds(settings)
    return CapacityEnd(start=start.astimezone(timezone.utc), end=(terminate + CAPACITY_BLOCK_END_NOTICE).astimezone(timezone.utc),
                       terminate=terminate.astimezone(timezone.utc),
                       backups=(start + timedelta(seconds=kill_wait + TIME_LIMIT_CHECK_S)).astimezone(timezone.utc),
                       lead_s=lead_s, required_lead_s=kill_wait + TIME_LIMIT_CHECK_S)


def check_capacity_end(settings: Settings) -> Optional[CapacityEnd]:
    """``capacity_end(settings)``, or SettingsError when a model could still be saving as the instances go."""
    window = capacity_end(settings)
    if window is None:
        return None
    where = f"cluster_config/{settings.name}.yaml"
    problems = []
    if window.lead_s < window.required_lead_s:
        kill_wait = window.required_lead_s - TIME_LIMIT_CHECK_S
        problems.append(
            f"gpu_queue.capacity_end_lead_min {window.lead_s // 60} is too short: a model still saving when its limit "
            f"ends at the reservation's start keeps saving for KillWait ({kill_wait} s: two saves of every model at once "
            f"and a step) after Slurm's time-limit check (up to {TIME_LIMIT_CHECK_S} s), {window.required_lead_s} s in "
            f"all, and AWS terminates the instances at {window.terminate:%Y-%m-%dT%H:%MZ}; set capacity_end_lead_min: "
            f"{math.ceil(window.required_lead_s / 60)} or more")
    if problems:
        raise SettingsError(f"{where}: the Capacity Blocks' end cannot be met:\n" + "\n".join(f"  {p}" for p in problems))
    return window


def capacity_end_key(settings: Settings) -> str:
    return f"{CONFIG_PREFIX}{settings.cluster_name}.capacity_end"


def _utc(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def capacity_end_file(settings: Settings) -> str:
    """What the head node reads (node_scripts/slurm_capacity_end.sh): one line of key=value, or none
    without a Capacity Block end (the script then removes the reservation and the planned backups).
    Synth checks the window first (``check_capacity_end``)."""
    window = capacity_end(settings)
    header = (f"# The GPU queue's end, from cluster_config/{settings.name}.yaml (cluster_config/capacity_end.py); "
              "read by node_scripts/slurm_capacity_end.sh.\n")
    if window is None:
        return header
    return header + (f"reservation={RESERVATION} partition={settings.gpu_queue.name} start={_utc(window.start)} "
                     f"end={_utc(window.end)} backups={_utc(window.backups)}\n")


def capacity_end_digest(settings: Settings) -> str:
    return hashlib.sha256(capacity_end_file(settings).encode()).hexdigest()
