"""The acceptance run's node checks: every queue boots, the jobs venv runs on every node type, the
node health check passes, and on GPU nodes the driver supports torch's CUDA build and the GPUs'
memory is free of uncorrectable errors. ``node_record`` writes a ``NodeRecord`` on each node; this
module judges them all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from cluster_checks.verdict import Check, check, not_measured


@dataclass
class NodeRecord:
    """What jobs/acceptance.sh records on one node (DIR/nodes/<node>.json); None: not recorded."""

    node: str
    queue: str = ""
    gpus_expected: Optional[int] = None  # the queue's GPUs per instance (EXPECTED_GPUS of node_health.sh)
    health_rc: Optional[int] = None  # node_scripts/node_health.sh's exit code: 0 healthy, 1 the reason
    health_output: str = ""  # its output; the last line is "healthy" or the reason
    venv_ok: Optional[bool] = None  # $JOBS_VENV/bin/python imported torch and the jobs packages
    venv_detail: str = ""  # its error, or the versions it printed
    driver_cuda: Optional[str] = None  # the CUDA version the driver supports (nvidia-smi's "CUDA Version")
    torch_cuda: Optional[str] = None  # torch.version.cuda of the jobs venv
    ecc_uncorrected: Optional[int] = None  # ecc.errors.uncorrected.volatile.total, summed over the GPUs
    row_remap_pending: Optional[bool] = None  # a GPU waits for a reset to remap a bad memory row
    row_remap_failed: Optional[bool] = None


QUEUES = "nodes: every queue boots"
VENV = "nodes: the jobs venv runs on every node type"
HEALTH = "nodes: health check (GPU count, fatal Xid, EFA, FSx mounts)"
DRIVER = "nodes: GPU driver supports torch's CUDA build"
ECC = "nodes: GPU memory ECC clean"
HEALTH_SOURCE = "node_scripts/node_health.sh (the Slurm prolog/epilog check)"
DRIVER_SOURCE = ("NVIDIA CUDA compatibility: the driver must support the CUDA version the code was built for; "
                 "Triton/torch.compile emit PTX the driver must JIT")
ECC_SOURCE = ("NVIDIA GPU memory error management (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt; Hopper "
              "included): an uncorrectable error or a pending row remap needs a GPU reset")


def node_checks(records: Sequence[NodeRecord], queues: Mapping[str, int], gpu: bool = True) -> list[Check]:
    checks = [queues_boot(records, queues), venv_runs(records), node_health(records)]
    if not gpu:
        return checks + [Check.no_gpu(DRIVER, "driver CUDA >= torch CUDA", DRIVER_SOURCE),
                         Check.no_gpu(ECC, "0 uncorrectable errors, no pending row remap", ECC_SOURCE)]
    gpu_nodes = [r for r in records if (r.gpus_expected or 0) > 0]
    return checks + [driver_supports_torch(gpu_nodes), ecc_clean(gpu_nodes)]


def queues_boot(records: Sequence[NodeRecord], queues: Mapping[str, int]) -> Check:
    """Every queue named in expected.json started the nodes asked of it (a node that ran its step booted)."""
    expected = ", ".join(f"{q} {n}" for q, n in queues.items())
    if not queues:
        return not_measured(QUEUES, "", "expected.json names no queues: jobs/acceptance.sh lists every queue "
                            "with the nodes it asks of it", "cluster_config (the cluster's queues)")
    seen = {q: sum(1 for r in records if r.queue == q and r.health_rc is not None) for q in queues}
    short = [f"{q} ({seen[q]} of {n})" for q, n in queues.items() if seen[q] < n]
    return check(QUEUES, not short, ", ".join(f"{q} {seen[q]}" for q in queues), expected,
                 f"nodes that never ran their step: {', '.join(short)}; first look at 'sinfo -R' and the head "
                 "node's /var/log/parallelcluster/slurm_resume.log and clustermgtd (capacity, AMI, bootstrap errors)",
                 "cluster_config (the cluster's queues)")


def venv_runs(records: Sequence[NodeRecord]) -> Check:
    types = sorted({r.queue for r in records})
    broken = [r for r in records if r.venv_ok is False]
    unknown = [r.node for r in records if r.venv_ok is None]
    source = "jobs/env.sh (JOBS_VENV on the shared /opt/llm-jobs)"
    if not records or unknown:
        return not_measured(VENV, "imports torch and the jobs packages on every node",
                            f"not recorded for {', '.join(unknown) or 'any node'}", source)
    return check(VENV, not broken, f"{len(records) - len(broken)} of {len(records)} nodes ({', '.join(types)})",
                 "imports torch and the jobs packages on every node",
                 "; ".join(f"{r.node} ({r.queue}): {r.venv_detail or 'failed'}" for r in broken)
                 + ": first run $JOBS_VENV/bin/python -c 'import torch' on that node; rebuild the venv for the "
                 "node type's OS and architecture if it differs from the head node's", source)


def node_health(records: Sequence[NodeRecord]) -> Check:
    """node_health.sh on every node: exit 0 and 'healthy', or its last line names what is wrong."""
    missing = [r.node for r in records if r.health_rc is None]
    if not records or missing:
        return not_measured(HEALTH, "'healthy' on every node",
                            f"no health result from {', '.join(missing) or 'any node'}", HEALTH_SOURCE)
    sick = [r for r in records if r.health_rc != 0]
    return check(HEALTH, not sick, f"{len(records) - len(sick)} of {len(records)} healthy", "'healthy' on every node",
                 "; ".join(f"{r.node}: {_last_line(r.health_output) or f'exit {r.health_rc}'}" for r in sick)
                 + ": the prolog drains such a node with this reason; replace it (terminate the instance, "
                 "ParallelCluster starts a new one) and rerun", HEALTH_SOURCE)


def driver_supports_torch(gpu_nodes: Sequence[NodeRecord]) -> Check:
    expected = "driver CUDA >= torch CUDA on every GPU node"
    if not gpu_nodes:
        return not_measured(DRIVER, expected, "no GPU node recorded", DRIVER_SOURCE, True)
    unknown = [r.node for r in gpu_nodes if not (r.driver_cuda and r.torch_cuda)]
    if unknown:
        return not_measured(DRIVER, expected, f"versions not recorded on {', '.join(unknown)}", DRIVER_SOURCE, True)
    old = [r for r in gpu_nodes if _version(r.driver_cuda) < _version(r.torch_cuda)]
    pairs = sorted({f"driver {r.driver_cuda} / torch {r.torch_cuda}" for r in gpu_nodes})
    return check(DRIVER, not old, ", ".join(pairs), expected,
                 f"{', '.join(r.node for r in old)}: the driver is older than torch's CUDA build: use the AMI whose "
                 "driver supports it (node_scripts/ami/), or a torch wheel built for the driver's CUDA",
                 DRIVER_SOURCE, needs_gpu=True)


def ecc_clean(gpu_nodes: Sequence[NodeRecord]) -> Check:
    expected = "0 uncorrectable ECC errors, no pending or failed row remap"
    if not gpu_nodes:
        return not_measured(ECC, expected, "no GPU node recorded", ECC_SOURCE, True)
    unknown = [r.node for r in gpu_nodes if r.ecc_uncorrected is None]
    if unknown:
        return not_measured(ECC, expected, f"ECC counters not recorded on {', '.join(unknown)}", ECC_SOURCE, True)
    bad = [r for r in gpu_nodes if r.ecc_uncorrected or r.row_remap_pending or r.row_remap_failed]
    total = sum(r.ecc_uncorrected or 0 for r in gpu_nodes)
    return check(ECC, not bad, f"{total} uncorrectable on {len(gpu_nodes)} GPU node(s)", expected,
                 "; ".join(f"{r.node}: {r.ecc_uncorrected} uncorrectable"
                           + (", row remap pending" if r.row_remap_pending else "")
                           + (", row remap FAILED" if r.row_remap_failed else "") for r in bad)
                 + ": a pending remap clears with a GPU reset (reboot the node); errors that come back or a failed "
                 "remap mean replacing the instance", ECC_SOURCE, needs_gpu=True)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
