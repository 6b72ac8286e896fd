"""One typed training config: a YAML file plus ``section.key=value`` overrides from the command line.

    python -m training.train --config jobs/models/model1.yaml train.steps=200 checkpoint.every=50

Every value is checked here, once, by pydantic models (as ``cluster_config/settings.py`` checks the
settings); a bad one fails with the key's name and the fix; ``--help`` lists every key with its
default. Paths may use environment variables (``${FSX_DATA}``); empty directory fields default to
the per-model tree under ``$FSX_CHECKPOINTS/<name>`` and ``$FSX_LOGS/<name>`` (see docs/training.md).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from training.models.architecture import ArchitectureError
from training.models.presets import resolve  # torch-free: the cluster settings check configs with this module


MODEL_CONFIGS = Path(__file__).resolve().parents[1] / "models"  # jobs/models/<model>.yaml, derived from the settings

# What makes a run a model's own: its name, the folders named after it (where jobs/train.sh reads the
# run's STATUS and FAILURE) and the data its settings entry gives it. Overridden, a model's job would
# write into another model's checkpoints or train on another's data. A model's job (``load_config(...,
# model=...)``) takes them from the model's own config, jobs/models/<model>.yaml: it refuses them as
# arguments, refuses a config file that names another model or sets the folders, and refuses a config
# whose data.path is not the own config's; the settings refuse them as a model's overrides.
IDENTITY_KEYS = ("name", "checkpoint.dir", "log.dir", "log.tensorboard_dir", "data.path")
MODEL_FOLDERS = ("checkpoint.dir", "log.dir", "log.tensorboard_dir")  # empty: derived from the name
# What a run reads besides its data. A model's job reads no other model's data, checkpoints or exports
# through them, unless its own config (its settings entry) names that same path: sharing is the settings'
# decision. Folders of no model (/fsx/data/weights/, released weights) are anyone's.
READ_KEYS = ("eval.path", "model.init_from")


def model_config_file(model: str) -> Path:
    """The model's own training config, derived from its settings entry and shipped in the jobs bundle."""
    return MODEL_CONFIGS / f"{model}.yaml"


def cluster_models() -> list[str]:
    """The models of this cluster: those with a config in the jobs bundle."""
    return sorted(path.stem for path in MODEL_CONFIGS.glob("*.yaml"))


