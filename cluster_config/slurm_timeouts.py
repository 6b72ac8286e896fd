"""Slurm's kill timeouts and the USR1 lead, sized so that the saves they wait for fit (CustomSlurmSettings).

On scancel, the time limit or a node shutdown, Slurm sends SIGTERM and, ``KillWait`` seconds later,
SIGKILL. Slurm's default of 30 s fits no checkpoint of these models. On SIGTERM (or the USR1 that
``--signal=USR1@<lead>`` sends before a time limit) the trainer waits for the asynchronous save in
flight, finishes its step, then saves synchronously (docs/training.md), so the window must hold two
full saves plus a step. Sized for every planned model saving at once, as they do at a Capacity
Block's end (every job's limit is cut to the same reservation start) or a scancel of every job:
they share the checkpoint file system's throughput.

    one round  = every model's checkpoint bytes (parameters x 12: fp32 weights + AdamW's two fp32
                 moments) / the checkpoint file system's provisioned throughput
    KillWait   = 2 x one round + STEP_MARGIN_S, rounded up to a minute
    USR1 lead  = KillWait, at least MIN_USR1_LEAD_S

Production (seven models, 1.75 TB a round, 7,031 MB/s FSx): 2 x 248 s + 120 s -> 660 s for both, where
the largest model alone (0.83 TB, 118 s a save) would need 360 s. jobs/train.sh hands KillWait to
torchrun (--shutdown-timeout), which otherwise kills the workers after 30 s.
``UnkillableStepTimeout`` (after SIGKILL) covers processes stuck in the Lustre client: past it Slurm
drains the node ("Kill task failed") rather than reusing it.
"""

from __future__ import annotations

import math

from training.sizing.memory import checkpoint_bytes  # the training code's checkpoint size, torch-free

from cluster_config.model_configs import architecture
from cluster_config.settings import Settings, SettingsError

MIN_USR1_LEAD_S = 600  # --signal=USR1@<lead> at least 10 minutes before a time limit (jobs/train.sh)
MAX_USR1_LEAD_S = 1800  # longer, and a 24 h job would lose too much of its limit: faster storage is the fix
STEP_MARGIN_S = 120  # one training step (a 70B step takes about a minute) + Slurm's signal delivery
MIN_KILL_WAIT_S = 120
UNKILLABLE_STEP_TIMEOUT_S = 180


def save_seconds(settings: Settings) -> float:
    """Seconds one save of every planned model takes when all save at once: their checkpoint bytes
    together / the checkpoint file system's throughput. The vocabulary: the architecture's where its config.json
    fixes it, else plan.vocab_size (not the training config's, whose batch checks need the model's final
    size: the cluster config is rendered, and this lead set, for model lists the plan has yet to check)."""
    total = sum(checkpoint_bytes(arch := architecture(settings, m), arch.vocab or settings.plan.vocab_size)
                for m in settings.models)
    return total / (settings.storage.checkpoints.throughput_mb_s * 1e6)


def kill_wait_seconds(settings: Settings) -> int:
    return max(MIN_KILL_WAIT_S, math.ceil((2 * save_seconds(settings) + STEP_MARGIN_S) / 60) * 60)


def usr1_lead_seconds(settings: Settings) -> int:
    """``--signal=USR1@<this>`` of every model's job: two saves of every model at once and a step.
    SettingsError where that is more than MAX_USR1_LEAD_S."""
    lead = max(MIN_USR1_LEAD_S, kill_wait_seconds(settings))
    if lead > MAX_USR1_LEAD_S:
        raise SettingsError(
            f"cluster_config/{settings.name}.yaml: storage.checkpoints is too slow for the models' saves: all "
            f"{len(settings.models)} saving at once (a Capacity Block's end) take {save_seconds(settings):.0f} s a round "
            f"at {settings.storage.checkpoints.throughput_mb_s:.0f} MB/s, and the trainer may need two rounds and a "
            f"step after --signal=USR1, {lead} s, more than {MAX_USR1_LEAD_S} s of every job's time limit; raise "
            "storage.checkpoints.throughput_per_tib or storage_capacity_gib (a save is checkpoint bytes / their throughput)")
    return lead


def custom_slurm_settings(settings: Settings) -> list[dict[str, int]]:
    return [{"KillWait": kill_wait_seconds(settings)}, {"UnkillableStepTimeout": UNKILLABLE_STEP_TIMEOUT_S}]
