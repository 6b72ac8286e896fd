"""Environment files for tests: a shipped ``cluster_config/<env>.yaml`` with some keys changed."""

from __future__ import annotations

from pathlib import Path

import yaml

from cluster_config.settings import CONFIG_DIR


def write_env(config_dir: Path, env_name: str = "prod", **changes) -> Path:
    """Write ``<config_dir>/<env_name>.yaml``: the shipped file of that name with ``changes`` applied.

    A change is ``dotted__path=value`` (``gpu_queue__max_count=90``, or ``storage={...}`` for a whole
    section; a number picks a list item: ``gpu_queue__capacity_reservations__1__kind="odcr"``); the
    value ``DELETE`` removes the key. Returns the file's path.
    """
    raw = yaml.safe_load((CONFIG_DIR / f"{env_name}.yaml").read_text())
    for dotted, value in changes.items():
        *parents, leaf = [int(key) if key.isdigit() else key for key in dotted.split("__")]
        node = raw
        for key in parents:
            node = node[key]
        if value == "DELETE":
            del node[leaf]
        else:
            node[leaf] = value
    config_dir.mkdir(parents=True, exist_ok=True)
    path = config_dir / f"{env_name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path
