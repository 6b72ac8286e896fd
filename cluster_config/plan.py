"""The multi-model plan: who gets which nodes, how long and how much to finish, whether it fits.

Settings already refuse a plan larger than the GPU queue or its capacity reservations; this module
reports on a valid one (``python -m cluster_config plan --env prod``, and at every synth). Per model
it reads the training config the job runs (derived from the model's entry: cluster_config/model_configs.py)
and works out:

- tokens to train (steps x global batch x seq_len) and training FLOPs (6 x matmul parameters +
  causal attention per token, as MFU counts them in ``jobs/training/components/metrics.py``);
- its MFU, estimated from the layout (``jobs/training/sizing/throughput.py``): the compute at ``plan.mfu`` (the MFU of a
  step whose communication is hidden), plus the recomputation activation checkpointing adds, plus
  the communication that is not hidden (tensor parallel's, on the critical path; data parallel's
  beyond the compute it overlaps), counted by ``jobs/training/parallel/communication.py``; with ``--measured``
  (``read_measured``) the compute runs at the recipe's measured speed and the communication keeps its model
  (``measured_step``); the step table shows per model whether its FSDP/HSDP traffic hides under the compute,
  and a warning gives the fixes where it does not;
- days and dollars to finish at that MFU, flagged when later than ``plan.deadline_days``;
- memory per GPU from the analytic model in ``jobs/training/sizing/memory.py``, against the GPU's memory
  less ``plan.memory_headroom``;
- checkpoint size, how long one save takes at the checkpoint file system's throughput, and how far
  apart saves are; for the cluster, the space every model's checkpoints take at their peak (the
  ``checkpoint.keep`` complete ones + one being written) against the checkpoint file system;
- the datasets' shards (one pass of each model's tokens, once per dataset folder) and their raw text
  against the data file system (docs/data_pipeline.md, Space on /fsx/data);
- snapshots in node memory: the interval its training config takes them at (``checkpoint.snapshot_every``,
  sized by cluster_config/model_configs.py to ``goodput.snapshot_minutes``), and per node the host memory
  they take (its own shards of the parameters and optimizer state and its buddy's copy), beside the async
  checkpoint's pinned staging and the data loaders, against the instance's memory less
  ``plan.host_memory_headroom``;
- goodput (``cluster_config/goodput.py``): expected node failures over its run, the time each costs
  (recovered inside the job onto a hot spare from the snapshots, or requeued: recovery, rework since the
  last checkpoint, waiting for a replacement node when no spare is free), its ETTR and the days to finish
  with failures (these days are the ones checked against ``plan.deadline_days``), flagged below
  ``goodput.min_ettr`` and when the 95th percentile of the finish falls after the Capacity Blocks' end;
  the same at ``goodput.stress_factor`` x the failure rate, and the trade of 1 to 3 hot spares (GPU-hours
  idle against GPU-hours saved) at both rates.

``spares_alternative`` re-sizes the models around N spare nodes (``plan --spares N``).

A model that does not fit in GPU memory or whose snapshots do not fit in host memory, and checkpoints or shards
that overflow their file system are errors
(synth stops: ``stacks/app.py``), as is a model entry whose training config does not validate (a
global batch that does not divide, a bad override); a late model and an under-provisioned data file
system are warnings. Each comes with the fix.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from training.sizing.memory import GIB, RunShape, checkpoint_bytes, memory
from training.sizing.throughput import BUS_EFFICIENCY, StepEstimate
from training.resilience.recovery import fewer_nodes

from cluster_config.goodput import (Goodput, HotSpareTrade, Stragglers, expedited_requeue, goodput, hot_spare_trade,
                                    mean_nodes_down, p_no_spare, straggler_study, stragglers)
from cluster_config import megatron
from cluster_config.hardware import Gpu, gpu_of, host_memory_gib
from cluster_config.model_configs import SNAPSHOT_KEY, architecture, model_config, step_estimate, vocabulary
from cluster_config.monitoring_cost import MonitoringCost, monitoring_cost
from cluster_config.settings import PCLUSTER_VERSION, GoodputSettings, ModelPlan, Settings, SettingsError


TIB = 2**40
COMPUTE_OPTIMAL_TOKENS_PER_PARAMETER = 20  # "Training Compute-Optimal Large Language Models" (Chinchilla)
# GPUs of cluster_config/hardware.py with fp8 tensor cores (compute capability 8.9+), which train.float8 needs
# (jobs/training/parallel/float8.py refuses the others at start; the plan refuses them at synth).
FP8_GPUS = ("H100", "H200")


@dataclass(frozen=True)
class Measured:
    """What the day-one acceptance run measured of each shrunk layout (named by its recipe, e.g.
    llama2-70b): MFU and peak memory, each as measured / predicted by the same models the plan uses
    (``training.sizing.throughput`` and the dry run). The plan scales each model's estimates by its
    recipe's ratios: the shrunk model's error is taken to hold for the full one."""

    source: str
    mfu_ratio: dict[str, float] = field(default_factory=dict)
    memory_ratio: dict[str, float] = field(default_factory=dict)


MEASURED_CHECK = re.compile(r"layout (?P<layout>\S+): (?P<what>MFU vs plan|peak GPU memory vs dry run)")


def read_measured(path: Path) -> Measured:
    """The ratios in an acceptance report.json (``python -m cluster_checks.acceptance report``)."""
    try:
        report = json.loads(path.read_text())
        checks = report["checks"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SettingsError(f"--measured {path}: not an acceptance report.json ({type(exc).__name__}: {exc}); "
                            "pass the report.json that jobs/acceptance.sh wrote") from None
    if report.get("set"):  # benchmarks.gpu_check --set: the recipes ran with other settings than production's
        raise SettingsError(f"--measured {path}: its recipes ran with --set {' '.join(report['set'])}, not as the "
                            "models train; pass a report of the recipes as configured")
    measured = Measured(f"{path} (job {report.get('job', '?')}, verdict {report.get('verdict', '?')})")
    for check in checks:
        match = MEASURED_CHECK.fullmatch(str(check.get("name", "")))
        ratio = check.get("ratio")
        if match and isinstance(ratio, (int, float)) and ratio > 0 and check.get("status") in ("pass", "fail"):
            which = measured.mfu_ratio if match["what"] == "MFU vs plan" else measured.memory_ratio
            which[match["layout"]] = float(ratio)
    if not measured.mfu_ratio and not measured.memory_ratio:
        raise SettingsError(f"--measured {path}: the report measured no layout's MFU or memory (a CPU rehearsal, or "
                            "the layout runs failed); run jobs/acceptance.sh on the GPU cluster first")
    return measured


# Host memory of a node's data loaders: a DataLoader worker's peak RSS, 259 MB, measured reading two epochs
# (docs/data_pipeline.md, loader peak RSS; 218 MB of it torch and numpy), for each of data.num_workers per rank,
# and the pinned int64 batches in flight: prefetch_factor (4, data_pipeline/loader.py) per worker and one more.
LOADER_WORKER_BYTES = 259e6
LOADER_PREFETCH = 4
# The hot spares the plan weighs for each model (models.<m>.hot_spares): 0 (the settings' default) up to this.
TRADE_SPARES = (1, 2, 3)

# Raw text per token, for the space a corpus takes on the data file system while it is tokenized: about 4
# characters of English per token for Llama-family BPE tokenizers, 1 byte each in UTF-8 (more for other
# scripts). Tar headers add 0.05 % to the shards (data_pipeline/shards.py).
RAW_TEXT_BYTES_PER_TOKEN = 4.0


def _bytes(size: float) -> str:
    if size >= TIB / 10:
        return f"{size / TIB:.2f} TiB"
    return f"{size / GIB:.1f} GiB" if size >= GIB / 10 else f"{size / 2**20:.1f} MiB"


def token_bytes(vocab_size: int) -> int:
    """Bytes per token in a shard: uint16 where the vocabulary fits, else uint32 (data_pipeline/shards.py)."""
    return 2 if vocab_size <= 2**16 else 4


class PlanError(SettingsError):
    """The plan cannot run: a model does not fit in GPU memory, or checkpoints overflow their file system."""


@dataclass(frozen=True)
class ModelRow:
    name: str
    preset: str
    nodes: int
    gpus: int
    cost_per_hour_usd: float
    steps: int = 0
    global_batch_size: int = 0  # sequences per step
    parameters: float = 0.0
    tokens: float = 0.0
    flops: float = 0.0
    days: float = 0.0
    mfu: float = 0.0  # estimated (estimate_mfu), its compute scaled by a measured ratio (measured_step)
    step_s: float = 0.0
    step: StepEstimate | None = None  # where the step's time goes: compute, TP, data-parallel traffic
    compute_ratio: float = 0.0  # the measured compute speed over the estimate's its compute was scaled by (0: none)
    memory: dict[str, float] = field(default_factory=dict)  # GiB per GPU by category, and "total"
    checkpoint_bytes: float = 0.0
    checkpoints_kept: int = 0  # checkpoint.keep + 1 in flight
    dataset: str = ""  # its token shards' folder under the data file system
    token_bytes: int = 2  # per token in its shards
    save_s: float = 0.0
    checkpoint_every_h: float = 0.0  # every checkpoint.every steps, or sooner after checkpoint.every_minutes
    goodput: Goodput | None = None  # failures and what they cost; None without GPU figures (no days)
    stragglers: Stragglers | None = None  # slow nodes and what they cost, unattended and evicted
    hot_spares: int = 0  # the entry's: held in its allocation for recovery inside the job
    fewer_nodes: int = 0  # with no spare free, the nodes it goes on with (models.<m>.min_nodes; 0: it waits)
    fewer_nodes_possible: int = 0  # the most nodes below its own on which its global batch divides (0: none)
    snapshot_every: int = 0  # checkpoint.snapshot_every of its training config (0: no snapshots)
    snapshot_interval_s: float = 0.0  # snapshot_every steps at step_s
    snapshot_bytes_per_node: float = 0.0  # one node's shards of the training state (parameters and optimizer)
    network_gb_s_per_node: float = 0.0  # its EFA at the collectives' bus efficiency: a buddy copy's transfer
    host_memory: dict[str, float] = field(default_factory=dict)  # GiB per node by use, and "total"
    stress: Goodput | None = None  # goodput at goodput.stress_factor x the failure rate
    trades: tuple[HotSpareTrade, ...] = ()  # TRADE_SPARES hot spares against none, at 1x and stress_factor x

    @property
    def cost_to_finish_usd(self) -> float:
        return self.cost_per_hour_usd * self.days * 24


@dataclass(frozen=True)
class Plan:
    env: str
    instance_type: str
    rows: tuple[ModelRow, ...]
    max_count: int
    reserved: int | None  # instances the capacity reservations hold together; None without any
    data_throughput_mb_s: float
    data_demand_mb_s: float
    throughput_mb_s: dict[str, float]
    gpu: Gpu | None = None
    mfu: float = 0.4
    deadline_days: float | None = None
    usable_gib: float = 0.0
    checkpoint_capacity_bytes: float = 0.0
    data_capacity_bytes: float = 0.0
    errors: tuple[str, ...] = ()
    measured: Measured | None = None  # the acceptance report the MFU and memory were scaled by
    warnings: tuple[str, ...] = ()
    reservation_counts: tuple[int, ...] = ()  # instance_count of each capacity reservation, in order
    capacity_blocks: bool = False  # the reservations are Capacity Blocks for ML (else ODCRs)
    assume: GoodputSettings = GoodputSettings()  # failure rate, recovery and replacement times
    spare_nodes: int = 0
    mean_nodes_down: float = 0.0  # nodes being replaced at once, on average
    p_no_spare: float = 1.0  # a failure finds no spare node free
    capacity_end: datetime | None = None  # AWS begins terminating the Capacity Blocks' instances
    host_memory_gib: float | None = None  # a GPU node's
    host_usable_gib: float = 0.0  # less plan.host_memory_headroom
    alert_delivery: MonitoringCost | None = None  # what the alerts' path on AWS costs a month

    @property
    def nodes(self) -> int:
        return sum(row.nodes for row in self.rows)

    @property
    def gpus(self) -> int:
        return sum(row.gpus for row in self.rows)

    @property
    def cost_per_hour_usd(self) -> float:
        return sum(row.cost_per_hour_usd for row in self.rows)

    @property
    def cost_to_finish_usd(self) -> float:
        return sum(row.cost_to_finish_usd for row in self.rows)

    @property
    def days(self) -> float:
        return max((row.days for row in self.rows), default=0.0)

    @property
    def checkpoint_need_bytes(self) -> float:
        return sum(row.checkpoint_bytes * row.checkpoints_kept for row in self.rows)

    @property
    def dataset_tokens(self) -> dict[str, tuple[float, int]]:
        """Tokens and bytes per token of each dataset folder, one pass of its model's tokens: models naming
        the same folder share it (the settings make them tokenize it alike), and it holds the larger pass."""
        datasets: dict[str, tuple[float, int]] = {}
        for row in self.rows:
            tokens = max(datasets.get(row.dataset, (0.0, 0))[0], row.tokens)
            datasets[row.dataset] = (tokens, row.token_bytes)
        return datasets

    @property
    def data_need_bytes(self) -> float:
        """The shards of every dataset."""
        return sum(tokens * size for tokens, size in self.dataset_tokens.values())

    @property
    def raw_text_bytes(self) -> float:
        """The datasets' raw text, while it is on the data file system to be tokenized."""
        return sum(tokens for tokens, _ in self.dataset_tokens.values()) * RAW_TEXT_BYTES_PER_TOKEN

    @property
    def storage_under_provisioned(self) -> bool:
        return self.data_demand_mb_s > self.data_throughput_mb_s

    @property
    def goodputs(self) -> tuple[Goodput, ...]:
        return tuple(row.goodput for row in self.rows if row.goodput)

    @property
    def expected_failures(self) -> float:
        return sum(g.expected_failures for g in self.goodputs)

    @property
    def lost_gpu_hours(self) -> float:
        return sum(g.lost_gpu_hours for g in self.goodputs)

    @property
    def lost_node_hours(self) -> float:
        return sum(g.lost_node_hours for g in self.goodputs)

    @property
    def lost_usd(self) -> float:
        return sum(g.lost_usd for g in self.goodputs)

    @property
    def ettr(self) -> float:
        """The cluster's: productive GPU-days / GPU-days the models hold their nodes."""
        held = sum(g.gpus * g.days for g in self.goodputs)
        return sum(g.gpus * g.failure_free_days for g in self.goodputs) / held if held else 0.0

    @property
    def goodput_days(self) -> float:
        return max((g.days for g in self.goodputs), default=0.0)


