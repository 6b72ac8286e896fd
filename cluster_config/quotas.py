"""Each model's Lustre project quota on the checkpoint file system, sized from the plan.

Seven models share one checkpoint file system: without a limit, one model (a run with a wrong
``checkpoint.keep``, a stray copy) fills it and every other model's saves fail. A project quota per
model bounds it. The quota is the model's peak in the plan (``checkpoint.keep`` complete checkpoints
and one being written: ``ModelRow.checkpoint_bytes * checkpoints_kept``) plus one more checkpoint: a
save that fails midway stays on disk until the next one completes, and the model's exports
(``<checkpoints>/<model>/export/``, bf16 weights, a fraction of a checkpoint) live there too.

The project id is the model user's uid (``settings.model_uid``): unique per model (the settings refuse
two models on one uid) and the same on every node. The head node applies the quotas
(node_scripts/fsx_quotas.sh, from directory_setup.sh) from the file ``quotas_file`` renders, which the
cluster stack ships beside the model list. The data file system needs none per model: only the
cluster's user writes there (docs/cluster.md, "Seven models, seven users").
"""

from __future__ import annotations

import math

from cluster_config.plan import build_plan
from cluster_config.settings import CONFIG_PREFIX, Settings, model_uid

GIB = 2**30
SPARE_CHECKPOINTS = 1  # beyond the plan's keep + 1 in flight: a failed save left on disk, the exports


def checkpoint_quotas_gib(settings: Settings) -> dict[str, int]:
    """Each model's quota on the checkpoint file system, whole GiB rounded up."""
    return {row.name: math.ceil(row.checkpoint_bytes * (row.checkpoints_kept + SPARE_CHECKPOINTS) / GIB)
            for row in build_plan(settings).rows}


def quotas_key(settings: Settings) -> str:
    return f"{CONFIG_PREFIX}{settings.cluster_name}.quotas"


def quotas_file(settings: Settings) -> str:
    """What the head node reads (node_scripts/fsx_quotas.sh): "<model> <project id> <GiB>" a line."""
    header = (f"# Each model's project quota on {settings.storage.checkpoints.mount_dir}, from cluster_config/"
              f"{settings.name}.yaml (cluster_config/quotas.py); read by node_scripts/fsx_quotas.sh.\n")
    return header + "".join(f"{name} {model_uid(name)} {gib}\n" for name, gib in checkpoint_quotas_gib(settings).items())
