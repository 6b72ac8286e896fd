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

from training.presets import PRESETS  # the training code's shapes and checkpoint size, torch-free
from training.sizing import checkpoint_bytes

from cluster_config.settings import Settings

USR1_LEAD_S = 600  # --signal=USR1@<this>: the trainer saves and stops (jobs/train.sh explains the lead)
STEP_MARGIN_S = 120  # one training step (a 70B step takes about a minute) + Slurm's signal delivery
MIN_KILL_WAIT_S = 120
UNKILLABLE_STEP_TIMEOUT_S = 180


def save_seconds(settings: Settings) -> float:
    """Seconds one checkpoint of the largest planned model takes at the checkpoint FSx's throughput."""
    vocab = settings.plan.vocab_size
    largest = max((checkpoint_bytes(PRESETS[m.preset], vocab) for m in settings.models if m.preset in PRESETS),
                  default=0)
    return largest / (settings.storage.checkpoints.throughput_mb_s * 1e6)


def kill_wait_seconds(settings: Settings) -> int:
    return max(MIN_KILL_WAIT_S, math.ceil((2 * save_seconds(settings) + STEP_MARGIN_S) / 60) * 60)


def custom_slurm_settings(settings: Settings) -> list[dict[str, int]]:
    return [{"KillWait": kill_wait_seconds(settings)}, {"UnkillableStepTimeout": UNKILLABLE_STEP_TIMEOUT_S}]
