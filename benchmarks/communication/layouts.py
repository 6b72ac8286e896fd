"""Measured collectives of each production layout against the analytic minimum (training.parallel.communication).

A layout is measured with 1 and 2 decoder layers: the difference is one decoder layer's collectives,
the 1-layer model less that layer what the rest does (embedding, output projection, loss). Where
only every n-th layer is checkpointed (layers 0, n, 2n...), layer 1 is one that is not, and a third
model of n + 1 layers adds the recomputed layer n. The whole model's step is then ``accumulation``
micro-batches of ``preset.layers`` layers of each kind plus the rest, and the optimizer step, as the
job runs them; the analytic minimum is ``layer_traffic`` / ``step_traffic`` of the same shape and layout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cluster_config.model_jobs import bundled_cluster
from training.parallel.communication import Traffic, layer_traffic, recomputed_layers, step_traffic
from training.dry_run import DEFAULT_VOCAB, load_model_config, production_setup
from training.models.presets import resolve

from .measure import PHASES, Phase, measure

DP = ("dp_shard", "dp_replicate")  # the data-parallel dimensions (FSDP's shards, HSDP's replicas)
MICRO_BATCHES = ("micro_batch", "last_micro_batch")  # a micro-batch, the step's last (HSDP's all-reduce)
RECOMPUTED, PLAIN = "recomputed", "plain"  # decoder layers with and without activation checkpointing


def production_layouts(env: str = "prod") -> list[str]:
    """One model per distinct job of ``env`` (model1/2, 3/4, 5/6 train the same recipe on other data)."""
    cluster = bundled_cluster(env)
    seen, models = set(), []
    for name in cluster.models:
        raw, world_size, _ = production_setup(name, cluster)
        cfg = load_model_config(raw)
        key = (cfg.model.preset, cfg.train.model_dump_json(), cfg.data.seq_len, world_size)
        if key not in seen:
            seen.add(key)
            models.append(name)
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
    activation_checkpointing: str  # "off", "on", "1 layer in n"
    layers: dict[str, int]  # the real model's decoder layers by kind (RECOMPUTED, PLAIN)
    per_layer: dict[str, dict[str, Traffic]]  # measured, one decoder layer of each kind, by micro-batch (MICRO_BATCHES)
    per_layer_forward: dict[str, dict[str, Traffic]]  # the part of it issued in forward
    per_layer_analytic: dict[str, dict[str, Traffic]]
    two_layers: dict[str, Phase]  # the 2-layer model's every collective, by phase (PHASES)
    step: Traffic  # measured, extrapolated to the real model's layers
    step_analytic: Traffic
    seconds: float

    def layer_step(self, analytic: bool = False) -> Traffic:
        """Every decoder layer over a whole step (accumulation - 1 micro-batches, then the last)."""
        per = self.per_layer_analytic if analytic else self.per_layer
        total = Traffic()
        for kind, traffic in per.items():
            step = traffic["micro_batch"] * (self.accumulation - 1) + traffic["last_micro_batch"]
            total += step * self.layers[kind]
        return total

    def ratios(self) -> dict[str, dict[str, float | None]]:
        """Measured bytes / analytic minimum bytes, tensor-parallel and data-parallel apart (None: neither has any).

        ``layers``: the decoder layers only; ``step``: the whole model's step."""
        out = {}
        for scope, measured, analytic in (("layers", self.layer_step(), self.layer_step(True)),
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
            "activation_checkpointing": self.activation_checkpointing, "layers": self.layers,
            "per_layer_per_micro_batch": {
                kind: {phase: {"measured": self.per_layer[kind][phase].as_dict(),
                               "measured_in_forward": self.per_layer_forward[kind][phase].as_dict(),
                               "analytic": self.per_layer_analytic[kind][phase].as_dict()}
                       for phase in MICRO_BATCHES}
                for kind in self.per_layer},
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
    raw, planned, _ = production_setup(model, bundled_cluster(env))
    cfg = load_model_config(raw)
    train, preset = cfg.train, resolve(cfg.model.preset)
    world_size = world_size or planned
    vocab = preset.vocab or cfg.model.vocab_size or DEFAULT_VOCAB
    checkpointing = train.activation_checkpointing
    every = train.activation_checkpointing_every if checkpointing else 1
    runs = {n: measure(cfg, world_size, layers=n, vocab_size=vocab) for n in sorted({1, 2, every + 1})}

    def layers_and_rest(part: str) -> tuple[dict[str, dict[str, Traffic]], dict[str, Traffic]]:
        """One layer of each kind, and the rest of the model, by micro-batch, from ``Phase.<part>``."""
        per, rest = {}, {}
        for phase in MICRO_BATCHES:
            m = {n: getattr(run[phase], part) for n, run in runs.items()}
            layer1 = m[2] - m[1]  # layer 0 is recomputed when checkpointing; layer 1 only if every layer is
            if every == 1:
                per.setdefault(RECOMPUTED if checkpointing else PLAIN, {})[phase] = layer1
                rest[phase] = m[1] - layer1
            else:  # layers 1 .. every - 1 plain, layer ``every`` recomputed
                recomputed = m[every + 1] - m[1] - layer1 * (every - 1)
                per.setdefault(PLAIN, {})[phase] = layer1
                per.setdefault(RECOMPUTED, {})[phase] = recomputed
                rest[phase] = m[1] - recomputed
        return per, rest

    per_layer, rest = layers_and_rest("traffic")
    forward, _ = layers_and_rest("forward")
    recomputed = recomputed_layers(preset.layers, checkpointing, every)
    layers = {kind: n for kind, n in ((RECOMPUTED, recomputed), (PLAIN, preset.layers - recomputed)) if n}
    tp, accumulation = train.tensor_parallel, cfg.grad_accum_steps(world_size)
    shape = dict(micro_batch=train.micro_batch_size, seq_len=cfg.data.seq_len, tp=tp, dp=world_size // tp,
                 parallelism=train.parallelism, hsdp_shard_size=train.hsdp_shard_size, grad_reduce=train.grad_reduce)
    analytic = {kind: {phase: layer_traffic(preset, activation_checkpointing=kind == RECOMPUTED,
                                            last_micro_batch=phase == "last_micro_batch", **shape)
                       for phase in MICRO_BATCHES}
                for kind in per_layer}

    def whole(phase: str) -> Traffic:
        total = rest[phase]
        for kind, n in layers.items():
            total += per_layer[kind][phase] * n
        return total

    step = whole("micro_batch") * (accumulation - 1) + whole("last_micro_batch") + runs[2]["optimizer"].traffic
    layout = {"ddp": "DDP", "fsdp": "FSDP", "hsdp": "HSDP"}[train.parallelism]
    layout = f"{layout} {world_size // tp}" + (f" x TP {tp}" if tp > 1 else "")
    if train.parallelism == "hsdp":
        layout += f" (shards of {train.hsdp_shard_size})"
    return LayoutReport(
        model=model, preset=cfg.model.preset, layout=layout, world_size=world_size,
        micro_batch_size=train.micro_batch_size, accumulation=accumulation, seq_len=cfg.data.seq_len,
        activation_checkpointing="off" if not checkpointing else "on" if every == 1 else f"1 layer in {every}",
        layers=layers, per_layer=per_layer, per_layer_forward=forward, per_layer_analytic=analytic,
        two_layers=runs[2], step=step,
        step_analytic=step_traffic(preset, vocab_size=vocab, accumulation=accumulation,
                                   activation_checkpointing=checkpointing, activation_checkpointing_every=every,
                                   **shape),
        seconds=time.perf_counter() - start)