def overridden(key: str, keys: tuple[str, ...]) -> Optional[str]:
    """The first of ``keys`` an override of ``key`` sets: the key itself, or one in the section it replaces."""
    return next((k for k in keys if k == key or k.startswith(key + ".")), None)


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field and the fix."""


class _Section(BaseModel):
    # Unknown keys are typos; YAML numbers given to a text field (name: 7) are read as text.
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_as_numbers(cls, value, info):
        if isinstance(value, bool) and cls.model_fields[info.field_name].annotation in ("int", "float", int, float):
            raise ValueError("expected a number, got a boolean")
        return value


class ModelConfig(_Section):
    preset: str = Field("tiny", description="the architecture: a shorthand (training/models/presets.py), a Hugging Face "
                        "config shipped in jobs/training/architectures/ by its folder's name (llama3.1-8b), or an "
                        "absolute path to a config.json or its folder")
    vocab_size: int = Field(0, ge=0, description="0: the architecture's vocabulary if its config.json gives one, "
                            "else the dataset's, rounded up to a multiple of 64")
    init_from: str = Field("", description="a Hugging Face checkpoint folder (config.json + *.safetensors) whose "
                           "weights start the run (continued pre-training): each rank reads only its slices; the "
                           "data order and the optimizer start fresh. Used only when the run has no checkpoint yet")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        try:
            resolve(value)
        except ArchitectureError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _vocabulary(self) -> ModelConfig:
        fixed = resolve(self.preset).vocab
        if fixed and self.vocab_size and self.vocab_size != fixed:
            raise ValueError(f"model.vocab_size {self.vocab_size} differs from {self.preset}'s vocabulary ({fixed}); "
                             f"remove model.vocab_size (the architecture's config.json sizes it)")
        return self


class DataConfig(_Section):
    path: str = Field("${FSX_DATA}/tokenized", description="token shards (where jobs/preprocess.sh writes by default)")
    seq_len: int = Field(256, gt=0, description="tokens per sequence; must match the dataset")
    tokenizer: str = Field("", description="the tokenizer the dataset must be made with (preflight checks it); "
                                           "'': whichever the dataset names")
    num_workers: int = Field(2, ge=0, description="data-loader worker processes per rank")
    timeout_s: int = Field(300, ge=0, description="a batch slower than this (a stalled read) is an error; 0: wait")
    seed: int = Field(0, description="shuffle seed")


class OptimConfig(_Section):
    lr: float = Field(3e-4, gt=0, description="peak learning rate")
    min_lr: float = Field(3e-5, ge=0, description="learning rate at the end of the cosine decay")
    warmup_steps: int = Field(100, ge=0, description="linear warm-up steps")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay")
    beta1: float = Field(0.9, description="AdamW beta1")
    beta2: float = Field(0.95, description="AdamW beta2")
    grad_clip: float = Field(1.0, ge=0, description="gradient-norm clip")
    fused: bool = Field(False, description="AdamW's fused CUDA kernel (one launch for every parameter) instead of "
                        "its foreach kernels; ignored on CPU, with a log line")


class TrainConfig(_Section):
    steps: int = Field(1000, gt=0, description="optimizer steps in the whole run")
    global_batch_size: int = Field(64, gt=0, description="sequences per optimizer step, over all ranks")
    micro_batch_size: int = Field(4, gt=0, description="sequences per rank per forward/backward")
    parallelism: Literal["ddp", "fsdp", "hsdp"] = Field(
        "fsdp", description="ddp, fsdp (shard over all data-parallel ranks) or hsdp (shard within hsdp_shard_size "
        "ranks, replicate across them)")
    hsdp_shard_size: int = Field(8, gt=0, description="hsdp: data-parallel ranks one model copy is sharded over")
    tensor_parallel: int = Field(1, gt=0, description="tensor-parallel ranks per model copy (within a node; fsdp/hsdp)")
    grad_reduce: Literal["every_micro_batch", "last_micro_batch"] = Field(
        "every_micro_batch", description="fsdp/hsdp: reduce-scatter gradients after every micro-batch, or keep "
        "unsharded fp32 gradients (4 B x parameters per GPU) and reduce once per step; ddp always reduces once")
    reduce_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="fsdp/hsdp on GPU: the dtype gradients are reduce-scattered (and HSDP all-reduced) in; "
        "bfloat16 halves those bytes and sums in bf16 (fp32 keeps every rank's full precision)")
    float8: Literal["off", "tensorwise", "rowwise"] = Field(
        "off", description="torchao's float8 linear layers for the decoder layers' projections "
        "(training/parallel/float8.py): tensorwise scaling also all-gathers FSDP's weights in float8; rowwise "
        "scales each row (closer to bf16, slower). The output head, the embeddings and small layers stay bf16. "
        "Needs a GPU with fp8 (compute capability 8.9+: H100, H200) and torchao")
    loss_chunks: int = Field(1, gt=0, description="cross-entropy over this many slices of the sequence, each "
                             "recomputed in backward: no fp32 copy of the whole micro-batch's logits (1: one piece)")
    activation_checkpointing: bool = Field(False, description="recompute each layer's activations in backward")
    activation_checkpointing_every: int = Field(
        1, gt=0, description="with activation_checkpointing: only every n-th decoder layer (1: all; 4: layers 0, 4, "
        "8...), trading memory for less recomputation (torchtitan's selective layer checkpointing)")
    compile: Optional[bool] = Field(None, description="torch.compile each decoder layer; default: on GPU, off on CPU")
    async_tp: bool = Field(False, description="tensor parallel: overlap its all-gathers and reduce-scatters with the "
                           "matmuls (torch.compile's micro-pipeline pass, symmetric memory over NVLink; GPU only)")
    seed: int = Field(0, description="weight-initialization seed")
    deterministic: bool = Field(False, description="deterministic kernels (training/components/determinism.py): a resumed run "
                                "repeats an uninterrupted one's losses bit for bit on GPU too. Costs speed: no cuDNN "
                                "attention, flash attention's slower deterministic backward, a fixed cuBLAS "
                                "workspace, DDP's all-reduce one parameter at a time; off for training, on in the "
                                "acceptance drill")
    init_timeout_s: int = Field(300, gt=0, description="collective timeout until the first step is done (start-up)")
    timeout_s: int = Field(100, gt=0, description="collective timeout after the first step: a dead peer ends the step")
    watchdog_floor_s: float = Field(180, gt=0, description="progress watchdog: shortest window without a step")
    watchdog_factor: float = Field(10, gt=0, description="progress watchdog: window = this x the median step time")
    peer_timeout_s: float = Field(30, ge=0, description="a node whose heartbeat (its local rank 0 writes one to the "
                                  "job's store every sixth of this) is not heard for this long, or a store that does "
                                  "not answer for as long, is lost: every rank exits at once for the job to relaunch, "
                                  "instead of waiting out train.timeout_s (training/resilience/heartbeat.py); above the "
                                  "longest the GIL is held (a snapshot's serialization: seconds); 0: off")
    straggler_margin: float = Field(0.10, gt=0, description="a node this much slower than the median of the others "
                                    "in one cause (gpu and host probes: a fixed workload timed each log interval; "
                                    "storage, network: the interval's data wait, the others' wait for it, as shares) is "
                                    "slow; its ranks' median counts (training/resilience/straggler_rule.py)")
    straggler_intervals: int = Field(3, gt=0, description="intervals of the last straggler_window a node must be slow "
                                     "in to be reported as a straggler (a straggler event and a warning naming node, "
                                     "rank and cause)")
    straggler_window: int = Field(5, gt=0, description="the log intervals straggler_intervals are counted in")
    straggler_evict_cost_s: float = Field(
        0, ge=0, description="wall seconds an eviction costs the run (save, requeue, restart and, with no spare "
        "node free, the wait for a replacement): a straggler is evicted only when its excess x the run's remaining "
        "time is more. 0: always (a spare is free). The model jobs get theirs from the plan (cluster_config/goodput.py)")
    straggler_evict: Optional[bool] = Field(
        None, description="a reported straggler's node is taken out: every rank saves a checkpoint, the straggler's "
        "node is reported to the epilog (drained with the evidence, training/resilience/node_suspect.py) and the run exits to be "
        "requeued onto other nodes, counting against the retry budget; false: reported only. Default: on GPU (the "
        "margin comes from a GPU's measured noise), off on CPU (ranks sharing cores fall far behind with nothing wrong)")
    replica_check_every: int = Field(50, ge=0, description="every n steps and before every checkpoint, parameters and "
                                     "optimizer state are checked unchanged since the optimizer step and, where ranks hold "
                                     "copies (DDP, HSDP, a TP group's unsplit tensors), equal bit for bit "
                                     "(training/resilience/replicas.py): silent data corruption stops the run before it "
                                     "saves; a checkpoint saved without it is not `verified`; 0: off")
    replay_every: int = Field(200, ge=0, description="every n steps the first micro-batch's forward and backward run "
                              "twice and must agree (training/resilience/replay.py): a transient compute error on one "
                              "rank stops the run before the optimizer step; 0: off. On GPU only with "
                              "train.deterministic or a replay_tolerance")
    replay_tolerance: float = Field(0.0, ge=0, description="the replay's allowed relative difference of float64 sums of "
                                    "squares; 0: bit-exact (CPU, or GPU with train.deterministic)")


class CheckpointConfig(_Section):
    dir: str = Field("", description="default: $FSX_CHECKPOINTS/<name>")
    every: int = Field(500, gt=0, description="steps between saves")
    every_minutes: float = Field(0, ge=0, description="also save when this long has passed since the last save; 0: off")
    keep: int = Field(3, gt=0, description="complete checkpoints kept on disk")
    async_save: bool = Field(True, description="write in a background thread; training waits only for the copy to CPU")
    snapshot_every: int = Field(0, ge=0, description="steps between snapshots in node memory, each with a copy on a "
                                "buddy node, that a relaunch in the same job resumes from (training/checkpoints/snapshot.py); 0: off")
    snapshot_dir: str = Field("/dev/shm", description="where the snapshots are kept: the nodes' memory")


class EvalConfig(_Section):
    every: int = Field(0, ge=0, description="steps between validation-loss evaluations (training/components/evaluate.py); 0: none")
    batches: int = Field(0, ge=0, description="micro-batches per rank per evaluation; 0: the rank's whole share")
    path: str = Field("", description="held-out token shards; default: <data.path>/val (tokenize --val-fraction)")


class LogConfig(_Section):
    dir: str = Field("", description="default: $FSX_LOGS/<name>")
    tensorboard_dir: str = Field("", description="default: <log.dir>/tensorboard")
    interval: int = Field(10, gt=0, description="steps between metric lines")
    wandb_project: str = Field("", description="used only when WANDB_API_KEY is set")


class Config(_Section):
    name: str = Field("model1", description="run name: the default checkpoint and log folders")
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        if self.optim.min_lr > self.optim.lr:
            raise ValueError(f"optim.min_lr {self.optim.min_lr} is above optim.lr {self.optim.lr}; lower min_lr")
        if self.optim.warmup_steps >= self.train.steps:
            raise ValueError(f"optim.warmup_steps {self.optim.warmup_steps} must be below train.steps {self.train.steps}")
        if self.train.straggler_intervals > self.train.straggler_window:
            raise ValueError(f"train.straggler_intervals {self.train.straggler_intervals} are counted in the last "
                             f"train.straggler_window {self.train.straggler_window} intervals: raise straggler_window "
                             f"to at least {self.train.straggler_intervals} or lower straggler_intervals")
        if 0 < self.train.peer_timeout_s < 1:
            raise ValueError(f"train.peer_timeout_s {self.train.peer_timeout_s:g}: a beat every sixth of it would "
                             f"load the job's store for nothing (a lost node costs a minute to relaunch); use at least "
                             f"1 s (30 s in prod), or 0 to turn the heartbeats off")
        # Only a peer timeout asked for is refused: one left at its default is simply off under a shorter collective
        # timeout (training/resilience/heartbeat.py start), which finds a lost node as soon.
        if "peer_timeout_s" in self.train.model_fields_set and self.train.peer_timeout_s > self.train.timeout_s:
            raise ValueError(f"train.peer_timeout_s {self.train.peer_timeout_s:g} is above train.timeout_s "
                             f"{self.train.timeout_s}: the collective timeout would end the step first and the "
                             f"heartbeats would find a lost node no sooner; lower peer_timeout_s to at most "
                             f"{self.train.timeout_s}, or 0 to turn them off")
        if self.train.global_batch_size % self.train.micro_batch_size:
            raise ValueError(
                f"train.global_batch_size {self.train.global_batch_size} is not a multiple of "
                f"train.micro_batch_size {self.train.micro_batch_size}"
            )
        tp = self.train.tensor_parallel
        if self.train.reduce_dtype == "bfloat16" and self.train.parallelism == "ddp":
            raise ValueError("train.reduce_dtype bfloat16 is FSDP's mixed-precision reduce; with train.parallelism "
                             "ddp set train.reduce_dtype: float32, or use fsdp or hsdp")
        if self.train.float8 != "off" and self.train.parallelism == "ddp":
            raise ValueError(f"train.float8 {self.train.float8} is wired for FSDP2 (its float8 all-gather); use "
                             f"train.parallelism fsdp or hsdp, or train.float8: off")
        if self.train.async_tp and tp == 1:
            raise ValueError("train.async_tp overlaps tensor-parallel communication: set train.tensor_parallel > 1 "
                             "or train.async_tp: false")
        if tp > 1:
            if self.train.parallelism == "ddp":
                raise ValueError("train.tensor_parallel > 1 needs train.parallelism fsdp or hsdp; ddp replicates whole layers")
            preset = resolve(self.model.preset)
            if preset.tied_embeddings:
                raise ValueError(f"train.tensor_parallel {tp}: {self.model.preset} ties its output projection to its "
                                 f"input embedding, and the tensor-parallel plan shards the two along different "
                                 f"dimensions; use train.tensor_parallel: 1 (the tied models are small: FSDP alone "
                                 f"fits them)")
            for what, n in (("heads", preset.heads), ("key/value heads", preset.kv_heads or preset.heads),
                            ("FFN size", preset.ffn_size)):
                if n % tp:
                    raise ValueError(f"train.tensor_parallel {tp} does not divide preset {self.model.preset}'s "
                                     f"{what} ({n}); use a divisor of it (e.g. 2, 4 or 8)")
            if self.train.async_tp and self.train.compile is False:
                raise ValueError("train.async_tp needs train.compile (the overlap is a compiler pass); remove "
                                 "train.compile: false or set train.async_tp: false")
            if self.train.loss_chunks > 1:
                raise ValueError(f"train.loss_chunks {self.train.loss_chunks} with train.tensor_parallel {tp}: the "
                                 f"loss already runs on vocabulary shards (loss_parallel), no rank holds whole "
                                 f"logits; set train.loss_chunks: 1")
            if self.data.seq_len % tp:  # sequence parallelism splits every sequence over the tensor-parallel ranks
                raise ValueError(f"train.tensor_parallel {tp} does not divide data.seq_len {self.data.seq_len}; "
                                 f"use a seq_len that is a multiple of it")
        return self

    def to_dict(self) -> dict:
        return self.model_dump()

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-batches per step; the tensor-parallel ranks of a model copy share each micro-batch."""
        tp = self.train.tensor_parallel
        if world_size % tp:
            raise ConfigError(f"train.tensor_parallel {tp} does not divide the world size {world_size}; "
                              f"use a divisor of the GPUs per node (8)")
        if self.train.parallelism == "hsdp" and (world_size // tp) % self.train.hsdp_shard_size:
            raise ConfigError(f"train.hsdp_shard_size {self.train.hsdp_shard_size} does not divide the "
                              f"{world_size // tp} data-parallel ranks; use a divisor of it")
        world_size //= tp
        per_step = self.train.micro_batch_size * world_size
        if self.train.global_batch_size % per_step:
            raise ConfigError(
                f"train.global_batch_size {self.train.global_batch_size} is not a multiple of "
                f"train.micro_batch_size x data-parallel ranks = {self.train.micro_batch_size} x {world_size}; "
                f"use a multiple of {per_step}"
            )
        return self.train.global_batch_size // per_step


def load_config(path: str | os.PathLike | dict | None = None, overrides: list[str] = (),
                model: Optional[str] = None) -> Config:
    """Defaults, then the YAML file (or a mapping already read), then ``section.key=value`` overrides;
    validated and resolved. ``model``: the run is that model's job (jobs/train.sh): named after it,
    its folders derived from the name, and none of IDENTITY_KEYS taken from an override."""
    raw: dict = {}
    if isinstance(path, dict):
        raw = copy.deepcopy(path)
    elif path is not None:
        raw = read_config_file(path)
    if model is not None:
        named = raw.get("name")
        if named is not None and str(named) != model:
            raise ConfigError(f"name is {str(named)!r} in {path}: that is {named}'s config, and this is {model}'s job; "
                              f"drop that --config or TRAIN_CONFIG ({model}'s own is {model_config_file(model)}), "
                              f"or remove name: from the file")
        raw["name"] = model
        for key in MODEL_FOLDERS:
            section, leaf = key.split(".")
            if isinstance(raw.get(section), dict) and raw[section].get(leaf):
                raise ConfigError(f"{key} is set in {path}, but {model}'s job keeps its run under {model}'s own "
                                  f"folder (jobs/train.sh looks there); remove {key} from the file")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} is not section.key=value, e.g. train.steps=100")
        identity = overridden(key, IDENTITY_KEYS) if model is not None else None
        if identity:
            raise ConfigError(f"override {item!r}: {identity} is {model}'s own and follows from its settings entry; "
                              f"remove the argument (to train another model, submit jobs/train_<model>.sh)")
        try:
            set_key(raw, key, yaml.safe_load(value))
        except ConfigError as exc:
            raise ConfigError(f"override {item!r}: {exc}") from None
    cfg = _resolve_paths(validate_config(raw))
    if model is not None:
        _check_own(cfg, model, path)
    return cfg