def build_plan(settings: Settings, measured: Measured | None = None) -> Plan:
    queue, assume = settings.gpu_queue, settings.plan
    file_systems = settings.storage.file_systems()
    ckpt_fs = file_systems["checkpoints"]
    gpu = gpu_of(settings)
    usable_gib = gpu.memory_gib * (1 - assume.memory_headroom) if gpu else 0.0
    errors: list[str] = []
    warnings: list[str] = []
    if gpu is None:
        warnings.append(f"no GPU figures for {queue.instance_type}: set plan.gpu_memory_gib and "
                        "plan.gpu_peak_tflops to get memory, time and cost")
    rows = []
    for model in settings.models:
        gpus = model.nodes * queue.gpus_per_instance
        base = dict(name=model.name, preset=model.preset, nodes=model.nodes, gpus=gpus,
                    cost_per_hour_usd=model.nodes * queue.price_per_instance_hour_usd)
        row, model_errors, model_warnings = _size_model(base, model, settings, gpu, usable_gib, ckpt_fs.throughput_mb_s,
                                                        measured)
        rows.append(row)
        errors += model_errors
        warnings += model_warnings

    down = mean_nodes_down(settings)
    plan = Plan(
        env=settings.name,
        instance_type=queue.instance_type,
        rows=tuple(rows),
        max_count=queue.max_count,
        reserved=queue.reserved_count if queue.capacity_reservations else None,
        reservation_counts=tuple(r.instance_count for r in queue.capacity_reservations),
        capacity_blocks=queue.capacity_type == "CAPACITY_BLOCK",
        data_throughput_mb_s=file_systems["data"].throughput_mb_s,
        data_demand_mb_s=sum(row.gpus for row in rows) * settings.storage.data_read_mb_s_per_gpu,
        throughput_mb_s={key: fs.throughput_mb_s for key, fs in file_systems.items()},
        gpu=gpu, mfu=assume.mfu, deadline_days=assume.deadline_days, usable_gib=usable_gib,
        checkpoint_capacity_bytes=ckpt_fs.storage_capacity_gib * GIB, measured=measured,
        data_capacity_bytes=file_systems["data"].storage_capacity_gib * GIB,
        assume=settings.goodput, spare_nodes=queue.spare_nodes, mean_nodes_down=down,
        p_no_spare=p_no_spare(down, queue.spare_nodes), capacity_end=queue.capacity_end,
        alert_delivery=monitoring_cost(settings), host_memory_gib=host_memory_gib(settings),
        host_usable_gib=(host_memory_gib(settings) or 0.0) * (1 - settings.plan.host_memory_headroom),
    )
    need, capacity = plan.checkpoint_need_bytes, plan.checkpoint_capacity_bytes
    largest = max((row.checkpoint_bytes for row in rows), default=0.0)
    if need <= capacity < need + largest:
        warnings.append(
            f"checkpoints leave {(capacity - need) / 1e9:,.0f} GB free on {ckpt_fs.mount_dir}, less than one more "
            f"checkpoint of the largest model ({largest / 1e9:,.0f} GB): a save that fails midway stays on disk "
            "until the next one completes, and then the file system fills; lower checkpoint.keep of the largest "
            f"model or raise storage.checkpoints.storage_capacity_gib to {_fsx_size_gib(need + largest)}")
    if need > capacity:
        errors.append(
            f"checkpoints overflow {ckpt_fs.mount_dir}: every model's checkpoint.keep + 1 in flight needs "
            f"{need / TIB:.2f} TiB, the file system has {capacity / TIB:.2f} TiB; raise "
            f"storage.checkpoints.storage_capacity_gib to {_fsx_size_gib(need)} or lower checkpoint.keep "
            "of the largest models (their checkpoints are exported to S3 as they are written)")
    data_fs = file_systems["data"]
    need, capacity = plan.data_need_bytes, plan.data_capacity_bytes
    if need > capacity:
        errors.append(
            f"datasets overflow {data_fs.mount_dir}: one pass of each model's tokens is {need / TIB:.2f} TiB of shards "
            f"({len(plan.dataset_tokens)} datasets), the file system has {capacity / TIB:.2f} TiB; raise "
            f"storage.data.storage_capacity_gib to {_fsx_size_gib(need + plan.raw_text_bytes)} (the shards and the "
            "raw text being tokenized), or let models with the same tokenizer and seq_len share a dataset")
    if plan.storage_under_provisioned:
        warnings.append(
            "the data file system is under-provisioned for a full-size run; raise "
            "storage.data.storage_capacity_gib or throughput_per_tib, or lower data_read_mb_s_per_gpu "
            "if the loaders read less (e.g. they cache shards on the local NVMe)")
    return Plan(**{**plan.__dict__, "errors": tuple(errors), "warnings": tuple(warnings)})


