"""The acceptance run's network checks, from nccl-tests logs and the trainer's own NCCL log.

Across 2 nodes (EFA) and within one (NVLink), each all_reduce's bus bandwidth is held against a
published figure; the inter-node run's transport must be EFA, a run forced onto TCP must be
refused, and PyTorch's NCCL must use EFA too. The logs are parsed by ``nccl_tests`` (rows and the
transport check); this module only judges them. On a cluster without GPUs every check says "not
measured: no GPU".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from cluster_checks import nccl_tests
from cluster_checks.results import Row, human_bytes
from cluster_checks.verdict import FAIL, Check, check, not_measured

# nccl-tests all_reduce_perf on 2 x p5.48xlarge over EFA: out-of-place bus bandwidth (GB/s) by message
# size, as published in aws-samples/awsome-distributed-training, micro-benchmarks/nccl-tests/README.md
# ("Results", 8 B to 16 GiB). p5e.48xlarge has the same network as p5 (32 EFA interfaces, 3,200 Gbps
# per instance; its H200s differ in memory, not links), so the figure holds for the target.
P5_EFA_ALL_REDUCE_BUSBW = {
    256 << 20: 342.81, 512 << 20: 393.34, 1 << 30: 436.95, 2 << 30: 443.72,
    4 << 30: 465.87, 8 << 30: 479.28, 16 << 30: 487.09,
}
P5_EFA_SOURCE = ("aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md, 'Results': "
                 "all_reduce_perf on 2 x p5.48xlarge (EFA 3,200 Gbps, same as p5e), out-of-place busbw")
# Below 80 % of the published figure is a broken path, not run-to-run noise: losing GPUDirect RDMA
# or most NICs costs half or more, while versions and placement move the figure by ~10 %.
INTER_NODE_MIN_RATIO = 0.8
# 8 x H100/H200 (NVLink 4, 450 GB/s per direction): all_reduce with NVLink SHARP peaks at ~480 GB/s
# bus bandwidth at large sizes (~370 GB/s effective NVLink bandwidth without it): the NCCL
# maintainer in NVIDIA/nccl-tests issue #212. H200 SXM has the same NVLink 4 as H100 SXM.
NVLINK_ALL_REDUCE_BUSBW = 480.0
NVLINK_SOURCE = ("NVIDIA/nccl-tests issue #212 (NCCL maintainer): 8 x H100 all_reduce peaks at ~480 GB/s busbw "
                 "with NVLink SHARP, ~370 GB/s without; NVLink 4 line rate 450 GB/s per direction")
# 75 % of 480 = 360 GB/s: what cluster_config/plan.py assumes for NVLink (BUS_EFFICIENCY 0.8 x 450 GB/s)
# in its MFU estimates, so a node at or above it trains as fast as planned; a ring without NVLink
# SHARP (~370) still passes, an NVLink down to PCIe (tens of GB/s) does not.
INTRA_NODE_MIN_RATIO = 0.75
# Bandwidth is compared at the largest message of the sweep, which must reach 1 GiB: below that
# latency dominates (issue #212: "256M is too small to reach peak bandwidth").
MIN_COMPARED_BYTES = 1 << 30
GPUS_PER_NODE = 8  # p5e.48xlarge: one nccl-tests rank per GPU, every GPU of each node


INTER_NODE = "network: all_reduce across 2 nodes (EFA)"
INTRA_NODE = "network: all_reduce within a node (NVLink)"
TRANSPORT = "network: inter-node traffic on EFA, not TCP"
TCP_CONTROL = "network: a run forced onto TCP is refused"
PYTORCH_TRANSPORT = "network: PyTorch's NCCL uses EFA"
TRANSPORT_SOURCE = ("jobs/cluster_checks/nccl_tests.py check_transport: the 'Using network' and 'NET/OFI Selected "
                    "provider' lines of NCCL_DEBUG=INFO")
TCP_CONTROL_SOURCE = "acceptance rule: a TCP-fallback run is refused, never passed (as jobs/nccl_tests.sh fails it)"
PYTORCH_TRANSPORT_SOURCE = ("the same check on the trainer's own NCCL (torch's wheel, not the system NCCL nccl-tests "
                            "links): NCCL_DEBUG=INFO of the drill's uninterrupted run (jobs/acceptance.sh)")


@dataclass(frozen=True)
class NcclRun:
    """One nccl-tests run as ``nccl_tests`` parses it, plus the hosts its ranks ran on."""

    rows: list[Row]
    text: str
    hosts: list[str]


def load_nccl_run(folder: Path) -> NcclRun:
    """The ``*_perf.log`` files of ``folder`` (OSError if none; nccl_tests.ParseError if unfinished)."""
    logs = sorted(folder.glob("*_perf.log"))
    if not logs:
        raise FileNotFoundError(f"no *_perf.log in {folder}")
    rows, text = nccl_tests.parse_logs(logs)
    return NcclRun(rows, text, sorted(set(nccl_tests.RANK_LINE.findall(text))))


def _largest_all_reduce(rows: Sequence[Row]) -> Optional[Row]:
    all_reduce = [r for r in rows if r.collective == "all_reduce"]
    return max(all_reduce, key=lambda r: r.size_bytes) if all_reduce else None


def _bandwidth_problem(run: NcclRun, nodes_ok: bool, nodes_wanted: str) -> str:
    """Why the run cannot be compared at all ("" when it can)."""
    largest = _largest_all_reduce(run.rows)
    if largest is None:
        return "the logs hold no all_reduce_perf results: run all_reduce_perf"
    if not nodes_ok:
        return f"ran on {len(run.hosts)} node(s) ({', '.join(run.hosts)}), not {nodes_wanted}"
    if largest.world_size != GPUS_PER_NODE * len(run.hosts):
        return (f"{largest.world_size} ranks on {len(run.hosts)} node(s), not {GPUS_PER_NODE} per node: a figure "
                "from fewer GPUs is not comparable; run one rank per GPU (srun --ntasks-per-node=8 --gpus-per-node=8)")
    if not all(r.correct for r in run.rows if r.collective == "all_reduce"):
        return ("nccl-tests found wrong all_reduce results (#wrong > 0): a GPU or link corrupts data; run "
                "jobs/validate_gpu_efa.sh and the node health check on these nodes and drain the bad one")
    if largest.size_bytes < MIN_COMPARED_BYTES:
        return (f"largest message {human_bytes(largest.size_bytes)} is below {human_bytes(MIN_COMPARED_BYTES)}, "
                "where bandwidth is still latency-bound: run up to 16 GiB (MAX_BYTES=16G)")
    return ""


def inter_node_all_reduce(run: NcclRun) -> Check:
    """all_reduce bus bandwidth across nodes vs the published 2 x p5 figure at the same message size."""
    largest = _largest_all_reduce(run.rows)
    size = max((s for s in P5_EFA_ALL_REDUCE_BUSBW if largest and s <= largest.size_bytes), default=1 << 30)
    published = P5_EFA_ALL_REDUCE_BUSBW[size]
    floor = INTER_NODE_MIN_RATIO * published
    expected = (f">= {floor:.1f} GB/s busbw at {human_bytes(size)} ({INTER_NODE_MIN_RATIO:.0%} of the published "
                f"{published:.2f})")
    problem = _bandwidth_problem(run, len(run.hosts) >= 2, "2 or more")
    if problem:
        return check(INTER_NODE, False, "", expected, problem, P5_EFA_SOURCE, needs_gpu=True)
    measured = largest.busbw_gbps
    ratio = measured / published
    return check(
        INTER_NODE, measured >= floor,
        f"{measured:.1f} GB/s busbw at {human_bytes(largest.size_bytes)}, {largest.world_size} ranks on "
        f"{len(run.hosts)} nodes", expected,
        f"{ratio:.0%} of the published figure: first rerun jobs/validate_gpu_efa.sh on these nodes (EFA devices, "
        "aws-ofi-nccl on LD_LIBRARY_PATH), then look in the log for 'GDR 0' (GPUDirect RDMA off) and how many "
        "NICs 'Selected provider is efa' found (32 on p5/p5e)",
        P5_EFA_SOURCE, why_pass=f"{ratio:.0%} of the published figure", needs_gpu=True, ratio=ratio,
        limit=INTER_NODE_MIN_RATIO)


def intra_node_all_reduce(run: NcclRun) -> Check:
    """all_reduce bus bandwidth of one node's 8 GPUs vs the published NVLink 4 figure."""
    floor = INTRA_NODE_MIN_RATIO * NVLINK_ALL_REDUCE_BUSBW
    expected = (f">= {floor:.0f} GB/s busbw at >= {human_bytes(MIN_COMPARED_BYTES)} "
                f"({INTRA_NODE_MIN_RATIO:.0%} of the published {NVLINK_ALL_REDUCE_BUSBW:.0f})")
    problem = _bandwidth_problem(run, len(run.hosts) == 1, "exactly 1 (this is the NVLink check)")
    if problem:
        return check(INTRA_NODE, False, "", expected, problem, NVLINK_SOURCE, needs_gpu=True)
    largest = _largest_all_reduce(run.rows)
    measured = largest.busbw_gbps
    ratio = measured / NVLINK_ALL_REDUCE_BUSBW
    return check(
        INTRA_NODE, measured >= floor,
        f"{measured:.1f} GB/s busbw at {human_bytes(largest.size_bytes)}, {largest.world_size} GPUs on "
        f"{run.hosts[0]}", expected,
        f"{ratio:.0%} of the published figure: first run 'nvidia-smi nvlink --status' and 'nvidia-smi topo -m' on "
        f"{run.hosts[0]} (jobs/validate_gpu_efa.sh prints both): every GPU pair must show NV18; check that "
        "nvidia-fabricmanager is running",
        NVLINK_SOURCE, why_pass=f"{ratio:.0%} of the published figure", needs_gpu=True, ratio=ratio,
        limit=INTRA_NODE_MIN_RATIO)


