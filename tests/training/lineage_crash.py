"""A checkpointing process that is killed (SIGKILL) at a chosen point, as a node failure or ``os._exit`` ends one.

    python tests/training/lineage_crash.py DIR KEEP [save:STEP:VALUE ...] [kill:POINT:STEP]

Resumes from DIR like the trainer (a one-process gloo group, the real ``Checkpointer``), then saves
each ``STEP`` (a state whose tensor is filled with ``VALUE``), asynchronously, and closes. The kill
point, armed from the start, is one of:

- ``in-prune``: the deletion of checkpoint ``STEP`` removes its shards, then the process is killed
  (``rmtree``'s order is the file system's: the metadata files may be the last to go);
- ``before-latest``: the commit of ``STEP`` is killed just before it names its checkpoint in ``latest``;
- ``in-write``: the save of ``STEP`` is killed with its shard half written, before DCP writes ``.metadata``.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemWriter

from training.checkpoints import checkpointer


from training.parallel import distributed
IDENTITY = {"preset": "tiny", "vocab_size": 512}


def state(value: float, step: int) -> dict:
    return {"model": {"w": torch.full((256, 256), value)}, "step": step}


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_points(step: int) -> dict:
    """Where to kill the save, commit or deletion of ``step``: (object, attribute, replacement)."""
    name = f"step_{step:08d}"

    def in_prune(path, *args, _rmtree=shutil.rmtree, **kwargs) -> None:
        if Path(path).name.startswith(name):
            for shard in Path(path).glob("*.distcp"):
                shard.unlink()
            die()
        _rmtree(path, *args, **kwargs)

    def before_latest(path, data, _write_atomic=checkpointer.write_atomic) -> None:
        if Path(path).name == checkpointer.LATEST and data.strip() == name:
            die()
        _write_atomic(path, data)

    def in_write(self, metadata, results, _finish=FileSystemWriter.finish) -> None:
        if Path(self.path).name.startswith(name):
            for shard in Path(self.path).glob("*.distcp"):
                shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
            die()
        _finish(self, metadata, results)

    return {"in-prune": (shutil, "rmtree", in_prune), "before-latest": (checkpointer, "write_atomic", before_latest),
            "in-write": (FileSystemWriter, "finish", in_write)}


if __name__ == "__main__":
    directory, keep, *actions = sys.argv[1:]
    saves = []
    for action in actions:
        kind, first, second = action.split(":")
        if kind == "kill":  # kill:POINT:STEP
            owner, attribute, replacement = kill_points(int(second))[first]
            setattr(owner, attribute, replacement)
        else:  # save:STEP:VALUE
            saves.append((int(first), float(second)))
    d = distributed.init(timeout_s=60)
    ckpt = checkpointer.Checkpointer(directory, keep=int(keep), async_save=True, d=d, identity=IDENTITY)
    print("resumed from step", ckpt.load(state(0.0, 0)), flush=True)
    for step, value in saves:
        ckpt.save(step, state(value, step))
    ckpt.close()
    distributed.shutdown()
