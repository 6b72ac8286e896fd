"""Measured collectives of each production layout against the analytic minimum (training.communication).

A layout is measured twice, with 1 and with 2 decoder layers: the difference is one decoder layer's
collectives, the rest (embedding, output projection, loss) what the 1-layer model does besides it.
The whole model's step is then ``accumulation`` micro-batches of ``preset.layers`` layers plus the
rest, and the optimizer step, exactly as the job runs them; the analytic minimum is
``layer_traffic`` / ``step_traffic`` of the same shape and layout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from training.communication import Traffic, layer_traffic, step_traffic
from training.dry_run import DEFAULT_VOCAB, load_model_config, production_setup
from training.presets import PRESETS

from .measure import PHASES, Phase, measure

DP = ("dp_shard", "dp_replicate")  # the data-parallel dimensions (FSDP's shards, HSDP's replicas)


def production_layouts(env: str = "prod") -> list[str]:
    """One model per distinct job of ``env`` (model1/2, 3/4, 5/6 train the same recipe on other data)."""
    from cluster_config.settings import load_settings

    seen, models = set(), []
    for plan in load_settings(env).models:
        raw, world_size, _ = production_setup(plan.name, env)
        cfg = load_model_config(raw)
        key = (cfg.model.preset, cfg.train.model_dump_json(), cfg.data.seq_len, world_size)
        if key not in seen:
            seen.add(key)
            models.append(plan.name)
    return models


@dataclass
class LayoutReport:
    model: str
    preset: str
    layout: str
    world_size: int
    micro_batch_size: int
    accumulation: int
    seq_len: int
    layers: int  # of the real model (the measurement used 1 and 2)
    activation_checkpointing: bool
    per_layer: dict[str, Traffic]  # measured, one decoder layer: "micro_batch", "last_micro_batch"
    per_layer_forward: dict[str, Traffic]  # the part of it issued in forward
    per_layer_analytic: dict[str, Traffic]
    two_layers: dict[str, Phase]  # the 2-layer model's every collective, by phase
    step: Traffic  # measured, extrapolated to the real model's layers
    step_analytic: Traffic
    seconds: float

    def layer_step(self, analytic: bool = False) -> Traffic:
        """One decoder layer over a whole step (accumulation - 1 micro-batches, then the last)."""
        per = self.per_layer_analytic if analytic else self.per_layer
        return per["micro_batch"] * (self.accumulation - 1) + per["last_micro_batch"]

    def ratios(self) -> dict[str, dict[str, float | None]]:
        """Measured bytes / analytic minimum bytes, tensor-parallel and data-parallel apart (None: neither has any)."""
        out = {}
        for scope, measured, analytic in (("layer", self.layer_step(), self.layer_step(True)),
                                          ("step", self.step, self.step_analytic)):
            out[scope] = {}
            for name, dims in (("tp", ("tp",)), ("dp", DP)):
                m, a = measured.bytes(dims), analytic.bytes(dims)
                out[scope][name] = None if not m and not a else (m / a if a else float("inf"))
        return out

    def as_dict(self) -> dict:
        return {
            "model": self.model, "preset": self.preset, "layout": self.layout, "world_size": self.world_size,
            "micro_batch_size": self.micro_batch_size, "accumulation": self.accumulation, "seq_len": self.seq_len,
            "layers": self.layers, "activation_checkpointing": self.activation_checkpointing,
            "per_layer_per_micro_batch": {
                phase: {"measured": self.per_layer[phase].as_dict(),
                        "measured_in_forward": self.per_layer_forward[phase].as_dict(),
                        "analytic": self.per_layer_analytic[phase].as_dict()}
                for phase in ("micro_batch", "last_micro_batch")},
            "per_step_whole_model": {"measured": self.step.as_dict(), "analytic": self.step_analytic.as_dict()},
            "ratio_measured_over_analytic": self.ratios(),
            "two_layer_model": {phase: {"collectives": self.two_layers[phase].traffic.as_dict(),
                                        "comm_debug_mode_count": self.two_layers[phase].debug_mode_count}
                                for phase in PHASES},
            "seconds": round(self.seconds, 1),
        }


def compare(model: str, env: str = "prod", *, world_size: int | None = None) -> LayoutReport:
    """Measure ``model``'s job of ``env`` (at its world size unless given) and hold it against the minimum."""
    start = time.perf_counter()
    raw, planned, _ = production_setup(model, env)
    cfg = load_model_config(raw)
    world_size = world_size or planned
    vocab = cfg.model.vocab_size or DEFAULT_VOCAB
    one, two = (measure(cfg, world_size, layers=n, vocab_size=vocab) for n in (1, 2))
    per_layer = {phase: two[phase].traffic - one[phase].traffic for phase in ("micro_batch", "last_micro_batch")}
    forward = {phase: two[phase].forward - one[phase].forward for phase in per_layer}
    rest = {phase: one[phase].traffic - per_layer[phase] for phase in per_layer}

    preset, train, tp = PRESETS[cfg.model.preset], cfg.train, cfg.train.tensor_parallel
    accumulation = cfg.grad_accum_steps(world_size)
    shape = dict(micro_batch=train.micro_batch_size, seq_len=cfg.data.seq_len, tp=tp, dp=world_size // tp,
                 parallelism=train.parallelism, hsdp_shard_size=train.hsdp_shard_size,
                 activation_checkpointing=train.activation_checkpointing, grad_reduce=train.grad_reduce)
    analytic = {phase: layer_traffic(preset, last_micro_batch=phase == "last_micro_batch", **shape)
                for phase in per_layer}

    def whole(phase: str) -> Traffic:
        return per_layer[phase] * preset.layers + rest[phase]

    step = whole("micro_batch") * (accumulation - 1) + whole("last_micro_batch") + two["optimizer"].traffic
    layout = {"ddp": "DDP", "fsdp": "FSDP", "hsdp": "HSDP"}[train.parallelism]
    layout = f"{layout} {world_size // tp}" + (f" x TP {tp}" if tp > 1 else "")
    if train.parallelism == "hsdp":
        layout += f" (shards of {train.hsdp_shard_size})"
    return LayoutReport(
        model=model, preset=cfg.model.preset, layout=layout, world_size=world_size,
        micro_batch_size=train.micro_batch_size, accumulation=accumulation, seq_len=cfg.data.seq_len,
        layers=preset.layers, activation_checkpointing=train.activation_checkpointing,
        per_layer=per_layer, per_layer_forward=forward, per_layer_analytic=analytic, two_layers=two, step=step,
        step_analytic=step_traffic(preset, vocab_size=vocab, accumulation=accumulation, **shape),
        seconds=time.perf_counter() - start)