def transport(text: str) -> Check:
    """The inter-node run went through aws-ofi-nccl on the efa provider (nccl_tests.check_transport)."""
    verdict = nccl_tests.check_transport(text)
    return check(TRANSPORT, verdict.ok, verdict.message if verdict.ok else verdict.message.split(":")[0],
                 "NCCL network Libfabric (aws-ofi-nccl), libfabric provider efa", verdict.message, TRANSPORT_SOURCE,
                 needs_gpu=True)


def tcp_control(text: str) -> Check:
    """A run forced onto sockets (NCCL_NET=Socket) must be refused: the transport check is shown to bite."""
    verdict = nccl_tests.check_transport(text)
    return check(TCP_CONTROL, not verdict.ok,
                 f"refused: {verdict.message.split(':')[0]}" if not verdict.ok else "accepted",
                 "the transport check refuses it",
                 "the transport check accepted a run meant to use TCP sockets: either NCCL_NET=Socket did not "
                 "reach the ranks (the run used EFA; check how jobs/acceptance.sh exports it to srun) or the "
                 f"check no longer sees a socket fallback ({verdict.message}); fix that before trusting '{TRANSPORT}'",
                 TCP_CONTROL_SOURCE, needs_gpu=True)


def pytorch_transport(folder: Path) -> Check:
    """The trainer's own NCCL went over EFA on every rank (its NCCL_DEBUG=INFO logs in ``folder``): torch
    ships its own NCCL, which finds the aws-ofi-nccl plugin or not apart from the system NCCL of nccl-tests."""
    expected = "NCCL network Libfabric (aws-ofi-nccl), libfabric provider efa, on every rank"
    text = _raw_text(folder, "*.log")
    if not text:
        return not_measured(PYTORCH_TRANSPORT, expected, f"no NCCL log in {folder}: jobs/acceptance.sh's drill "
                            "writes it from its uninterrupted run (NCCL_DEBUG_FILE); the drill did not run or its "
                            "workers never started", PYTORCH_TRANSPORT_SOURCE, True)
    verdict = nccl_tests.check_transport(text)
    return check(PYTORCH_TRANSPORT, verdict.ok, verdict.message if verdict.ok else verdict.message.split(":")[0],
                 expected, f"{verdict.message} The trainer loads torch's NCCL (torch.cuda.nccl.version()), not the "
                 "system one: if nccl-tests used EFA, that NCCL does not load the plugin (compare the 'NET/Plugin' "
                 "lines of both logs)", PYTORCH_TRANSPORT_SOURCE, needs_gpu=True)