def _check_own(cfg: Config, model: str, given) -> None:
    """A model's job trains on its own config's identity (IDENTITY_KEYS) and reads nothing of another model's
    (READ_KEYS) that its own config does not name; ConfigError naming the key and the fix."""
    own_file = model_config_file(model)
    if not own_file.is_file():
        raise ConfigError(f"model {model!r} is not one of this cluster's models ({', '.join(cluster_models()) or 'none'}): "
                          f"there is no {own_file}; add it to models: in the settings and redeploy")
    own = _model_config(model)
    for key in IDENTITY_KEYS:
        if not _same_path(_value(cfg, key), _value(own, key)):
            raise ConfigError(f"{key} is {_value(cfg, key)} in {given}, but {model}'s is {_value(own, key)} ({own_file}, "
                              f"from its settings entry): a model's job trains on its own data and writes its own "
                              f"folders; remove {key} from the file, or change the model's entry in the settings "
                              f"and redeploy")
    own_data = Path(own.data.path).resolve()
    others = _other_models_folders(model)
    for key in READ_KEYS:
        value = _value(cfg, key)
        if not value or _same_path(value, _value(own, key)):
            continue  # unset, or named by the model's own settings entry: shared on purpose
        target = Path(value).resolve()  # a link of one's own leads where it leads
        if target.is_relative_to(own_data):
            continue
        for other, what, folder in others:
            if target.is_relative_to(Path(folder).resolve()):
                raise ConfigError(f"{key} {value} is {other}'s (its {what}, {folder}): a model's job reads no other "
                                  f"model's data, checkpoints or exports unless its settings entry shares them; point "
                                  f"{key} at a folder of no model's (released weights: ${{FSX_DATA}}/weights/<name>), "
                                  f"or set it in {model}'s entry in the settings (overrides:) and redeploy")