def _size_model(base: dict, model: ModelPlan, settings: Settings, gpu: Gpu | None, usable_gib: float,
                ckpt_mb_s: float, measured: Measured | None = None) -> tuple[ModelRow, list[str], list[str]]:
    name, gpus = base["name"], base["gpus"]
    where = f"cluster_config/{settings.name}.yaml models: {name}"
    preset = architecture(settings, model)  # what the trainer builds; SettingsError naming the entry and the fix
    cfg = model_config(settings, model)  # SettingsError naming the entry when it does not validate
    train, ckpt = cfg.train, cfg.checkpoint
    errors, warnings = megatron.layout_problems(settings, model), []  # Megatron-LM's rules, for a megatron: entry
    seq_len, steps, batch, micro = cfg.data.seq_len, train.steps, train.global_batch_size, train.micro_batch_size
    vocab = vocabulary(settings, model, cfg)  # the architecture's, the config's, else plan.vocab_size
    tokens = steps * batch * seq_len
    flops = tokens * preset.flops_per_token(vocab, seq_len)
    row = dict(base, steps=steps, global_batch_size=batch, parameters=preset.parameters(vocab), tokens=tokens, flops=flops,
               checkpoint_bytes=checkpoint_bytes(preset, vocab), checkpoints_kept=ckpt.keep + 1,
               dataset=model.dataset, token_bytes=token_bytes(vocab))
    row["save_s"] = row["checkpoint_bytes"] / (ckpt_mb_s * 1e6)
    row["hot_spares"] = model.hot_spares
    row["snapshot_every"] = 0 if model.megatron else ckpt.snapshot_every  # Megatron-LM keeps no in-memory snapshots
    if not model.megatron and model.nodes > 1:  # what the batch script's relaunch on fewer nodes would pick
        per_node = settings.gpu_queue.gpus_per_instance
        row["fewer_nodes_possible"] = fewer_nodes(cfg, model.nodes - 1, per_node, 1)[0]
        row["fewer_nodes"] = fewer_nodes(cfg, model.nodes - 1, per_node, model.min_nodes)[0] if model.min_nodes else 0
        if model.min_nodes and not row["fewer_nodes"]:
            warnings.append(f"{name}: min_nodes {model.min_nodes} in {where}, but its global batch divides on none of "
                            f"{model.min_nodes} to {model.nodes - 1} nodes: a failure with no spare free waits for a "
                            f"replacement; lower min_nodes to {row['fewer_nodes_possible'] or 'none'} or remove it")
    if gpu is None:
        return ModelRow(**row), errors, warnings
    if train.float8 != "off" and gpu.name not in FP8_GPUS:
        errors.append(f"{name}: train.float8 {train.float8} needs fp8 tensor cores (compute capability 8.9+: "
                      f"{', '.join(FP8_GPUS)}), and {settings.gpu_queue.instance_type}'s {gpu.name} has none; set "
                      f"train.float8: off in the overrides of {where}")
    mfu_ratio = measured.mfu_ratio.get(model.recipe_name) if measured else None
    sized = megatron.sizing(settings, model, gpu) if model.megatron else None  # Megatron-LM's layout, not the trainer's
    step = row["step"] = measured_step(sized.step if sized else step_estimate(settings, model, cfg), mfu_ratio)
    row["compute_ratio"] = mfu_ratio or 0.0
    row["mfu"], row["step_s"] = step.mfu, step.step_s
    if not sized:  # its fixes are the trainer's settings
        warnings += _overlap_warnings(name, step, train, where, settings.gpu_queue.gpus_per_instance)
    row["days"] = row["step_s"] * steps / 86400
    row["checkpoint_every_h"] = row["step_s"] * (model.megatron.save_every if model.megatron else ckpt.every) / 3600
    if ckpt.every_minutes and not model.megatron:  # the trainer also saves once this long has passed since the last save
        row["checkpoint_every_h"] = min(row["checkpoint_every_h"], ckpt.every_minutes / 60)
    row["snapshot_interval_s"] = row["snapshot_every"] * row["step_s"]
    if train.grad_reduce != "every_micro_batch":
        warnings.append(f"{name}: the analytic memory model assumes gradients reduced every micro-batch; for "
                        f"train.grad_reduce of {where} run `python -m training.dry_run {name} --env {settings.name}`")
    run = RunShape(preset, vocab, seq_len, micro, gpus, train.parallelism, train.activation_checkpointing,
                   checkpoint_every=train.activation_checkpointing_every, tensor_parallel=train.tensor_parallel,
                   hsdp_shard_size=train.hsdp_shard_size)
    per_gpu = sized.memory if sized else memory(run)
    row["memory"] = per_gpu.gib()
    per_node = settings.gpu_queue.gpus_per_instance
    row["snapshot_bytes_per_node"] = (per_gpu.parameters + per_gpu.optimizer) * per_node
    row["network_gb_s_per_node"] = gpu.network_gb_s * per_node * BUS_EFFICIENCY
    row["host_memory"] = _host_memory(row["snapshot_bytes_per_node"], bool(row["snapshot_every"]), cfg, per_node)
    errors += _host_memory_errors(row["host_memory"], settings, model, cfg, where)
    good = row["goodput"] = goodput(ModelRow(**row), settings)
    factor = settings.goodput.stress_factor
    row["stress"] = goodput(ModelRow(**row), settings, failure_factor=factor)
    row["trades"] = tuple(hot_spare_trade(ModelRow(**row), settings, spares, scale)
                          for spares in TRADE_SPARES for scale in (1.0, factor))
    memory_ratio = measured.memory_ratio.get(model.recipe_name) if measured else None
    if memory_ratio:
        row["memory"] = {key: value * memory_ratio for key, value in row["memory"].items()}
    need = row["memory"]["total"]
    if need > usable_gib and sized:
        errors.append(megatron.memory_error(model, need, usable_gib, gpu, where))
    elif need > usable_gib:
        fixes = [] if train.activation_checkpointing else ["set train.activation_checkpointing: true"]
        if train.activation_checkpointing and train.activation_checkpointing_every > 1:
            fixes.append(f"lower train.activation_checkpointing_every (now {train.activation_checkpointing_every})")
        if micro > 1:
            fixes.append(f"lower train.micro_batch_size (now {micro})")
        if train.parallelism == "ddp":
            fixes.append("use train.parallelism: fsdp")
        if train.parallelism == "hsdp":
            fixes.append("raise train.hsdp_shard_size or use train.parallelism: fsdp")
        fixes.append("give it more nodes (the sharded state shrinks)")
        errors.append(f"{name}: needs {need:.0f} GiB per GPU, more than the {usable_gib:.0f} GiB usable on a "
                      f"{gpu.name} ({gpu.memory_gib:.0f} GiB less plan.memory_headroom); in {where}, overrides: "
                      + ", or ".join(fixes))
    if not good.ettr:  # it never finishes: no deadline or end to compare with
        errors.append(f"{name}: failures outpace progress: {good.failures_per_day:.2f} a day, each costing "
                      f"{good.lost_per_failure_s / 3600:.2f} h, leave no time to train (ETTR 0); check "
                      f"goodput.failures_per_1000_node_days and goodput.recovery_s, or save more often "
                      f"(checkpoint.every_minutes in the overrides of {where})")
        return ModelRow(**row), errors, warnings
    # The trainer names a straggler node when its rule (training/resilience/straggler_rule.py) counts it; how
    # many log intervals that takes, and how often it names a healthy node, the seeded study measured.
    row["stragglers"] = stragglers(good, settings, interval_s=cfg.log.interval * row["step_s"],
                                   margin=train.straggler_margin, intervals=train.straggler_intervals,
                                   window=train.straggler_window)
    deadline = settings.plan.deadline_days
    if deadline and good.days > deadline:
        nodes_needed = math.ceil(base["nodes"] * good.days / deadline)
        steps_fit = int(steps * deadline / good.days)  # ETTR does not depend on the steps: days scale with them
        basis = "measured" if mfu_ratio else "estimated"
        warnings.append(f"{name}: finishes in {good.days:.2f} days ({row['days']:.2f} without failures) at "
                        f"{row['mfu']:.0%} MFU ({basis}), after plan.deadline_days {deadline:g}; lower steps to "
                        f"{steps_fit:,} or fewer in {where}, or give it {nodes_needed} nodes")
    warnings += _goodput_warnings(good, steps, where, settings)
    return ModelRow(**row), errors, warnings


