"""A model's training config from its one entry in the settings: the recipe (how to train) with the entry's
preset, data, tokenizer, seq_len, global batch, steps and overrides (what to train), checked by the
trainer's own config model, plus ``checkpoint.snapshot_every``: the most steps whose estimated time
(``training.sizing.throughput`` at ``plan.mfu``) fits in ``goodput.snapshot_minutes``, unless the entry's overrides
set it. The plan sizes the models from it; model_jobs.py writes it into the jobs bundle.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

from training.models.architecture import Architecture, ArchitectureError  # torch-free, from jobs/
from training.config import Config, ConfigError, read_config_file, set_key, validate_config
from training.models.presets import resolve
from training.sizing.throughput import StepEstimate, estimate_mfu

from cluster_config.hardware import gpu_of
from cluster_config.settings import ModelPlan, Settings, SettingsError

REPO_ROOT = Path(__file__).resolve().parent.parent
RECIPES = REPO_ROOT / "jobs/training/configs"


def _under_data(path: str) -> str:
    """A path the settings give relative to the data file system, as the jobs see it (${FSX_DATA})."""
    return path if path.startswith("/") else f"${{FSX_DATA}}/{path.strip('/')}"


def architecture(settings: Settings, model: ModelPlan) -> Architecture:
    """The architecture the entry's ``preset`` names, read here at synth as the trainer reads it on the
    cluster (training/models/presets.py: a shorthand, a shipped config.json by name, or an absolute path);
    SettingsError naming the entry, the field and the fix."""
    where = f"cluster_config/{settings.name}.yaml models: {model.name}"
    try:
        return resolve(model.preset)
    except ArchitectureError as exc:
        if model.preset.startswith("/") and not Path(model.preset).exists():
            fix = (f"the plan sizes the model from its config.json at synth, on this machine, where "
                   f"{model.preset} is not: ship the config.json as jobs/training/architectures/<name>/config.json "
                   "and set preset: <name>")
        elif model.preset.startswith("/"):
            fix = "set preset: to a supported architecture (docs/training.md, Your own model)"
        else:
            fix = ("set preset: to one of those, or ship the config.json as "
                   "jobs/training/architectures/<name>/config.json and set preset: <name>")
        raise SettingsError(f"{where}: preset: {exc} — {fix}") from None


def vocabulary(settings: Settings, model: ModelPlan, cfg: Config) -> int:
    """The vocabulary the model trains with: its architecture's (a config.json fixes it), else the training
    config's model.vocab_size, else plan.vocab_size (the tokenizer's, which the job reads on the cluster)."""
    return architecture(settings, model).vocab or cfg.model.vocab_size or settings.plan.vocab_size


def training_config(settings: Settings, model: ModelPlan) -> dict:
    """The config ``jobs/train_<model>.sh`` trains with; SettingsError names the entry and the fix."""
    where = f"cluster_config/{settings.name}.yaml models: {model.name}"
    architecture(settings, model)  # before the recipe named after it: an unknown preset is the error to report
    recipe = RECIPES / f"{model.recipe_name}.yaml"
    if not recipe.is_file():
        known = ", ".join(sorted(path.stem for path in RECIPES.glob("*.yaml")))
        key = "recipe" if model.recipe else "preset (no recipe named like it)"
        raise SettingsError(f"{where}: {key} {model.recipe_name!r} has no recipe {recipe.relative_to(REPO_ROOT)}; "
                            f"set recipe: to one of {known}, or add that file")
    config: dict = {"name": model.name, "model": {"preset": model.preset}}  # first in the file: what it trains
    for section, values in read_config_file(recipe).items():
        if isinstance(values, dict):
            config.setdefault(section, {}).update(copy.deepcopy(values))
        else:
            config[section] = values
    facts = {
        "name": model.name,
        "model.preset": model.preset,
        "data.path": _under_data(model.dataset),
        "data.tokenizer": _under_data(model.tokenizer),
        "data.seq_len": model.seq_len,
        "train.steps": model.steps,
        "train.global_batch_size": model.global_batch_size,
    }
    try:
        for key, value in {**facts, **model.overrides}.items():
            set_key(config, key, value)
        # The trainer's own checks, at the model's world size: what the job would refuse at its start.
        cfg = validate_config(config)
        if not model.megatron:  # Megatron-LM lays the batch out its own way (cluster_config/megatron.py checks it)
            cfg.grad_accum_steps(model.nodes * settings.gpu_queue.gpus_per_instance)
    except ConfigError as exc:
        raise SettingsError(f"{where}: {exc} (the entry, its overrides, or {recipe.relative_to(REPO_ROOT)})") from None
    if SNAPSHOT_KEY not in model.overrides:  # an override (0: off) is the entry's own choice
        every = snapshot_every(settings, model, cfg)
        if every:
            config.setdefault("checkpoint", {})["snapshot_every"] = every
    return config


SNAPSHOT_KEY = "checkpoint.snapshot_every"


def step_estimate(settings: Settings, model: ModelPlan, cfg: Config) -> StepEstimate | None:
    """One training step of ``cfg`` on the model's nodes at ``plan.mfu`` (``training.sizing.throughput``);
    None without GPU figures for the instance type."""
    gpu = gpu_of(settings)
    if gpu is None:
        return None
    queue = settings.gpu_queue
    return estimate_mfu(architecture(settings, model), cfg.train, vocab=vocabulary(settings, model, cfg),
                        seq_len=cfg.data.seq_len, gpus=model.nodes * queue.gpus_per_instance,
                        gpus_per_node=queue.gpus_per_instance, peak_tflops=gpu.peak_tflops,
                        node_link_gb_s=gpu.node_link_gb_s, network_gb_s=gpu.network_gb_s, compute_mfu=settings.plan.mfu)


def snapshot_every(settings: Settings, model: ModelPlan, cfg: Config) -> int:
    """Steps between two in-memory snapshots: the most whose estimated time fits in ``goodput.snapshot_minutes``
    (1 at least); 0 (off) without a step time to size it from."""
    step = step_estimate(settings, model, cfg)
    if step is None or step.step_s <= 0:
        return 0
    return max(1, math.floor(settings.goodput.snapshot_minutes * 60 / step.step_s))


def model_config(settings: Settings, model: ModelPlan) -> Config:
    """``training_config`` with every default filled in, as the trainer will read it."""
    return validate_config(training_config(settings, model))
