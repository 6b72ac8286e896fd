"""float8 training for the decoder layers' projections: torchao's float8 linear layers, and FSDP2's float8
all-gather of their weights (``train.float8``).

Each projection's matmul runs in float8 with dynamic scales (tensorwise: one scale per tensor; rowwise: one
per row, closer to bf16 and slower); master weights, optimizer state and everything else stay as they are.
With tensorwise scaling FSDP also gathers those weights in float8 (half of bf16's bytes); rowwise gathers
bf16. Layers kept in bf16 (``keep_in_bf16``): the output head (its logits feed the loss, where float8's
rounding costs most), the embeddings (a lookup, no matmul), and projections with a side below
``MIN_FEATURES`` or not a multiple of 16 (float8's matmul needs multiples of 16; on small matrices the casts
cost more than the matmul saves). torchtitan's recipe (its float8 converter) and torchao's own filters.

Needs a CUDA GPU with fp8 tensor cores (compute capability 8.9+: L4/L40S, H100, H200) and torchao
(requirements-float8.txt, apart from the jobs' requirements): refused otherwise, naming what is missing. The
dry run (modelling the GPU job on a CPU) sizes the layers in bf16.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch
from torch import nn

from training.config import ConfigError

FP8_CAPABILITY = (8, 9)  # Ada and Hopper: the first with fp8 tensor cores
MIN_FEATURES = 1024  # a projection with a side below this stays bf16
KEEP_BF16_NAMES = ("lm_head", "embed_tokens")  # by name: the output head and the embeddings


def refusal(device: torch.device) -> str | None:
    """Why float8 training cannot run on ``device`` (None: it can)."""
    if device.type != "cuda":
        return why_not(device.type, None, "", torchao_missing())
    return why_not("cuda", torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device),
                   torchao_missing())


def torchao_missing() -> str | None:
    """Why torchao's float8 does not import here (None: it does). On the cluster torchao lies apart from the
    jobs' venv, in ``FLOAT8_PACKAGES`` (jobs/env.sh; node_scripts/directory_setup.sh installs it): it joins the
    path only here, so that a run without float8 never imports it (transformers imports torchao when it can)."""
    packages = os.environ.get("FLOAT8_PACKAGES", "")
    if packages and os.path.isdir(packages) and packages not in sys.path:
        sys.path.append(packages)
    try:
        import torchao.float8  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def why_not(device_type: str, capability: tuple[int, int] | None, name: str, torchao_error: str | None) -> str | None:
    """The refusal for a device of this type, compute capability and name, with torchao importing or not."""
    need = f"{FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]}"
    if device_type != "cuda":
        return (f"train.float8 needs a CUDA GPU with fp8 tensor cores (compute capability {need}+: H100, H200); "
                f"this rank runs on {device_type}: set train.float8: off")
    if capability < FP8_CAPABILITY:
        return (f"train.float8 needs fp8 tensor cores (compute capability {need}+: H100, H200); {name} has "
                f"{capability[0]}.{capability[1]}: set train.float8: off")
    if torchao_error:
        return (f"train.float8 needs torchao, which does not import here ({torchao_error}): install "
                "requirements-float8.txt into FLOAT8_PACKAGES (the node setup does, on the cluster) or the jobs' Python, or set "
                "train.float8: off")
    return None


def keep_in_bf16(module: nn.Module, name: str, min_features: int = MIN_FEATURES) -> bool:
    """Whether the linear layer ``name`` stays bf16 (see the module's docstring)."""
    if any(part in KEEP_BF16_NAMES for part in name.split(".")):
        return True
    sides = (module.in_features, module.out_features)
    return any(side < min_features or side % 16 for side in sides)


def float8_config(recipe: str, *, sharded: bool, emulate: bool = False):
    """torchao's config of ``recipe`` (tensorwise, rowwise); ``sharded``: FSDP2 gathers tensorwise weights in float8.
    ``emulate``: the float8 matmul emulated in higher precision (CPU tests: the same casts and scales)."""
    from torchao.float8 import Float8LinearConfig

    if recipe == "tensorwise":
        return Float8LinearConfig(enable_fsdp_float8_all_gather=sharded, emulate=emulate)
    if recipe == "rowwise":  # torchao gathers rowwise weights in bf16: float8 all-gather is tensorwise only
        config = Float8LinearConfig.from_recipe_name("rowwise")
        return dataclasses.replace(config, emulate=emulate)
    raise ConfigError(f"train.float8 {recipe!r}: expected off, tensorwise or rowwise")


def convert(model: nn.Module, recipe: str, device: torch.device, *, sharded: bool, emulate: bool = False,
            min_features: int = MIN_FEATURES) -> list[str]:
    """Swap the decoder layers' projections for float8 ones, in place (before tensor parallel and FSDP wrap
    them); returns the converted layers' names. ConfigError where the device cannot take float8
    (``emulate``: the numerics on any device, for tests)."""
    why = None if emulate else refusal(device)
    if why:
        raise ConfigError(why)
    from torchao.float8 import convert_to_float8_training

    converted: list[str] = []

    def take(module: nn.Module, name: str) -> bool:
        if not isinstance(module, nn.Linear) or keep_in_bf16(module, name, min_features):
            return False
        converted.append(name)
        return True

    convert_to_float8_training(model, config=float8_config(recipe, sharded=sharded, emulate=emulate),
                               module_filter_fn=take)
    return converted
