"""One typed training config: a YAML file plus ``section.key=value`` overrides from the command line.

    python -m training.train --config jobs/training/configs/model1.yaml train.steps=200 checkpoint.every=50

Every value is checked here, once; a bad one fails with the field name and the fix. Paths may use
environment variables (``${FSX_DATA}``); empty directory fields default to the per-model tree under
``$FSX_CHECKPOINTS/<name>`` and ``$FSX_LOGS/<name>`` (see docs/training.md).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args, get_origin, get_type_hints

import yaml

from .models import PRESETS


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field and the fix."""


@dataclass
class ModelConfig:
    preset: str = "tiny"
    vocab_size: int = 0  # 0: the dataset's vocabulary, rounded up to a multiple of 64


@dataclass
class DataConfig:
    path: str = "${FSX_DATA}/tokenized"  # where jobs/preprocess.sh writes by default
    seq_len: int = 256
    num_workers: int = 2
    seed: int = 0


@dataclass
class OptimConfig:
    lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0


@dataclass
class TrainConfig:
    steps: int = 1000
    global_batch_size: int = 64  # sequences per optimizer step, over all ranks
    micro_batch_size: int = 4  # sequences per rank per forward/backward
    parallelism: Literal["ddp", "fsdp"] = "fsdp"
    activation_checkpointing: bool = False  # recompute each layer's activations in backward
    seed: int = 0
    timeout_s: int = 600  # collective timeout: a dead peer ends the job after this at the latest


@dataclass
class CheckpointConfig:
    dir: str = ""  # default: $FSX_CHECKPOINTS/<name>
    every: int = 500  # steps between saves
    keep: int = 3  # complete checkpoints kept on disk
    async_save: bool = True


@dataclass
class LogConfig:
    dir: str = ""  # default: $FSX_LOGS/<name>
    tensorboard_dir: str = ""  # default: <log.dir>/tensorboard
    interval: int = 10  # steps between metric lines
    wandb_project: str = ""  # used only when WANDB_API_KEY is set


@dataclass
class Config:
    name: str = "model1"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def grad_accum_steps(self, world_size: int) -> int:
        per_step = self.train.micro_batch_size * world_size
        if self.train.global_batch_size % per_step:
            raise ConfigError(
                f"train.global_batch_size {self.train.global_batch_size} is not a multiple of "
                f"train.micro_batch_size x world size = {self.train.micro_batch_size} x {world_size}; "
                f"use a multiple of {per_step}"
            )
        return self.train.global_batch_size // per_step


def load_config(path: str | os.PathLike | None = None, overrides: list[str] = ()) -> Config:
    """Defaults, then the YAML file, then ``section.key=value`` overrides; validated and resolved."""
    raw: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist; see jobs/training/configs/ for examples")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} is not section.key=value, e.g. train.steps=100")
        *sections, leaf = key.split(".")
        node = raw
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = yaml.safe_load(value)
    config = _build(Config, raw, "")
    _validate(config)
    return _resolve_paths(config)


def _build(cls, raw: dict, where: str):
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(raw) - known
    if unknown:
        name = f"{where}{sorted(unknown)[0]}"
        raise ConfigError(f"unknown config key {name!r}; allowed here: {', '.join(sorted(known))}")
    values = {}
    for name, value in raw.items():
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}{name}: expected a mapping of {', '.join(f.name for f in dataclasses.fields(kind))}")
            values[name] = _build(kind, value, f"{where}{name}.")
        else:
            values[name] = _check_type(f"{where}{name}", kind, value)
    return cls(**values)


def _check_type(name: str, kind, value):
    if get_origin(kind) is Literal:
        if value not in get_args(kind):
            raise ConfigError(f"{name}: {value!r} is not one of {', '.join(map(str, get_args(kind)))}")
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{name}: expected {kind.__name__}, got {value!r}")
    return value


def _validate(c: Config) -> None:
    if c.model.preset not in PRESETS:
        raise ConfigError(f"model.preset: unknown preset {c.model.preset!r}; choose one of {', '.join(PRESETS)}")
    positive = {
        "data.seq_len": c.data.seq_len, "train.steps": c.train.steps,
        "train.global_batch_size": c.train.global_batch_size, "train.micro_batch_size": c.train.micro_batch_size,
        "checkpoint.every": c.checkpoint.every, "checkpoint.keep": c.checkpoint.keep,
        "log.interval": c.log.interval, "optim.lr": c.optim.lr, "train.timeout_s": c.train.timeout_s,
    }
    for name, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{name}: must be > 0, got {value}")
    for name, value in {"model.vocab_size": c.model.vocab_size, "data.num_workers": c.data.num_workers,
                        "optim.warmup_steps": c.optim.warmup_steps, "optim.min_lr": c.optim.min_lr,
                        "optim.weight_decay": c.optim.weight_decay, "optim.grad_clip": c.optim.grad_clip}.items():
        if value < 0:
            raise ConfigError(f"{name}: must be >= 0, got {value}")
    if c.optim.min_lr > c.optim.lr:
        raise ConfigError(f"optim.min_lr {c.optim.min_lr} is above optim.lr {c.optim.lr}; lower min_lr")
    if c.optim.warmup_steps >= c.train.steps:
        raise ConfigError(f"optim.warmup_steps {c.optim.warmup_steps} must be below train.steps {c.train.steps}")
    if c.train.global_batch_size % c.train.micro_batch_size:
        raise ConfigError(
            f"train.global_batch_size {c.train.global_batch_size} is not a multiple of "
            f"train.micro_batch_size {c.train.micro_batch_size}"
        )


def _resolve_paths(c: Config) -> Config:
    def expand(value: str, name: str) -> str:
        expanded = os.path.expandvars(value)
        if "$" in expanded:
            raise ConfigError(f"{name}: {value!r} uses an unset environment variable; export it or write the path")
        return expanded

    c.data.path = expand(c.data.path, "data.path")
    c.checkpoint.dir = expand(c.checkpoint.dir or f"${{FSX_CHECKPOINTS}}/{c.name}", "checkpoint.dir")
    c.log.dir = expand(c.log.dir or f"${{FSX_LOGS}}/{c.name}", "log.dir")
    c.log.tensorboard_dir = expand(c.log.tensorboard_dir or f"{c.log.dir}/tensorboard", "log.tensorboard_dir")
    return c