def _model_config(model: str) -> Config:
    """``model``'s own config, resolved as its job resolves it."""
    return _resolve_paths(validate_config({**read_config_file(model_config_file(model)), "name": model}))


def _other_models_folders(model: str) -> list[tuple[str, str, str]]:
    """(model, what, folder) of every other model of the cluster: its data, checkpoints (its exports among them)
    and logs."""
    folders = []
    for other in cluster_models():
        if other == model:
            continue
        try:
            theirs = _model_config(other)
            data = [(other, "data", theirs.data.path)]
        except ConfigError:  # a broken config of another model's (its own jobs refuse it): its folders are still its
            theirs, data = _resolve_paths(Config(name=other)), []
        folders += [*data, (other, "checkpoints", theirs.checkpoint.dir), (other, "logs", theirs.log.dir)]
    return folders


def _value(cfg: Config, key: str) -> str:
    section, _, leaf = key.rpartition(".")
    return getattr(getattr(cfg, section) if section else cfg, leaf)


def _same_path(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b) if a and b else a == b


def read_config_file(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; see jobs/training/configs/ for examples")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return raw


def set_key(raw: dict, key: str, value) -> None:
    """``raw[section][key] = value`` for a dotted ``section.key``, creating the section."""
    *sections, leaf = key.split(".")
    node = raw
    for section in sections:
        node = node.setdefault(section, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{section} is not a section; see --help for the keys")
    node[leaf] = value


def validate_config(raw: dict) -> Config:
    """Every key checked, paths left as written (``${FSX_DATA}`` stays): the settings check uses this."""
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    """One line per problem, each naming the key (``train.steps: ...``) and what to do."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            allowed = ", ".join(_section(error["loc"][:-1]).model_fields)
            lines.append(f"unknown config key {where!r}; remove it or fix the spelling (allowed here: {allowed})")
            continue
        message = error["msg"].removeprefix("Value error, ")
        if where:  # a model-level check names its keys itself
            said = isinstance(error["input"], str) and repr(error["input"]) in message
            got = "" if said else f" (got {error['input']!r})"
            message = f"{where}: {message}{got}"
        lines.append(message)
    return "; ".join(lines)


def _section(loc: tuple) -> type[BaseModel]:
    model = Config
    for part in loc:
        model = model.model_fields[part].annotation
    return model


def config_keys() -> str:
    """Every ``section.key`` with its default and meaning, for ``--help``."""
    lines = []
    for name, field in Config.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            for key, sub in section.model_fields.items():
                lines.append(f"  {name}.{key}={sub.default!r}  {sub.description or ''}".rstrip())
        else:
            lines.append(f"  {name}={field.default!r}  {field.description or ''}".rstrip())
    return "\n".join(lines)


def _resolve_paths(c: Config) -> Config:
    def expand(value: str, name: str) -> str:
        expanded = os.path.expandvars(value)
        if "$" in expanded:
            raise ConfigError(f"{name}: {value!r} uses an unset environment variable; export it or write the path")
        return expanded

    c.data.path = expand(c.data.path, "data.path")
    c.data.tokenizer = expand(c.data.tokenizer, "data.tokenizer")
    c.model.init_from = expand(c.model.init_from, "model.init_from")
    c.eval.path = expand(c.eval.path or f"{c.data.path}/val", "eval.path")
    c.checkpoint.dir = expand(c.checkpoint.dir or f"${{FSX_CHECKPOINTS}}/{c.name}", "checkpoint.dir")
    c.log.dir = expand(c.log.dir or f"${{FSX_LOGS}}/{c.name}", "log.dir")
    c.log.tensorboard_dir = expand(c.log.tensorboard_dir or f"{c.log.dir}/tensorboard", "log.tensorboard_dir")
    return c
