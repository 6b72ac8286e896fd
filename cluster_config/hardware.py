"""What the settings' instance types give the plan and the jobs: each GPU's memory, peak and links, and
each file system's provisioned throughput. Near the bottom of the planner: it reads only the settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster_config.settings import Settings


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float  # nvidia-smi memory.total
    peak_tflops: float  # dense bf16, vendor datasheet (the MFU denominator of jobs/training/components/metrics.py)
    # Link rates per GPU and direction, GB/s: within the node (NVLink; PCIe where there is none) and
    # across nodes (the instance's EFA bandwidth / its GPUs). Collectives reach BUS_EFFICIENCY of them.
    node_link_gb_s: float = 0.0
    network_gb_s: float = 0.0


# NVLink 4 (H100/H200 SXM): 900 GB/s per GPU, 450 each way; NVLink 3 (A100): 600, 300 each way.
# EFA: p5/p5e/p5en 3,200 Gbps per instance, p4d/p4de 400 Gbps, g5.48xlarge 100 Gbps (EC2 instance types).
GPUS = {
    "p5e.48xlarge": Gpu("H200", 143771 / 1024, 989, 450, 3200 / 8 / 8),
    "p5en.48xlarge": Gpu("H200", 143771 / 1024, 989, 450, 3200 / 8 / 8),
    "p5.48xlarge": Gpu("H100", 81559 / 1024, 989, 450, 3200 / 8 / 8),
    "p4de.24xlarge": Gpu("A100-80GB", 81920 / 1024, 312, 300, 400 / 8 / 8),
    "p4d.24xlarge": Gpu("A100-40GB", 40960 / 1024, 312, 300, 400 / 8 / 8),
    "g5.12xlarge": Gpu("A10G", 23028 / 1024, 125, 32, 40 / 8 / 4),
    "g5.48xlarge": Gpu("A10G", 23028 / 1024, 125, 32, 100 / 8 / 8),
}


# Host memory per instance, GiB (EC2 instance types): what a node's in-memory snapshots, its buddy's copy,
# the data loaders and the pinned staging share (cluster_config/plan.py: the host memory budget).
HOST_MEMORY_GIB = {
    "p5e.48xlarge": 2048, "p5en.48xlarge": 2048, "p5.48xlarge": 2048, "p4de.24xlarge": 1152, "p4d.24xlarge": 1152,
    "g5.12xlarge": 192, "g5.48xlarge": 768,
}


def host_memory_gib(settings: Settings) -> float | None:
    """A GPU node's host memory: plan.host_memory_gib, else the instance type's; None when neither is known."""
    return settings.plan.host_memory_gib or HOST_MEMORY_GIB.get(settings.gpu_queue.instance_type)


def gpu_of(settings: Settings) -> Gpu | None:
    known = GPUS.get(settings.gpu_queue.instance_type)
    memory_gib = settings.plan.gpu_memory_gib or (known.memory_gib if known else None)
    tflops = settings.plan.gpu_peak_tflops or (known.peak_tflops if known else None)
    if memory_gib is None or tflops is None:
        return None
    if known is None:
        return Gpu("GPU", memory_gib, tflops)
    return Gpu(known.name, memory_gib, tflops, known.node_link_gb_s, known.network_gb_s)


def fsx_expectations(settings: Settings) -> str:
    """Provisioned throughput per mount as ``jobs/fsx_perf.sh`` reads it from ``FSX_EXPECTED_MB_S``."""
    return ",".join(f"{fs.mount_dir}={fs.throughput_mb_s:.1f}" for fs in settings.storage.file_systems().values())
