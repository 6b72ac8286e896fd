"""The multi-model plan: who gets which nodes, what it costs at full size, whether storage keeps up.

Settings already refuse a plan larger than the GPU queue or its capacity reservation; this module
only reports on a valid one (``python -m cluster_config plan --env prod``, and at every synth).
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster_config.settings import Settings


@dataclass(frozen=True)
class ModelRow:
    name: str
    preset: str
    nodes: int
    gpus: int
    cost_per_hour_usd: float


@dataclass(frozen=True)
class Plan:
    env: str
    instance_type: str
    rows: tuple[ModelRow, ...]
    max_count: int
    reserved: int | None
    data_throughput_mb_s: float
    data_demand_mb_s: float
    throughput_mb_s: dict[str, float]

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
    def storage_under_provisioned(self) -> bool:
        return self.data_demand_mb_s > self.data_throughput_mb_s


def build_plan(settings: Settings) -> Plan:
    queue = settings.gpu_queue
    rows = tuple(
        ModelRow(
            name=model.name,
            preset=model.preset,
            nodes=model.nodes,
            gpus=model.nodes * queue.gpus_per_instance,
            cost_per_hour_usd=model.nodes * queue.price_per_instance_hour_usd,
        )
        for model in settings.models
    )
    gpus = sum(row.gpus for row in rows)
    file_systems = settings.storage.file_systems()
    return Plan(
        env=settings.name,
        instance_type=queue.instance_type,
        rows=rows,
        max_count=queue.max_count,
        reserved=queue.capacity_reservation.instance_count if queue.capacity_reservation else None,
        data_throughput_mb_s=file_systems["data"].throughput_mb_s,
        data_demand_mb_s=gpus * settings.storage.data_read_mb_s_per_gpu,
        throughput_mb_s={key: fs.throughput_mb_s for key, fs in file_systems.items()},
    )


def format_plan(plan: Plan) -> str:
    reserved = f", reservation {plan.reserved}" if plan.reserved is not None else ", no reservation"
    lines = [
        f"Plan for {plan.env}: {plan.nodes} x {plan.instance_type} of max {plan.max_count}{reserved}",
        f"  {'model':<10} {'preset':<12} {'nodes':>5} {'GPUs':>5} {'$/hour':>10}",
    ]
    for row in plan.rows:
        lines.append(f"  {row.name:<10} {row.preset:<12} {row.nodes:>5} {row.gpus:>5} {row.cost_per_hour_usd:>10,.2f}")
    lines.append(f"  {'total':<10} {'':<12} {plan.nodes:>5} {plan.gpus:>5} {plan.cost_per_hour_usd:>10,.2f}")
    lines.append(
        "  FSx throughput MB/s: " + ", ".join(f"{key} {value:,.0f}" for key, value in plan.throughput_mb_s.items())
    )
    ratio = plan.data_throughput_mb_s / plan.data_demand_mb_s if plan.data_demand_mb_s else float("inf")
    lines.append(
        f"  data read demand {plan.data_demand_mb_s:,.0f} MB/s ({plan.gpus} GPUs) vs data file system "
        f"{plan.data_throughput_mb_s:,.0f} MB/s: {ratio:.2f}x"
    )
    if plan.storage_under_provisioned:
        lines.append(
            "  WARNING: the data file system is under-provisioned for a full-size run; raise "
            "storage.data.storage_capacity_gib or throughput_per_tib, or lower data_read_mb_s_per_gpu "
            "if the loaders read less (e.g. they cache shards on the local NVMe)"
        )
    return "\n".join(lines)


def fsx_expectations(settings: Settings) -> str:
    """Provisioned throughput per mount as ``jobs/fsx_perf.sh`` reads it from ``FSX_EXPECTED_MB_S``."""
    return ",".join(f"{fs.mount_dir}={fs.throughput_mb_s:.1f}" for fs in settings.storage.file_systems().values())