def measured_step(step: StepEstimate, compute_ratio: float | None) -> StepEstimate:
    """``step`` with its compute at the measured speed: ``compute_ratio`` is a recipe's measured MFU over the
    estimate's on one GPU (``benchmarks.gpu_check``: no communication there, so it measures compute alone; an
    acceptance run's shrunk layouts include theirs, and their ratio is taken for the compute's too).
    Tensor-parallel and data-parallel traffic keep their own model (``training.parallel.communication``);
    faster compute hides less of the data-parallel traffic. None: the estimate as it is."""
    if not compute_ratio:
        return step
    faster = StepEstimate(step.compute_s / compute_ratio, step.tensor_parallel_s, step.data_parallel_s, 0.0)
    return replace(faster, mfu=step.mfu * step.step_s / faster.step_s)  # the same model FLOPs over the new step


def _overlap_warnings(name: str, step: StepEstimate, train, where: str, gpus_per_node: int) -> list[str]:
    """A model whose data-parallel traffic outlasts its compute: FSDP's prefetch no longer hides it."""
    if step.data_parallel_s <= step.compute_s:
        return []
    fixes = []
    if train.parallelism != "ddp" and train.grad_reduce == "every_micro_batch":
        fixes.append("train.grad_reduce: last_micro_batch (one reduce-scatter per step; the dry run must show the "
                     "unsharded fp32 gradients fit)")
    if train.reduce_dtype == "float32":
        fixes.append("train.reduce_dtype: bfloat16 (half the reduce-scatter bytes)")
    fixes.append("a larger train.micro_batch_size (more compute per gathered layer) where memory allows")
    if train.tensor_parallel < gpus_per_node and train.parallelism != "ddp":
        fixes.append("a larger train.tensor_parallel (fewer parameter bytes per data-parallel rank)")
    return [f"{name}: data-parallel traffic {step.data_parallel_s:.1f} s per step exceeds its compute "
            f"{step.compute_s:.1f} s: {step.exposed_data_parallel_s:.1f} s of it is not hidden; in the overrides of "
            f"{where}: " + ", or ".join(fixes)]