def network_checks(nccl_dir: Path, gpu: bool = True) -> list[Check]:
    """The five network checks from DIR/nccl/{inter_node,intra_node,tcp_control,pytorch}."""
    if not gpu:
        return [Check.no_gpu(INTER_NODE, f"{INTER_NODE_MIN_RATIO:.0%} of the published 2 x p5 busbw", P5_EFA_SOURCE),
                Check.no_gpu(INTRA_NODE, f"{INTRA_NODE_MIN_RATIO:.0%} of {NVLINK_ALL_REDUCE_BUSBW:.0f} GB/s",
                             NVLINK_SOURCE),
                Check.no_gpu(TRANSPORT, "EFA", TRANSPORT_SOURCE),
                Check.no_gpu(TCP_CONTROL, "refused", TCP_CONTROL_SOURCE),
                Check.no_gpu(PYTORCH_TRANSPORT, "EFA", PYTORCH_TRANSPORT_SOURCE)]
    checks: list[Check] = []
    inter = _nccl_or_check(nccl_dir / "inter_node", INTER_NODE, P5_EFA_SOURCE)
    if isinstance(inter, Check):
        checks.append(inter)
        checks.append(transport(_raw_text(nccl_dir / "inter_node")) if inter.status == FAIL
                      else not_measured(TRANSPORT, "EFA", inter.why, TRANSPORT_SOURCE, True))
    else:
        checks += [inter_node_all_reduce(inter), transport(inter.text)]
    intra = _nccl_or_check(nccl_dir / "intra_node", INTRA_NODE, NVLINK_SOURCE)
    checks.insert(1, intra if isinstance(intra, Check) else intra_node_all_reduce(intra))
    control = nccl_dir / "tcp_control"
    text = _raw_text(control)
    checks.append(tcp_control(text) if text else not_measured(
        TCP_CONTROL, "refused", f"no *_perf.log in {control}: jobs/acceptance.sh runs all_reduce_perf on 2 nodes "
        "with NCCL_NET=Socket into that folder", TCP_CONTROL_SOURCE, True))
    checks.append(pytorch_transport(nccl_dir / "pytorch"))
    return checks


def _nccl_or_check(folder: Path, name: str, source: str) -> NcclRun | Check:
    """The parsed run, or the check's verdict when there is nothing to compare."""
    try:
        return load_nccl_run(folder)
    except OSError:
        return not_measured(name, "", f"no *_perf.log in {folder}: the nccl-tests step did not run "
                            "(see the acceptance job's output)", source, True)
    except nccl_tests.ParseError as exc:  # the benchmark started but did not finish: the check failed
        return check(name, False, "", "", f"unfinished run: {exc}", source, needs_gpu=True)


def _raw_text(folder: Path, pattern: str = "*_perf.log") -> str:
    """The logs as text, for the transport check, which needs no finished run."""
    return "\n".join(p.read_text(errors="replace") for p in sorted(folder.glob(pattern)))
