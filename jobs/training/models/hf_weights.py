"""Start a run from released weights: a Hugging Face checkpoint folder (config.json + *.safetensors).

Each rank reads only the slices of each tensor it keeps (safetensors slice reads), in any layout:
under FSDP and HSDP a rank's dim-0 shard, under tensor parallel its rows or columns, under FSDP x TP
the part of its tensor-parallel slice its FSDP shard keeps; DDP keeps, and reads, everything. No rank
ever holds the whole model. Names and shapes are checked against the run's architecture first, with
one error naming every mismatch. The stored dtype (bf16 for released models) is widened to the
parameters' (fp32 master weights) on copy.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from training.models.architecture import WEIGHTS_INDEX as INDEX
from training.models.architecture import Architecture, released_weights_problem
from training.models.llama import canonical_name


class WeightsError(ValueError):
    """The folder does not hold the run's architecture; the message says what differs and how to fix it."""


def tensor_files(folder: Path) -> dict[str, Path]:
    """Each tensor's file: from the index of a sharded checkpoint, else from the headers of its files."""
    index = folder / INDEX
    if index.is_file():
        return {name: folder / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"model.init_from: {folder} holds no *.safetensors; give the folder of a Hugging Face "
                           f"checkpoint (config.json, model*.safetensors)")
    names = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            names.update((name, file) for name in f.keys())
    return names


def check_architecture(folder: Path, arch: Architecture, preset: str) -> None:
    """The checkpoint's config.json must describe the architecture the run builds, and it must hold safetensors."""
    problem = released_weights_problem(folder, arch, preset)
    if problem:
        raise WeightsError(problem)


def load(model: nn.Module, folder: str | Path, arch: Architecture, preset: str) -> dict:
    """Copy the checkpoint's weights into this rank's part of ``model``; returns where they came from."""
    folder = Path(folder)
    check_architecture(folder, arch, preset)
    files = tensor_files(folder)
    params = {canonical_name(name): p for name, p in model.named_parameters()}
    handles = {file: safe_open(file, framework="pt") for file in set(files.values())}
    problems = [f"{name} is missing" for name in params if name not in files]
    problems += [f"{name} is not in the model" for name in files
                 if name not in params and not _derived(name, arch)]
    for name, p in params.items():
        if name in files:
            shape = tuple(handles[files[name]].get_slice(name).get_shape())
            if shape != tuple(p.shape):
                problems.append(f"{name} has shape {list(shape)}, the model {list(p.shape)}")
    if problems:
        raise WeightsError(f"model.init_from: {folder} does not fit {preset}: {'; '.join(problems[:8])}"
                           + (f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""))
    read = 0
    with torch.no_grad():
        for name, p in params.items():
            slice_ = handles[files[name]].get_slice(name)
            if isinstance(p, DTensor):  # this rank's block of the global tensor, as DTensor's placements cut it
                local = p.to_local()
                shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
                part = slice_[tuple(slice(o, o + n) for o, n in zip(offset, shape))] if all(shape) else None
            else:
                local, part = p, slice_[:]
            if part is not None:
                local.copy_(part.reshape(local.shape))
                read += part.numel() * part.element_size()
    config = (folder / "config.json").read_bytes()
    return {"path": str(folder), "config_sha256": hashlib.sha256(config).hexdigest(),
            "files": {file.name: file.stat().st_size for file in sorted(set(files.values()))},
            "bytes_read_by_rank": read}


def _derived(name: str, arch: Architecture) -> bool:
    """Tensors a checkpoint may carry that the model computes or shares: rotary frequencies, a tied head."""
    return name.endswith("rotary_emb.inv_freq") or (arch.tied_embeddings and name == "lm_head.weight")