def _host_memory(state_bytes: float, snapshots: bool, cfg, gpus_per_node: int) -> dict[str, float]:
    """GiB of a node's host memory by use: its own snapshot and its buddy's (each its ranks' shards of the
    parameters and optimizer state, as jobs/training/sizing/memory.py counts them), the previous snapshot's two
    while a new one is written (they go only once every rank holds the new one: training/checkpoints/snapshot.py),
    the async checkpoint's pinned staging (one copy of the same shards, allocated once), and the data loaders
    (workers and pinned batches)."""
    own = state_bytes if snapshots else 0.0
    staging = state_bytes if cfg.checkpoint.async_save else 0.0
    workers = gpus_per_node * cfg.data.num_workers
    batch = cfg.train.micro_batch_size * cfg.data.seq_len * 8  # int64 token ids
    loaders = workers * LOADER_WORKER_BYTES + gpus_per_node * (cfg.data.num_workers * LOADER_PREFETCH + 1) * batch
    uses = {"own": own, "buddy": own, "previous": 2 * own, "staging": staging, "loaders": loaders}
    return {**{key: value / GIB for key, value in uses.items()}, "total": sum(uses.values()) / GIB}


def _host_memory_errors(need: dict[str, float], settings: Settings, model: ModelPlan, cfg, where: str) -> list[str]:
    """A model whose snapshots, staging and loaders do not fit in its nodes' host memory: synth stops."""
    total_gib = host_memory_gib(settings)
    if total_gib is None or not need:
        return []
    usable = total_gib * (1 - settings.plan.host_memory_headroom)
    if need["total"] <= usable:
        return []
    fixes = ["give it more nodes (each node's shards shrink)"]
    if cfg.train.parallelism == "ddp":
        fixes.insert(0, "use train.parallelism: fsdp (DDP keeps the whole state on every rank)")
    if need["own"]:
        fixes.append(f"set {SNAPSHOT_KEY}: 0 in its overrides (no snapshots: every failure requeues the job)")
    if need["staging"]:
        fixes.append("set checkpoint.async_save: false in its overrides (no pinned copy; saves then block training)")
    if cfg.data.num_workers > 1:
        fixes.append(f"lower data.num_workers (now {cfg.data.num_workers})")
    return [f"{model.name}: host memory per node: its snapshot {need['own']:.0f} GiB + its buddy's {need['buddy']:.0f} GiB "
            f"+ the previous two while a snapshot is written {need['previous']:.0f} GiB "
            f"+ pinned staging {need['staging']:.0f} GiB + data loaders {need['loaders']:.0f} GiB = {need['total']:.0f} GiB, "
            f"more than the {usable:.0f} GiB usable of a {settings.gpu_queue.instance_type}'s {total_gib:,.0f} GiB (less "
            f"plan.host_memory_headroom {settings.plan.host_memory_headroom:.0%}); in {where}: "
            + ", or ".join(fixes)]


def _goodput_warnings(good: Goodput, steps: int, where: str, settings: Settings) -> list[str]:
    """A model losing too much to failures; a model likely still training when its Capacity Blocks end."""
    warnings, assume = [], settings.goodput
    if good.ettr < assume.min_ettr:
        warnings.append(
            f"{good.name}: ETTR {good.ettr:.1%} is below goodput.min_ettr {assume.min_ettr:.0%}: "
            f"{good.expected_failures:.1f} expected failures cost {good.lost_per_failure_s / 3600:.2f} h each "
            f"(requeued: {good.recovery_s / 60:.0f} min to recover, {good.rework_s / 3600:.2f} h of rework, "
            f"{good.replacement_wait_s / 60:.0f} min waiting for a replacement node; {1 - good.p_no_hot_spare:.0%} "
            f"recovered inside the job in {good.in_job_lost_s / 60:.1f} min"
            f"{f'; going on with {good.fewer_nodes} nodes: {good.fewer_lost_s / 60:.1f} min' if good.fewer_nodes else ''}"
            f"); give it hot_spares in {where}, save "
            f"more often (checkpoint.every_minutes in its overrides) or keep gpu_queue.spare_nodes")
    start, end = assume.training_start, settings.gpu_queue.capacity_end
    if start is None or end is None:
        return warnings
    available = (end - start) / timedelta(days=1)
    if good.days_p95 > available:
        tail = good.days_p95 - good.failure_free_days  # failures at the 95th percentile, in days
        steps_fit = max(0, int(steps * (available - tail) / good.failure_free_days))
        warnings.append(
            f"{good.name}: 1 run in 20 finishes after {_after(start, good.days_p95)} (expected "
            f"{_after(start, good.days)}), later than {_utc(end)}, when AWS begins terminating the "
            f"Capacity Blocks' instances (30 minutes before the earliest gpu_queue.capacity_reservations end); "
            f"lower steps to {steps_fit:,} or fewer in {where}, or start earlier (goodput.training_start)")
    return warnings


def _percent(p: float) -> str:
    return f"{p:.0%}" if p >= 0.01 or p == 0 else f"{p * 100:.2g}%"


