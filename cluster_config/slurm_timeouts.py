"""Slurm's kill timeouts, sized so that a training job's save on SIGTERM fits (CustomSlurmSettings).

On scancel, the time limit or a node shutdown, Slurm sends SIGTERM and, ``KillWait`` seconds later,
SIGKILL. Slurm's default of 30 s fits no checkpoint of these models. On SIGTERM the trainer waits
for the asynchronous save in flight, finishes its step, then saves synchronously (docs/training.md),
so the window must hold two full saves of the largest planned model plus a step:

    checkpoint bytes = parameters x 12 (fp32 weights + AdamW's two fp32 moments)
    one save         = checkpoint bytes / the checkpoint file system's provisioned throughput
    KillWait         = 2 x one save + STEP_MARGIN_S, rounded up to a minute

Production (70B, 0.83 TB, 7,031 MB/s FSx): 2 x 118 s + 120 s -> 360 s. jobs/train.sh hands the same
window to torchrun (--shutdown-timeout), which otherwise kills the workers after 30 s.
``UnkillableStepTimeout`` (after SIGKILL) covers processes stuck in the Lustre client: past it Slurm
drains the node ("Kill task failed") rather than reusing it.
"""

from __future__ import annotations

import math

from cluster_config.settings import Settings

# Parameters per training preset at a 32k vocabulary (jobs/training/models.py; a test keeps them equal).
PRESET_PARAMETERS = {
    "1.7b": 1_676_392_704, "3.6b": 3_594_181_632, "7.5b": 6_738_415_616, "18.4b": 18_513_106_944,
    "39.1b": 39_381_114_880, "76.1b": 76_311_357_440, "145.6b": 145_743_556_608, "310.1b": 310_692_036_608,
    "llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192,
}
CHECKPOINT_BYTES_PER_PARAMETER = 12
STEP_MARGIN_S = 120  # one training step (a 70B step takes about a minute) + Slurm's signal delivery
MIN_KILL_WAIT_S = 120
UNKILLABLE_STEP_TIMEOUT_S = 180


def save_seconds(settings: Settings) -> float:
    """Seconds one checkpoint of the largest planned model takes at the checkpoint FSx's throughput."""
    largest = max((PRESET_PARAMETERS.get(m.preset, 0) for m in settings.models), default=0)
    bytes_per_s = settings.storage.checkpoints.throughput_mb_s * 1e6
    return largest * CHECKPOINT_BYTES_PER_PARAMETER / bytes_per_s


def kill_wait_seconds(settings: Settings) -> int:
    return max(MIN_KILL_WAIT_S, math.ceil((2 * save_seconds(settings) + STEP_MARGIN_S) / 60) * 60)


def custom_slurm_settings(settings: Settings) -> list[dict[str, int]]:
    return [{"KillWait": kill_wait_seconds(settings)}, {"UnkillableStepTimeout": UNKILLABLE_STEP_TIMEOUT_S}]
