"""The trainer, with what each rank reads from and hands to its checkpoints recorded (test_layouts' HSDP tests).

    torchrun ... tests/training/checkpoint_io.py --config ... (the trainer's arguments)

Writes ``$FSX_LOGS/checkpoint_io/rank<N>.json`` at the end:

- ``reads``: each item this rank's storage reader read, by checkpoint folder: key, bytes on disk, kind;
- ``saves``: per save, the step and the bytes of tensors (local shards) this rank gave DCP to stage and write;
- ``sized``: per save, the bytes of the state the free-space check sizes (rank 0 only);
- ``resumed``: digests of this rank's model and optimizer state (local shards) right after the resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.tensor import DTensor

from training.checkpoints import checkpointer


from training import train
record: dict = {"reads": {}, "saves": [], "sized": [], "resumed": None}


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def leaves(tree):
    if isinstance(tree, dict):
        for value in tree.values():
            yield from leaves(value)
    elif isinstance(tree, list | tuple):
        for value in tree:
            yield from leaves(value)
    else:
        yield tree


def digest(tree) -> str:
    h = hashlib.sha256()
    for leaf in leaves(tree):
        if isinstance(leaf, torch.Tensor):
            h.update(local(leaf).detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(leaf).encode())
    return h.hexdigest()


def read_data(self, plan, planner, _read_data=FileSystemReader.read_data):
    items = record["reads"].setdefault(Path(self.path).name, [])
    items += [[item.storage_index.fqn, self.storage_data[item.storage_index].length, item.type.name]
              for item in plan.items]
    return _read_data(self, plan, planner)


def saving(save):
    def wrapped(state, *, checkpoint_id, **kwargs):
        tensor_bytes = sum(local(t).nbytes for t in leaves(state) if isinstance(t, torch.Tensor))
        step = int(re.match(r"step_(\d+)", Path(checkpoint_id).name).group(1))  # step_N.partial-<writer> until committed
        record["saves"].append({"step": step, "tensor_bytes": tensor_bytes})
        return save(state, checkpoint_id=checkpoint_id, **kwargs)
    return wrapped


def no_room(self, step, state, _no_room=checkpointer.Checkpointer._no_room) -> str:
    if self.d.is_main:
        record["sized"].append(checkpointer.state_bytes(state))
    return _no_room(self, step, state)


def resume(self, _resume=train.Trainer._resume) -> int:
    step = _resume(self)
    model, optim = get_state_dict(self.model, self.optimizer)
    record["resumed"] = {"model": digest(model), "optim": digest(optim)}
    return step


FileSystemReader.read_data = read_data
dcp.save, dcp.async_save = saving(dcp.save), saving(dcp.async_save)
checkpointer.Checkpointer._no_room = no_room
train.Trainer._resume = resume

if __name__ == "__main__":
    code = train.main(sys.argv[1:])
    out = Path(os.environ["FSX_LOGS"]) / "checkpoint_io"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(record))
    sys.exit(code)