def _utc(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _after(start: datetime, days: float) -> str:
    """``start`` + ``days`` as _utc gives it; a finish millennia away is past what a date holds."""
    try:
        return _utc(start + timedelta(days=days))
    except OverflowError:
        return f"{days:,.0f} days"


def spares_alternative(settings: Settings, spares: int) -> Settings:
    """``settings`` with ``gpu_queue.spare_nodes: spares``, the models shrunk to make room: one node at a
    time from the model that, without it, finishes earliest (days with the expected failures). The shrunk
    model keeps its layout valid and its tokens: its global batch is rounded down to a multiple of what its
    fewer data-parallel ranks take per micro-batch, its steps raised to match."""
    queue = settings.gpu_queue
    if not 0 <= spares < queue.max_count:
        raise SettingsError(f"--spares {spares}: choose 0 to {queue.max_count - 1} (gpu_queue.max_count {queue.max_count})")
    trial = settings.model_copy(update={"gpu_queue": queue.model_copy(update={"spare_nodes": spares})})
    gpu = gpu_of(settings)
    if gpu is None:
        raise SettingsError(f"--spares needs days per model: set plan.gpu_memory_gib and plan.gpu_peak_tflops "
                            f"for {queue.instance_type}")
    usable_gib = gpu.memory_gib * (1 - settings.plan.memory_headroom)
    models = list(settings.models)
    for _ in range(sum(m.nodes + m.hot_spares for m in models) + spares - queue.max_count):
        options = []
        for index, model in enumerate(models):
            shrunk = _one_node_fewer(settings, model)
            if shrunk is None:
                continue
            base = dict(name=shrunk.name, preset=shrunk.preset, nodes=shrunk.nodes,
                        gpus=shrunk.nodes * queue.gpus_per_instance,
                        cost_per_hour_usd=shrunk.nodes * queue.price_per_instance_hour_usd)
            row, errors, _ = _size_model(base, shrunk, trial, gpu, usable_gib, settings.storage.checkpoints.throughput_mb_s)
            if not errors:  # still fits in GPU memory
                options.append((row.goodput.days, index, shrunk))
        if not options:
            raise SettingsError(f"--spares {spares}: no model can give up another node and still run; "
                                "lower --spares or raise gpu_queue.max_count")
        _, index, shrunk = min(options, key=lambda option: option[:2])
        models[index] = shrunk
    return Settings.model_validate({**settings.model_dump(), "gpu_queue": trial.gpu_queue.model_dump(),
                                    "models": [model.model_dump() for model in models]})


def _one_node_fewer(settings: Settings, model: ModelPlan) -> ModelPlan | None:
    """``model`` on one node fewer with the same tokens, or None where its layout cannot shrink."""
    if model.nodes == 1:
        return None
    train = model_config(settings, model).train
    per_step = train.micro_batch_size * (model.nodes - 1) * settings.gpu_queue.gpus_per_instance // train.tensor_parallel
    batch = model.global_batch_size // per_step * per_step
    if not batch:
        return None
    shrunk = model.model_copy(update={"nodes": model.nodes - 1, "global_batch_size": batch,
                                      "steps": math.ceil(model.global_batch_size * model.steps / batch)})
    try:
        cfg = model_config(settings, shrunk)  # the trainer's own checks at the smaller world size (HSDP shards, TP)
    except SettingsError:
        return None
    if model.min_nodes:  # its batch changed: the fewest nodes it goes on with follow
        fewest = fewer_nodes(cfg, shrunk.nodes - 1, settings.gpu_queue.gpus_per_instance, 1)[0]
        shrunk = shrunk.model_copy(update={"min_nodes": fewest or None})
    return shrunk


def _fsx_size_gib(need_bytes: float) -> int:
    """Smallest valid PERSISTENT_2 size (1200, 2400, then multiples of 2400 GiB) holding ``need_bytes``."""
    gib = need_bytes / GIB
    return 1200 if gib <= 1200 else 2400 * math.ceil(gib / 2400)


def check_plan(settings: Settings) -> Plan:
    """The plan, or PlanError listing what cannot run (synth calls this)."""
    plan = build_plan(settings)
    if plan.errors:
        raise PlanError(f"the {settings.name} plan cannot run:\n" + "\n".join(f"  {e}" for e in plan.errors))
    return plan


def _si(value: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def format_plan(plan: Plan) -> str:
    reserved = ", no reservation"
    if plan.reserved is not None:
        count = len(plan.reservation_counts)
        kind = ("Capacity Block" if plan.capacity_blocks else "ODCR") + ("s" if count > 1 else "")
        split = f" ({' + '.join(map(str, plan.reservation_counts))})" if count > 1 else ""
        reserved = f", reserved {plan.reserved} in {count} {kind}{split}"
    gpu = f" ({plan.gpu.name}, {plan.gpu.memory_gib:.0f} GiB)" if plan.gpu else ""
    deadline = f", deadline {plan.deadline_days:g} days" if plan.deadline_days else ""
    spare = f" + {plan.spare_nodes} spare" if plan.spare_nodes else ""
    lines = [
        f"Plan for {plan.env}: {plan.nodes} x {plan.instance_type}{gpu}{spare} of max {plan.max_count}{reserved}; "
        f"MFU estimated per model from {plan.mfu:.0%} with communication hidden{deadline}",
        f"  {'model':<8} {'preset':<11} {'nodes':>5} {'GPUs':>4} {'params':>6} {'tokens':>6} {'tok/p':>5} {'FLOPs':>7} "
        f"{'MFU':>4} {'days':>5} {'$/hour':>8} {'$ to finish':>11} {'GiB/GPU':>7} {'ckpt GB':>7} {'save s':>6} {'every h':>7}",
    ]
    for r in plan.rows:
        mem = r.memory.get("total", 0.0)
        lines.append(
            f"  {r.name:<8} {r.preset:<11} {r.nodes:>5} {r.gpus:>4} {_si(r.parameters):>6} {_si(r.tokens):>6} "
            f"{(r.tokens / r.parameters if r.parameters else 0):>5.0f} "
            f"{r.flops:>7.2g} {r.mfu:>4.0%} {r.days:>5.1f} {r.cost_per_hour_usd:>8,.0f} {r.cost_to_finish_usd:>11,.0f} "
            f"{mem:>7.1f} {r.checkpoint_bytes / 1e9:>7,.0f} {r.save_s:>6.0f} {r.checkpoint_every_h:>7.1f}")
    lines.append(
        f"  {'total':<8} {'':<11} {plan.nodes:>5} {plan.gpus:>4} {'':>6} {_si(sum(r.tokens for r in plan.rows)):>6} {'':>5} "
        f"{sum(r.flops for r in plan.rows):>7.2g} {'':>4} {plan.days:>5.1f} {plan.cost_per_hour_usd:>8,.0f} "
        f"{plan.cost_to_finish_usd:>11,.0f}")
    lines += _format_step(plan)
    if plan.gpu and any(r.memory for r in plan.rows):
        lines.append(f"  memory per GPU, GiB (analytic, jobs/training/sizing/memory.py), usable {plan.usable_gib:.0f} of "
                     f"{plan.gpu.memory_gib:.0f}:")
        lines.append(f"  {'model':<8} {'params':>6} {'grads':>6} {'optim':>6} {'gather':>6} {'activ':>6} "
                     f"{'trans':>6} {'total':>6}")
        for r in plan.rows:
            if r.memory:
                m = r.memory
                lines.append(f"  {r.name:<8} {m['parameters']:>6.1f} {m['gradients']:>6.1f} {m['optimizer']:>6.1f} "
                             f"{m['gathered']:>6.1f} {m['activations']:>6.1f} {m['transient']:>6.1f} {m['total']:>6.1f}")
    lines += _format_goodput(plan)
    need, capacity = plan.checkpoint_need_bytes, plan.checkpoint_capacity_bytes
    if capacity:
        lines.append(f"  checkpoints at peak (keep + 1 in flight, every model): {need / TIB:.2f} TiB of "
                     f"{capacity / TIB:.2f} TiB ({need / capacity:.0%}); save times at "
                     f"{plan.throughput_mb_s['checkpoints']:,.0f} MB/s, one model saving at a time")
    need, capacity = plan.data_need_bytes, plan.data_capacity_bytes
    if capacity and need:
        raw = plan.raw_text_bytes
        folders = len(plan.dataset_tokens)
        lines.append(f"  datasets, one pass of each model's tokens: {_bytes(need)} of shards in {folders} "
                     f"folder{'s' if folders > 1 else ''}, of {_bytes(capacity)} ({need / capacity:.0%}); their raw "
                     f"text is ~{_bytes(raw)} more at {RAW_TEXT_BYTES_PER_TOKEN:.0f} bytes per token")
        if need + raw > capacity:
            lines.append("  NOTE: the shards and all the raw text do not fit on the data file system together: "
                         "tokenize one model's corpus at a time and delete its raw files from it once uploaded "
                         "(docs/data_pipeline.md, Space on /fsx/data)")
    if plan.alert_delivery:
        lines.append(f"  {plan.alert_delivery.summary()}")
    lines.append(
        "  FSx throughput MB/s: " + ", ".join(f"{key} {value:,.0f}" for key, value in plan.throughput_mb_s.items()))
    ratio = plan.data_throughput_mb_s / plan.data_demand_mb_s if plan.data_demand_mb_s else float("inf")
    lines.append(
        f"  data read demand {plan.data_demand_mb_s:,.0f} MB/s ({plan.gpus} GPUs) vs data file system "
        f"{plan.data_throughput_mb_s:,.0f} MB/s: {ratio:.2f}x")
    for r in plan.rows:
        if r.parameters and r.tokens < COMPUTE_OPTIMAL_TOKENS_PER_PARAMETER * r.parameters and r.days:
            optimal_days = r.days * COMPUTE_OPTIMAL_TOKENS_PER_PARAMETER * r.parameters / r.tokens
            lines.append(f"  NOTE: {r.name} trains {r.tokens / r.parameters:.0f} tokens per parameter, below the "
                         f"compute-optimal ~{COMPUTE_OPTIMAL_TOKENS_PER_PARAMETER} (Hoffmann et al. 2022); that "
                         f"would take {optimal_days:.0f} days on its {r.nodes} nodes")
    if plan.measured:
        m = plan.measured
        ratios = ", ".join(f"{layout}: MFU x {m.mfu_ratio[layout]:.2f}" if layout in m.mfu_ratio else f"{layout}:"
                           for layout in sorted({*m.mfu_ratio, *m.memory_ratio}))
        memory_ratios = ", ".join(f"{layout} memory x {r:.2f}" for layout, r in sorted(m.memory_ratio.items()))
        lines.append(f"  MEASURED by {m.source}: {ratios}; {memory_ratios}; every model of a measured recipe has its "
                     "compute scaled by its MFU ratio (communication keeps its own model) and its memory by its memory "
                     "ratio, the others keep the estimates")
    lines += [f"  ERROR: {e}" for e in plan.errors]
    lines += [f"  WARNING: {w}" for w in plan.warnings]
    return "\n".join(lines)


def _format_step(plan: Plan) -> list[str]:
    """Where each model's step goes: compute (scaled by a measured ratio where one was), tensor-parallel traffic
    (on the critical path), data-parallel traffic and whether the compute hides it."""
    rows = [r for r in plan.rows if r.step]
    if not rows:
        return []
    lines = ["  step per GPU, s (jobs/training/sizing/throughput.py; compute x a measured ratio where a report has "
             "one, communication from its own model): FSDP/HSDP traffic is hidden while it is shorter than the compute",
             f"  {'model':<8} {'compute':>7} {'basis':>16} {'TP':>6} {'FSDP':>6} {'hidden':>6} {'step':>6}"]
    for r in rows:
        s = r.step
        basis = f"measured x {r.compute_ratio:.2f}" if r.compute_ratio else "estimated"
        hidden = "yes" if s.data_parallel_s <= s.compute_s else f"-{s.exposed_data_parallel_s:.1f}"
        lines.append(f"  {r.name:<8} {s.compute_s:>7.2f} {basis:>16} {s.tensor_parallel_s:>6.2f} "
                     f"{s.data_parallel_s:>6.2f} {hidden:>6} {s.step_s:>6.2f}")
    return lines


def _format_goodput(plan: Plan) -> list[str]:
    if not plan.goodputs:
        return []
    a = plan.assume
    expedited, why = expedited_requeue(PCLUSTER_VERSION)
    lines = _format_snapshots(plan)
    lines += [f"  goodput (cluster_config/goodput.py): {a.failures_per_1000_node_days:g} failures per 1,000 node-days. "
              f"A failure with a hot spare free is recovered inside the job from the snapshots: {a.detection_s:.0f} s "
              f"to detect, {a.relaunch_s:.0f} s to relaunch and start, the buddy copy's transfer, half a snapshot "
              "interval redone (job min); else, where models.<m>.min_nodes allows, it goes on with fewer nodes "
              "(fewer: the most on which the global batch divides) from the snapshots resharded, slower for the "
              "replacement's time, then stops keeping its state in memory and requeues onto the whole allocation "
              f"({a.grow_back_requeue_s:.0f} s to stop and run again, then the relaunch) (fewer min); else the job "
              f"requeues: {a.recovery_s:.0f} s to detect, requeue and restart, the work since the last checkpoint, "
              f"{a.node_replacement_min:g} min to replace a node (requeue min; "
              f"{'expedited' if expedited else 'not expedited'}: {why}); the minutes per failure count the path the "
              "settings choose;",
              f"  {plan.spare_nodes} spare node{'s' if plan.spare_nodes != 1 else ''}: a requeue finds none free "
              f"{_percent(plan.p_no_spare)} of the time ({plan.mean_nodes_down:.3f} nodes down at once on average); "
              "days and $ with the expected failures:",
              f"  {'model':<8} {'hot':>3} {'fails':>5} {'ckpt h':>6} {'Young h':>7} {'job min':>7} {'fewer':>9} "
              f"{'fewer min':>9} {'requeue min':>11} {'min/fail':>8} {'ETTR':>7} {'days':>5} {'p95 d':>5} "
              f"{'lost GPU-h':>10} {'lost $':>8}"]
    for r in plan.rows:
        g = r.goodput
        if g is None:
            continue
        job = f"{g.in_job_lost_s / 60:>7.1f}" if g.snapshot_interval_s else f"{'-':>7}"
        possible = replace(g, fewer_nodes=r.fewer_nodes_possible)
        fewer = (f"{r.fewer_nodes_possible:>4} of {g.nodes:<2} {possible.fewer_lost_s / 60:>9.1f}"
                 if r.fewer_nodes_possible else f"{'-':>9} {'-':>9}")
        lines.append(f"  {g.name:<8} {g.hot_spares:>3} {g.expected_failures:>5.2f} {g.checkpoint_interval_s / 3600:>6.1f} "
                     f"{g.young_interval_s / 3600:>7.1f} {job} {fewer} {g.requeue_lost_s / 60:>11.1f} "
                     f"{g.lost_per_failure_s / 60:>8.1f} {g.ettr:>7.2%} "
                     f"{g.days:>5.1f} {g.days_p95:>5.1f} {g.lost_gpu_hours:>10,.0f} {g.lost_usd:>8,.0f}")
    lines.append(f"  {'total':<8} {'':>3} {plan.expected_failures:>5.2f} {'':>6} {'':>7} {'':>7} {'':>9} {'':>9} {'':>11} {'':>8} "
                 f"{plan.ettr:>7.2%} {plan.goodput_days:>5.1f} {'':>5} {plan.lost_gpu_hours:>10,.0f} {plan.lost_usd:>8,.0f}")
    lines += _format_stress(plan)
    lines += _format_hot_spares(plan)
    slow = [row.stragglers for row in plan.rows if row.stragglers]
    if slow:
        study = straggler_study()
        lines += [f"  stragglers (slow, not failed): {a.stragglers_per_1000_node_days:g} per 1,000 node-days, each making "
                  f"its model {a.straggler_slowdown:.0%} slower; unattended for up to {a.straggler_unattended_h:g} h, "
                  "or evicted by the trainer (named, then save, requeue, restart). Detection and false evictions from "
                  f"the seeded study (python -m benchmarks.straggler_study): a node at the margin named in "
                  f"{study.detect_intervals:g} log intervals (95th percentile), {study.false_evictions} false "
                  f"eviction(s) in {study.node_days:,.0f} healthy node-days (95 % bound "
                  f"{1000 * study.false_bound_per_node_day:.1f} per 1,000 node-days); a model whose rule differs "
                  "is given its train.straggler_intervals (*). The trainer evicts only while the slowdown until the "
                  "run's end costs more than the eviction (train.straggler_evict_cost_s, set to 'evict min'):",
                  f"  {'model':<8} {'slow':>5} {'detect s':>8} {'evict min':>9} {'lost h unattended':>17} "
                  f"{'lost h evicted':>14} {'GPU-h saved':>11} {'false-eviction bound GPU-h':>26}"]
        for s in slow:
            lines.append(f"  {s.name:<8} {s.expected:>5.2f} {s.detect_wall_s:>7.0f}{' ' if s.measured else '*'} "
                         f"{s.evict_s / 60:>9.1f} {s.lost_h_unattended:>17.2f} {s.lost_h_evicted:>14.2f} "
                         f"{(s.lost_h_unattended - s.lost_h_evicted) * s.gpus:>11,.0f} "
                         f"{s.lost_h_false_bound * s.gpus:>26,.0f}")
    start, end = a.training_start, plan.capacity_end
    if start and end:
        late = max(plan.goodputs, key=lambda g: g.days_p95)
        margin = (end - start) / timedelta(days=1) - late.days_p95
        lines.append(f"  training starts {_utc(start)}; AWS begins terminating the Capacity Blocks at {_utc(end)}, "
                     f"{(end - start) / timedelta(days=1):.2f} days later; the last 95th-percentile finish "
                     f"({late.name}, {late.days_p95:.2f} days) leaves {margin * 24:.1f} h")
        stressed = [row.stress for row in plan.rows if row.stress]
        if stressed:
            late = max(stressed, key=lambda g: g.days_p95)
            margin = (end - start) / timedelta(days=1) - late.days_p95
            verdict = f"leaves {margin * 24:.1f} h" if margin >= 0 else f"is {-margin * 24:.1f} h after it"
            lines.append(f"  at {a.stress_factor:g}x the failure rate the last 95th-percentile finish ({late.name}, "
                         f"{late.days_p95:.2f} days) {verdict}")
    elif plan.capacity_blocks:
        lines.append("  finishes not checked against the Capacity Blocks' end: set gpu_queue.capacity_reservations[].end "
                     "and goodput.training_start")
    return lines


def _format_snapshots(plan: Plan) -> list[str]:
    """Each model's snapshot interval and its nodes' host memory."""
    rows = [r for r in plan.rows if r.host_memory]
    if not rows:
        return []
    a = plan.assume
    total = (f"usable {plan.host_usable_gib:,.0f} of {plan.host_memory_gib:,.0f}" if plan.host_memory_gib
             else "no host memory figure for the instance type: set plan.host_memory_gib to check it")
    lines = [f"  snapshots in node memory, each with a copy on a buddy node (checkpoint.snapshot_every: at most "
             f"goodput.snapshot_minutes {a.snapshot_minutes:g} of training apart), and host memory per node, GiB, {total}:",
             f"  {'model':<8} {'every':>5} {'min':>4} {'own':>6} {'buddy':>6} {'previous':>8} {'staging':>7} {'loaders':>7} "
             f"{'total':>6}"]
    for r in rows:
        m = r.host_memory
        lines.append(f"  {r.name:<8} {r.snapshot_every:>5} {r.snapshot_interval_s / 60:>4.1f} {m['own']:>6.1f} "
                     f"{m['buddy']:>6.1f} {m['previous']:>8.1f} {m['staging']:>7.1f} {m['loaders']:>7.1f} {m['total']:>6.1f}")
    return lines


def _hours_left(plan: Plan, good: Goodput) -> str:
    """Hours between ``good``'s 95th-percentile finish and the Capacity Blocks' end (negative: after it)."""
    start, end = plan.assume.training_start, plan.capacity_end
    if not (start and end):
        return "-"
    return f"{((end - start) / timedelta(days=1) - good.days_p95) * 24:.1f}"


def _format_stress(plan: Plan) -> list[str]:
    """Minutes lost per failure, ETTR and the 95th-percentile finish at 1x and stress_factor x the failure rate."""
    rows = [r for r in plan.rows if r.goodput and r.stress]
    if not rows:
        return []
    factor = plan.assume.stress_factor
    half = f"{'min/fail':>8} {'ETTR':>7} {'p95 d':>5} {'left h':>6}"
    lines = [f"  at 1x and {factor:g}x the failure rate (goodput.stress_factor): minutes lost per failure, ETTR, the "
             "95th-percentile finish and the hours it leaves before the Capacity Blocks end:",
             f"  {'':<8} {'1x':>29} | {f'{factor:g}x':>29}",
             f"  {'model':<8} {half} | {half}"]
    for r in rows:
        cells = [f"{g.lost_per_failure_s / 60:>8.1f} {g.ettr:>7.2%} {g.days_p95:>5.1f} {_hours_left(plan, g):>6}"
                 for g in (r.goodput, r.stress)]
        lines.append(f"  {r.name:<8} {cells[0]} | {cells[1]}")
    return lines


def _format_hot_spares(plan: Plan) -> list[str]:
    """The trade of 1 to 3 hot spares per model: GPU-hours idle against GPU-hours saved, at 1x and stress_factor x."""
    rows = [r for r in plan.rows if r.trades and r.snapshot_every]
    if not rows:
        return []
    factor = f"{plan.assume.stress_factor:g}x"

    def cells(values: list[str]) -> str:
        return " ".join(f"{v:>6}" for v in values)

    width = len(cells([""] * len(TRADE_SPARES)))
    counts = "/".join(map(str, TRADE_SPARES))
    lines = [f"  hot spares (models.<m>.hot_spares), {counts} of them against none: minutes lost per failure, the GPU-hours "
             f"of failures they save and the hours the 95th-percentile finish leaves before the blocks end at 1x and "
             f"{factor} the failure rate, the GPU-hours they keep idle (held the whole run); they pay where saved > idle:",
             f"  {'model':<8} {'min/fail 1x':>{width}} | {f'min/fail {factor}':>{width}} | {f'saved 1x':>{width}} | "
             f"{f'saved {factor}':>{width}} | {f'left h {factor}':>{width}} | {'idle':>{width}}  pays"]
    for r in rows:
        one = [t for t in r.trades if t.failure_factor == 1.0]
        stressed = [t for t in r.trades if t.failure_factor != 1.0] or one
        pays = [f"{t.spares} at {label}" for label, trades in (("1x", one), (factor, stressed)) for t in trades if t.pays]
        lines.append(
            f"  {r.name:<8} {cells([f'{t.with_spares.lost_per_failure_s / 60:.1f}' for t in one])} | "
            f"{cells([f'{t.with_spares.lost_per_failure_s / 60:.1f}' for t in stressed])} | "
            f"{cells([f'{t.saved_gpu_hours:,.0f}' for t in one])} | {cells([f'{t.saved_gpu_hours:,.0f}' for t in stressed])} | "
            f"{cells([_hours_left(plan, t.with_spares) for t in stressed])} | "
            f"{cells([f'{t.idle_gpu_hours:,.0f}' for t in one])}  {', '.join(pays) or 'no'}")
    return lines


def format_spares_trade(before: Plan, after: Plan) -> str:
    """Nodes, days and ETTR per model as the settings are and with ``after``'s spares; the entries that change."""
    def spares(plan: Plan) -> str:
        return f"{plan.spare_nodes} spare{'s' if plan.spare_nodes != 1 else ''}"

    lines = [f"Spares for {before.env}: {spares(before)} (the settings) vs {spares(after)}; days with the expected failures",
             f"  {'':<8} {spares(before):>19} | {spares(after):>19}",
             f"  {'model':<8} {'nodes':>5} {'days':>5} {'ETTR':>7} | {'nodes':>5} {'days':>5} {'ETTR':>7}  entry to write"]
    for a, b in zip(before.rows, after.rows):
        ga, gb = a.goodput, b.goodput
        entry = (f"nodes: {b.nodes}, global_batch_size: {b.global_batch_size}, steps: {b.steps}"
                 if (a.nodes, a.global_batch_size, a.steps) != (b.nodes, b.global_batch_size, b.steps) else "")
        lines.append(f"  {a.name:<8} {a.nodes:>5} {ga.days:>5.1f} {ga.ettr:>7.2%} | {b.nodes:>5} {gb.days:>5.1f} "
                     f"{gb.ettr:>7.2%}  {entry}".rstrip())
    lines.append(f"  {'cluster':<8} {before.nodes:>5} {before.goodput_days:>5.1f} {before.ettr:>7.2%} | "
                 f"{after.nodes:>5} {after.goodput_days:>5.1f} {after.ettr:>7.2%}")
    for plan in (before, after):
        lines.append(f"  {spares(plan)}: failures cost {plan.lost_node_hours:,.0f} node-hours (${plan.lost_usd:,.0f}); "
                     f"a failure finds no spare free {_percent(plan.p_no_spare)} of the time; the spares stay out of "
                     f"training for {plan.spare_nodes * plan.goodput_days * 24:,.0f} node-hours")
    return "\n".join(lines)
