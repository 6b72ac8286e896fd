"""The acceptance run's report: every check with its threshold and source, and one go / no-go.

    python -m cluster_checks.acceptance report DIR [--out OUT]
    python -m cluster_checks.acceptance drill-args --ranks N   (the drill's allocation-dependent overrides)

``jobs/acceptance.sh`` runs the checks and leaves their raw results in DIR; this module turns them
into ``report.json``, ``report.txt`` (the table) and ``report.png`` (one bar per check), written to
OUT (default DIR). Exit status: 0 go, 1 no-go, 2 bad input (no DIR or no ``expected.json``).

DIR holds (every part optional except ``expected.json``; a part that is missing makes its checks
"not measured", never absent, so no check is skipped silently):

    expected.json             what the run must cover: {"gpu": true, "queues": {"gpu": 2, "cpu": 1},
                              "layouts": ["model7", ...], "mounts": ["/fsx/data", ...], "job": "1234"}
    nodes/<node>.json         one per node (``NodeRecord``): node_health.sh's exit code and output,
                              the jobs venv, the driver's and torch's CUDA versions, ECC counters
    nccl/inter_node/*_perf.log   nccl-tests (NCCL_DEBUG=INFO) across 2 nodes, as jobs/nccl_tests.sh runs it
    nccl/intra_node/*_perf.log   the same on 1 node (8 GPUs over NVLink)
    nccl/tcp_control/*_perf.log  a 2-node run forced onto TCP sockets (NCCL_NET=Socket): the transport
                              check must refuse it
    nccl/pytorch/*.log        the trainer's own NCCL (torch's, not the system NCCL nccl-tests links) at
                              NCCL_DEBUG=INFO: one file per rank of the drill's uninterrupted run
    storage/summary.json      python -m cluster_checks.fsx_perf --out DIR/storage (jobs/fsx_perf.sh)
    layouts/<name>.json       one per production layout, shrunk (``layout_checks`` lists the keys)
    drill/drill.json          python -m cluster_checks.acceptance drill (``drill_record`` lists the keys)

The verdict (``Report.verdict``): "go" only when no check failed and every check that must run on
the target ran and passed. On a GPU cluster (``gpu=True``) that is every check: a GPU check that
says "not measured" there is a no-go, since it is exactly what the run is for. On a CPU cluster
(the local rehearsal, ``gpu=False``) a check that needs a GPU cannot run and says "not measured:
no GPU"; that alone does not block, but every other check must still pass. A CPU "go" means the run
and its wiring work, not that any GPU is fit for training.

Parsing stays where it is: nccl-tests logs through ``nccl_tests`` (rows and the transport check),
the FSx summary through ``fsx_report`` (its statuses and notes). Torch is not imported.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Mapping, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from cli import ArgumentParser, fail  # noqa: E402
from cluster_checks import fsx_report, nccl_tests  # noqa: E402
from cluster_checks.results import Row, human_bytes  # noqa: E402

PASS, FAIL, NOT_MEASURED = "pass", "fail", "not measured"
GO, NO_GO = "go", "no-go"
GIB = 1 << 30

# --- thresholds and their sources ----------------------------------------------------------------

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

INIT_STD_TOLERANCE = 0.05  # sampling error of even a 4,096-value shard is ~1 %: 5 % only fails a wrong sigma
MEMORY_TOLERANCE = 0.10  # acceptance criterion: the real peak at most 10 % above the dry run's prediction
# ... and at most this far below it. The dry run is eager; the job compiles its layers, and Inductor's
# partitioner recomputes cheap pointwise results instead of saving them: on an H100 (benchmarks/results/
# gpu_check_H100) the compiled peaks were 4-17 % under the prediction, the same rank eager 12-15 % above
# the compiled one. Further below, the plan wastes memory it could spend on larger micro-batches.
MEMORY_CONSERVATIVE = 0.25
MFU_MIN_RATIO = 0.8  # a shrunk layout has less data-parallel traffic than production: it should reach the plan
# Compiled vs eager losses on the GPU, bf16: each op rounds at 2^-8 (0.4 %) and Inductor reorders the fp32
# sums; over a few tens of steps the losses drift apart by well under 2 %. A wrong fusion is far larger.
# (On CPU, fp32, tests/training/test_compile.py holds 2e-4.)
COMPILE_RTOL = 0.02
# A stalled rank must be noticed within the collective timeout (train.timeout_s); NCCL's watchdog sees
# the expired collective on its next poll, and the rank's teardown (dumps, traceback) takes seconds.
STALL_GRACE_S = 30.0


# --- the report ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    name: str  # "<section>: <what>", e.g. "network: all_reduce across 2 nodes (EFA)"
    status: str  # PASS, FAIL or NOT_MEASURED
    measured: str  # what the run saw, with units ("" when not measured)
    expected: str  # the pass condition, with units
    why: str  # on a fail or not measured: the cause and the runbook's first action; on a pass: context
    source: str  # where the threshold comes from (a publication, a spec, a project file)
    needs_gpu: bool = False  # cannot run on a CPU cluster
    ratio: Optional[float] = None  # measured / expected where both are numbers (the plot's bar)
    limit: Optional[float] = None  # the ratio at which the check passes (the plot's tick)

    @classmethod
    def no_gpu(cls, name: str, expected: str, source: str) -> Check:
        """A GPU check on a cluster without GPUs: it says so instead of disappearing."""
        return cls(name, NOT_MEASURED, "", expected, "no GPU: this check runs on the GPU cluster", source,
                   needs_gpu=True)


@dataclass
class Report:
    gpu: bool  # the cluster under test has GPUs: every check must run and pass
    checks: list[Check] = field(default_factory=list)
    context: dict = field(default_factory=dict)  # job id, folder: copied into report.json

    def blocking(self) -> list[Check]:
        """The checks that make it a no-go (see the module's docstring for the rule)."""
        return [c for c in self.checks
                if c.status == FAIL or (c.status == NOT_MEASURED and (self.gpu or not c.needs_gpu))
                or c.status not in (PASS, FAIL, NOT_MEASURED)]

    @property
    def verdict(self) -> str:
        # No checks at all says nothing about the cluster: not a go.
        return GO if self.checks and not self.blocking() else NO_GO

    def as_dict(self) -> dict:
        return {**self.context, "verdict": self.verdict, "gpu": self.gpu,
                "blocking": [c.name for c in self.blocking()],
                "checks": [asdict(c) for c in self.checks]}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2) + "\n"

    def table(self) -> str:
        return render_table(self)

    def write(self, out_dir: Path) -> dict[str, Path]:
        """report.json, report.txt and report.png in ``out_dir``; returns their paths."""
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = {"json": out_dir / "report.json", "table": out_dir / "report.txt", "plot": out_dir / "report.png"}
        paths["json"].write_text(self.to_json())
        paths["table"].write_text(self.table())
        plot_report(self, paths["plot"])
        return paths


def render_table(report: Report) -> str:
    blocking = report.blocking()
    target = "GPU cluster" if report.gpu else "CPU cluster: checks that need a GPU may be not measured"
    head = f"acceptance: {report.verdict.upper()} ({target})"
    if blocking:
        head += f": {len(blocking)} of {len(report.checks)} checks block it"
    columns = ["status", "check", "measured", "expected"]
    rows = [[c.status, c.name, c.measured or "-", c.expected] for c in report.checks]
    widths = [max(len(cell) for cell in column) for column in zip(columns, *rows)]
    lines = [head, ""]
    for row in [columns, *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    # The reasons under the table: what failed first (with what to do), then what did not run.
    notes = [c for c in report.checks if c.status == FAIL] + [c for c in report.checks if c.status == NOT_MEASURED]
    if notes:
        lines.append("")
        lines.extend(f"{c.status}: {c.name}: {c.why}" for c in notes)
    lines.append("")
    lines.append("sources:")
    lines.extend(f"  {source}" for source in dict.fromkeys(c.source for c in report.checks if c.source))
    return "\n".join(lines) + "\n"


def plot_report(report: Report, path: Path) -> None:
    """One horizontal bar per check: measured / expected, coloured by status, a tick where it passes."""
    colours = {PASS: "tab:green", FAIL: "tab:red", NOT_MEASURED: "tab:gray"}
    checks = report.checks[::-1]  # first check on top
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.32 * max(len(checks), 1)))
    for y, c in enumerate(checks):
        numeric = c.ratio is not None and math.isfinite(c.ratio)
        # Checks without a number (pass/fail facts) get a full-length hatched bar in their colour.
        width = max(min(c.ratio, 2.0), 0.02) if numeric else 1.0  # a failing 0.001 stays visible
        ax.barh(y, width, color=colours.get(c.status, "black"), alpha=0.85 if numeric else 0.35,
                hatch=None if numeric else "//", edgecolor="black", linewidth=0.3)
        if c.limit is not None:
            ax.plot([c.limit, c.limit], [y - 0.4, y + 0.4], color="black", linewidth=1.5)
        label = (f"{c.ratio:.2f}" + (f" (limit {c.limit:.2f})" if c.limit is not None else "")) if numeric \
            else c.status
        ax.text(width + 0.02, y, label, va="center", fontsize=7)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(checks)), [c.name for c in checks], fontsize=7)
    ax.set_xlim(0, 2.3)
    ax.set_xlabel("measured / expected (black tick: pass limit; hatched: no number, status only)")
    ax.set_title(f"acceptance: {report.verdict.upper()} "
                 f"({'GPU' if report.gpu else 'CPU'} cluster, {len(report.blocking())} blocking)")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _check(name: str, ok: bool, measured: str, expected: str, why_fail: str, source: str, *,
           why_pass: str = "", needs_gpu: bool = False, ratio: Optional[float] = None,
           limit: Optional[float] = None) -> Check:
    return Check(name, PASS if ok else FAIL, measured, expected, why_pass if ok else why_fail, source,
                 needs_gpu, ratio, limit)


def _not_measured(name: str, expected: str, why: str, source: str, needs_gpu: bool = False) -> Check:
    return Check(name, NOT_MEASURED, "", expected, why, source, needs_gpu)


# --- network: nccl-tests -------------------------------------------------------------------------

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
        return _check(INTER_NODE, False, "", expected, problem, P5_EFA_SOURCE, needs_gpu=True)
    measured = largest.busbw_gbps
    ratio = measured / published
    return _check(
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
        return _check(INTRA_NODE, False, "", expected, problem, NVLINK_SOURCE, needs_gpu=True)
    largest = _largest_all_reduce(run.rows)
    measured = largest.busbw_gbps
    ratio = measured / NVLINK_ALL_REDUCE_BUSBW
    return _check(
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
    return _check(TRANSPORT, verdict.ok, verdict.message if verdict.ok else verdict.message.split(":")[0],
                  "NCCL network Libfabric (aws-ofi-nccl), libfabric provider efa", verdict.message, TRANSPORT_SOURCE,
                  needs_gpu=True)


def tcp_control(text: str) -> Check:
    """A run forced onto sockets (NCCL_NET=Socket) must be refused: the transport check is shown to bite."""
    verdict = nccl_tests.check_transport(text)
    return _check(TCP_CONTROL, not verdict.ok,
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
        return _not_measured(PYTORCH_TRANSPORT, expected, f"no NCCL log in {folder}: jobs/acceptance.sh's drill "
                             "writes it from its uninterrupted run (NCCL_DEBUG_FILE); the drill did not run or its "
                             "workers never started", PYTORCH_TRANSPORT_SOURCE, True)
    verdict = nccl_tests.check_transport(text)
    return _check(PYTORCH_TRANSPORT, verdict.ok, verdict.message if verdict.ok else verdict.message.split(":")[0],
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
                      else _not_measured(TRANSPORT, "EFA", inter.why, TRANSPORT_SOURCE, True))
    else:
        checks += [inter_node_all_reduce(inter), transport(inter.text)]
    intra = _nccl_or_check(nccl_dir / "intra_node", INTRA_NODE, NVLINK_SOURCE)
    checks.insert(1, intra if isinstance(intra, Check) else intra_node_all_reduce(intra))
    control = nccl_dir / "tcp_control"
    text = _raw_text(control)
    checks.append(tcp_control(text) if text else _not_measured(
        TCP_CONTROL, "refused", f"no *_perf.log in {control}: jobs/acceptance.sh runs all_reduce_perf on 2 nodes "
        "with NCCL_NET=Socket into that folder", TCP_CONTROL_SOURCE, True))
    checks.append(pytorch_transport(nccl_dir / "pytorch"))
    return checks


def _nccl_or_check(folder: Path, name: str, source: str) -> NcclRun | Check:
    """The parsed run, or the check's verdict when there is nothing to compare."""
    try:
        return load_nccl_run(folder)
    except OSError:
        return _not_measured(name, "", f"no *_perf.log in {folder}: the nccl-tests step did not run "
                             "(see the acceptance job's output)", source, True)
    except nccl_tests.ParseError as exc:  # the benchmark started but did not finish: the check failed
        return _check(name, False, "", "", f"unfinished run: {exc}", source, needs_gpu=True)


def _raw_text(folder: Path, pattern: str = "*_perf.log") -> str:
    """The logs as text, for the transport check, which needs no finished run."""
    return "\n".join(p.read_text(errors="replace") for p in sorted(folder.glob(pattern)))


# --- storage: the FSx summary --------------------------------------------------------------------

STORAGE_SOURCE = ("provisioned = capacity x MB/s per TiB (cluster_config storage.<fs>.throughput_mb_s, "
                  "FSX_EXPECTED_MB_S); limit: jobs/cluster_checks/fsx_report.py min ratio")


def storage_checks(summary: Optional[Mapping], mounts: Sequence[str] = ()) -> list[Check]:
    """One check per mount from fsx_perf's summary.json (None: the storage step wrote none).

    ``mounts``: the mounts the run must cover (expected.json); default those in the summary."""
    results = [fsx_report.MountResult(**_known(fsx_report.MountResult, m)) for m in (summary or {}).get("mounts", [])]
    by_mount = {r.mount: r for r in results}
    min_ratio = float((summary or {}).get("min_ratio", fsx_report.DEFAULT_MIN_RATIO))
    wanted = list(dict.fromkeys([m.rstrip("/") or "/" for m in mounts] or list(by_mount)))
    if not wanted:
        return [_not_measured("storage: FSx throughput", f">= {min_ratio:.0%} of provisioned",
                              "no storage/summary.json and no mounts in expected.json: jobs/acceptance.sh runs "
                              "python -m cluster_checks.fsx_perf --out DIR/storage", STORAGE_SOURCE)]
    return [_mount_check(by_mount.get(m), m, min_ratio) for m in wanted]


def _mount_check(r: Optional[fsx_report.MountResult], mount: str, min_ratio: float) -> Check:
    name = f"storage: {mount} read/write vs provisioned"
    if r is None:
        return _not_measured(name, f">= {min_ratio:.0%} of provisioned", f"{mount} is not in storage/summary.json: "
                             "add it to FSX_PERF_MOUNTS", STORAGE_SOURCE)
    if r.provisioned_mb_s:
        expected = f">= {min_ratio:.0%} of provisioned {r.provisioned_mb_s / 1000:.3f} GB/s (read and write)"
    else:
        expected = f">= {min_ratio:.0%} of provisioned"
    measured = "" if r.write_mb_s is None and r.read_mb_s is None else (
        f"write {_gb(r.write_mb_s)} GB/s, read {_gb(r.read_mb_s)} GB/s ({r.tool})")
    notes = "; ".join(r.notes)
    if r.status == fsx_report.NOT_COMPARED:
        return Check(name, NOT_MEASURED, measured, expected,
                     "no provisioned throughput to compare with: export FSX_EXPECTED_MB_S=$(python -m cluster_config "
                     "fsx-expected --env ENV) before submitting (docs/storage_validation.md)", STORAGE_SOURCE)
    ratios = [x for x in (r.write_ratio, r.read_ratio) if x is not None]
    why = {fsx_report.BELOW: notes, fsx_report.FAILED: f"the measurement failed: {notes}",
           fsx_report.MISSING: f"{mount} is not mounted on the nodes: check the cluster's SharedStorage and "
                               "'mount -t lustre' on a compute node"}.get(r.status, notes)
    return _check(name, r.status == fsx_report.OK, measured, expected, why or r.status, STORAGE_SOURCE,
                  ratio=min(ratios) if ratios else None, limit=min_ratio)


def _gb(mb_s: Optional[float]) -> str:
    return "-" if mb_s is None else f"{mb_s / 1000:.3f}"


# --- nodes: the health check and what the job records beside it ----------------------------------

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
        return _not_measured(QUEUES, "", "expected.json names no queues: jobs/acceptance.sh lists every queue "
                             "with the nodes it asks of it", "cluster_config (the cluster's queues)")
    seen = {q: sum(1 for r in records if r.queue == q and r.health_rc is not None) for q in queues}
    short = [f"{q} ({seen[q]} of {n})" for q, n in queues.items() if seen[q] < n]
    return _check(QUEUES, not short, ", ".join(f"{q} {seen[q]}" for q in queues), expected,
                  f"nodes that never ran their step: {', '.join(short)}; first look at 'sinfo -R' and the head "
                  "node's /var/log/parallelcluster/slurm_resume.log and clustermgtd (capacity, AMI, bootstrap errors)",
                  "cluster_config (the cluster's queues)")


def venv_runs(records: Sequence[NodeRecord]) -> Check:
    types = sorted({r.queue for r in records})
    broken = [r for r in records if r.venv_ok is False]
    unknown = [r.node for r in records if r.venv_ok is None]
    source = "jobs/env.sh (JOBS_VENV on the shared /opt/llm-jobs)"
    if not records or unknown:
        return _not_measured(VENV, "imports torch and the jobs packages on every node",
                             f"not recorded for {', '.join(unknown) or 'any node'}", source)
    return _check(VENV, not broken, f"{len(records) - len(broken)} of {len(records)} nodes ({', '.join(types)})",
                  "imports torch and the jobs packages on every node",
                  "; ".join(f"{r.node} ({r.queue}): {r.venv_detail or 'failed'}" for r in broken)
                  + ": first run $JOBS_VENV/bin/python -c 'import torch' on that node; rebuild the venv for the "
                  "node type's OS and architecture if it differs from the head node's", source)


def node_health(records: Sequence[NodeRecord]) -> Check:
    """node_health.sh on every node: exit 0 and 'healthy', or its last line names what is wrong."""
    missing = [r.node for r in records if r.health_rc is None]
    if not records or missing:
        return _not_measured(HEALTH, "'healthy' on every node",
                             f"no health result from {', '.join(missing) or 'any node'}", HEALTH_SOURCE)
    sick = [r for r in records if r.health_rc != 0]
    return _check(HEALTH, not sick, f"{len(records) - len(sick)} of {len(records)} healthy", "'healthy' on every node",
                  "; ".join(f"{r.node}: {_last_line(r.health_output) or f'exit {r.health_rc}'}" for r in sick)
                  + ": the prolog drains such a node with this reason; replace it (terminate the instance, "
                  "ParallelCluster starts a new one) and rerun", HEALTH_SOURCE)


def driver_supports_torch(gpu_nodes: Sequence[NodeRecord]) -> Check:
    expected = "driver CUDA >= torch CUDA on every GPU node"
    if not gpu_nodes:
        return _not_measured(DRIVER, expected, "no GPU node recorded", DRIVER_SOURCE, True)
    unknown = [r.node for r in gpu_nodes if not (r.driver_cuda and r.torch_cuda)]
    if unknown:
        return _not_measured(DRIVER, expected, f"versions not recorded on {', '.join(unknown)}", DRIVER_SOURCE, True)
    old = [r for r in gpu_nodes if _version(r.driver_cuda) < _version(r.torch_cuda)]
    pairs = sorted({f"driver {r.driver_cuda} / torch {r.torch_cuda}" for r in gpu_nodes})
    return _check(DRIVER, not old, ", ".join(pairs), expected,
                  f"{', '.join(r.node for r in old)}: the driver is older than torch's CUDA build: use the AMI whose "
                  "driver supports it (node_scripts/ami/), or a torch wheel built for the driver's CUDA",
                  DRIVER_SOURCE, needs_gpu=True)


def ecc_clean(gpu_nodes: Sequence[NodeRecord]) -> Check:
    expected = "0 uncorrectable ECC errors, no pending or failed row remap"
    if not gpu_nodes:
        return _not_measured(ECC, expected, "no GPU node recorded", ECC_SOURCE, True)
    unknown = [r.node for r in gpu_nodes if r.ecc_uncorrected is None]
    if unknown:
        return _not_measured(ECC, expected, f"ECC counters not recorded on {', '.join(unknown)}", ECC_SOURCE, True)
    bad = [r for r in gpu_nodes if r.ecc_uncorrected or r.row_remap_pending or r.row_remap_failed]
    total = sum(r.ecc_uncorrected or 0 for r in gpu_nodes)
    return _check(ECC, not bad, f"{total} uncorrectable on {len(gpu_nodes)} GPU node(s)", expected,
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


# --- each production layout, shrunk: checks from plain numbers -----------------------------------
# A function per check; ``layout_checks`` maps DIR/layouts/<name>.json onto them. ``None`` is "not recorded".

INIT_SOURCE = ("jobs/training/models/llama.py init_weights: matrices ~ N(0, 0.02), residual outputs 0.02 / sqrt(2 x layers), "
               "each drawn from its own (seed, name) generator")
DISTINCT_SOURCE = "tests/training/test_init_weights.py: no two parameters nor two shards are equal"
LOSS_SOURCE = "training from random init: cross-entropy starts near ln(vocab) and falls within tens of steps"
GRAD_SOURCE = "jobs/training/train.py clips by the global grad norm (optim.grad_clip): a non-finite norm is a lost step"
MEMORY_SOURCE = ("jobs/training/dry_run.py prediction at the same layout and world size: at most 10 % above it "
                 "(acceptance criterion), at most 25 % below (compiled layers keep less than the eager dry run)")
MFU_SOURCE = ("MFU as jobs/training/components/metrics.py computes it (tokens/s per GPU x FLOPs/token / dense bf16 peak, "
              "989 TFLOP/s for H100/H200); expected: cluster_config/plan.py estimate_mfu")
COMPILE_SOURCE = "train.compile (torch.compile per decoder layer) must not change the numerics beyond bf16 rounding"
RECOVERY_SOURCE = ("jobs/training/checkpoints/checkpointer.py + recovery.py: a killed rank requeues and resumes exactly "
                   "(tests/training/test_resume.py on CPU)")
STALL_SOURCE = ("jobs/training/config.py train.timeout_s (collective timeout after the first step), "
                "jobs/training/resilience/watchdog.py")


def _finite(values: Sequence[float]) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def init_std(layout: str, stds: Optional[Mapping[str, Sequence[float]]]) -> Check:
    """``stds``: parameter (or shard) name -> (measured std, intended std)."""
    name = f"layout {layout}: init std per parameter"
    expected = f"|std / intended - 1| <= {INIT_STD_TOLERANCE:.0%} for every matrix"
    if not stds:
        return _not_measured(name, expected, "init statistics not recorded", INIT_SOURCE)
    deviation = {p: abs(m / i - 1) if i else math.inf for p, (m, i) in stds.items()}
    worst = max(deviation, key=deviation.get)
    measured_std, intended = stds[worst]
    bad = sorted(p for p, d in deviation.items() if not d <= INIT_STD_TOLERANCE)
    return _check(name, not bad, f"worst {worst}: {measured_std:.5g} vs {intended:.5g} ({deviation[worst]:.1%} off)",
                  expected, f"{len(bad)} parameter(s) off, e.g. {', '.join(bad[:3])}: a wrong sigma or a shard drawn "
                  "from the wrong generator; first compare with tests/training/test_init_weights.py at this layout",
                  INIT_SOURCE, ratio=(1 + deviation[worst]) if math.isfinite(deviation[worst]) else None,
                  limit=1 + INIT_STD_TOLERANCE)


def init_distinct(layout: str, duplicate_hashes: Optional[int]) -> Check:
    """``duplicate_hashes``: parameters or shards whose content hash equals another's (0 expected)."""
    name = f"layout {layout}: no two parameters/shards equal"
    if duplicate_hashes is None:
        return _not_measured(name, "0 duplicate hashes", "parameter hashes not recorded", DISTINCT_SOURCE)
    return _check(name, duplicate_hashes == 0, f"{duplicate_hashes} duplicate hash(es)", "0 duplicate hashes",
                  f"{duplicate_hashes} parameters/shards are identical: ranks drew them from the same generator "
                  "state; the model trains with fewer distinct weights than it has. First run "
                  "tests/training/test_init_weights.py with this layout", DISTINCT_SOURCE)


def loss_decreases(layout: str, losses: Optional[Sequence[float]]) -> Check:
    name = f"layout {layout}: loss finite and decreasing"
    expected = "every loss finite; mean of the last quarter < mean of the first"
    if not losses or len(losses) < 2:
        return _not_measured(name, expected, "fewer than 2 losses recorded", LOSS_SOURCE)
    if not _finite(losses):
        return _check(name, False, f"non-finite loss in {len(losses)} steps", expected,
                      "NaN/inf loss: first rerun with optim.lr halved and look for a bf16 overflow in the layer "
                      "named by the first non-finite grad norm", LOSS_SOURCE)
    quarter = max(1, len(losses) // 4)
    first, last = sum(losses[:quarter]) / quarter, sum(losses[-quarter:]) / quarter
    return _check(name, last < first, f"{first:.3f} -> {last:.3f} over {len(losses)} steps", expected,
                  "the loss does not fall: the gradients do not reach the weights or are wrong at this layout "
                  "(sharding, tensor parallel); first compare with the same steps at FSDP only", LOSS_SOURCE,
                  ratio=last / first if first else None, limit=1.0)


def grad_norm_finite(layout: str, grad_norms: Optional[Sequence[float]]) -> Check:
    name = f"layout {layout}: grad norm finite"
    if not grad_norms:
        return _not_measured(name, "finite and > 0 every step", "grad norms not recorded", GRAD_SOURCE)
    ok = _finite(grad_norms) and all(g > 0 for g in grad_norms)
    shown = [g for g in grad_norms if isinstance(g, (int, float))]
    return _check(name, ok, f"{len(grad_norms)} steps, max {max(shown):.3g}" if shown else "none numeric",
                  "finite and > 0 every step",
                  "a NaN/inf or zero grad norm: a zero means no gradient reached the weights (a detached layer, a "
                  "frozen shard); NaN/inf: see the loss check's first action", GRAD_SOURCE)


def peak_memory(layout: str, peak_gib: Optional[float], predicted_gib: Optional[float], oom: bool = False) -> Check:
    """Peak GPU memory vs the dry run. Compare like with like: torch.cuda.max_memory_allocated (what
    training/components/metrics.py logs) against the dry run's peak less its ``runtime`` category (CUDA context
    and NCCL buffers, outside torch's allocator)."""
    name = f"layout {layout}: peak GPU memory vs dry run"
    band = f"-{MEMORY_CONSERVATIVE:.0%} to +{MEMORY_TOLERANCE:.0%}"
    expected = (f"{band} of {predicted_gib:.1f} GiB predicted" if predicted_gib else f"{band} of the dry run")
    if oom:
        return _check(name, False, "out of memory", expected,
                      "the run ran out of GPU memory: the dry run under-predicts this layout; first compare "
                      "torch.cuda.memory_summary() at the failure with the dry run's categories, then lower "
                      "train.micro_batch_size or recompute more layers (train.activation_checkpointing_every)",
                      MEMORY_SOURCE, needs_gpu=True)
    if peak_gib is None or not predicted_gib:
        return _not_measured(name, expected, "peak memory or the dry run's prediction not recorded", MEMORY_SOURCE,
                             True)
    ratio = peak_gib / predicted_gib
    effect = ("production layouts sized from it may not fit" if ratio > 1 else
              "the plan leaves memory unused that larger micro-batches or less recomputation could take")
    return _check(name, 1 - MEMORY_CONSERVATIVE <= ratio <= 1 + MEMORY_TOLERANCE, f"{peak_gib:.1f} GiB ({ratio - 1:+.0%})",
                  expected, f"the dry run is {abs(ratio - 1):.0%} {'under' if ratio > 1 else 'over'}: {effect}; first "
                  "find the category that differs (torch.cuda.memory_snapshot vs the dry run's categories) and fix "
                  "the model in training/dry_run.py", MEMORY_SOURCE, needs_gpu=True, ratio=ratio,
                  limit=1 + MEMORY_TOLERANCE)


def mfu(layout: str, tokens_per_s_per_gpu: Optional[float], flops_per_token: Optional[float],
        peak_flops: Optional[float], expected_mfu: Optional[float]) -> Check:
    name = f"layout {layout}: MFU vs plan"
    expected = (f">= {MFU_MIN_RATIO:.0%} of the plan's {expected_mfu:.0%}" if expected_mfu
                else f">= {MFU_MIN_RATIO:.0%} of the plan's estimate")
    if not (tokens_per_s_per_gpu and flops_per_token and peak_flops and expected_mfu):
        return _not_measured(name, expected, "tokens/s, FLOPs/token, peak FLOP/s or the plan's MFU not recorded",
                             MFU_SOURCE, True)
    measured = tokens_per_s_per_gpu * flops_per_token / peak_flops
    ratio = measured / expected_mfu
    return _check(name, ratio >= MFU_MIN_RATIO, f"{measured:.1%} ({tokens_per_s_per_gpu:,.0f} tokens/s per GPU)",
                  expected, f"{ratio:.0%} of the plan: the plan's training days are optimistic by that much; first "
                  "look at data_wait_pct in metrics.jsonl (input-bound: jobs/input_diagnosis.sh), then at the step "
                  "time with and without compile", MFU_SOURCE, needs_gpu=True, ratio=ratio, limit=MFU_MIN_RATIO)


def compile_matches_eager(layout: str, compiled: Optional[Sequence[float]], eager: Optional[Sequence[float]]) -> Check:
    """Losses of the same steps with train.compile on and off."""
    name = f"layout {layout}: compiled vs eager losses"
    expected = f"every step within {COMPILE_RTOL:.0%} relative"
    if not compiled or not eager or len(compiled) != len(eager):
        return _not_measured(name, expected, "the compiled and eager runs' losses (same steps) not recorded",
                             COMPILE_SOURCE, True)
    diffs = [abs(c - e) / abs(e) if e else math.inf for c, e in zip(compiled, eager)]
    worst = max(diffs) if _finite(compiled) and _finite(eager) else math.inf
    return _check(name, worst <= COMPILE_RTOL, f"max {worst:.2%} over {len(diffs)} steps", expected,
                  "compiled layers compute something else than eager ones: train with train.compile=false until "
                  "fixed, and bisect by compiling one layer type at a time", COMPILE_SOURCE, needs_gpu=True,
                  ratio=worst / COMPILE_RTOL if math.isfinite(worst) else None, limit=1.0)


def recovery(scope: str, recovered: Optional[bool], reference: Optional[Mapping[int, float]],
             resumed: Optional[Mapping[int, float]], reference_samples: Optional[Mapping[int, int]] = None,
             resumed_samples: Optional[Mapping[int, int]] = None) -> Check:
    """A rank killed after a checkpoint: the job must resume on its own (``recovered``), and the steps after
    the resume must equal the uninterrupted run's bit for bit: their losses (step -> loss) and the data
    they read (step -> samples_crc, where recorded; the drill logs every step)."""
    name = f"{scope}: killed rank recovers, losses bit-identical"
    expected = "resumed automatically; losses and data (samples_crc) after the resume == uninterrupted run"
    if recovered is None:
        return _not_measured(name, expected, "no drill/drill.json: the drill did not run (ACCEPTANCE_PARTS, or the "
                             "job ended before it)", RECOVERY_SOURCE)
    if not reference or not resumed:
        failed = ([] if reference else ["the uninterrupted run (drill/reference) logged no loss"]) + (
            [] if resumed else ["the killed run (drill/recovered) logged no loss after a resume"])
        return _not_measured(name, expected, f"{' and '.join(failed)}: first read the drill runs' 'problem:' and "
                             "Traceback lines in the job's output (a config error makes every run exit 2 at start-up)",
                             RECOVERY_SOURCE)
    reference = {int(s): v for s, v in reference.items()}
    resumed = {int(s): v for s, v in resumed.items()}
    common = sorted(set(reference) & set(resumed))
    reference_data = {int(s): v for s, v in (reference_samples or {}).items()}
    resumed_data = {int(s): v for s, v in (resumed_samples or {}).items()}
    other_data = [s for s in common
                  if s in reference_data and s in resumed_data and reference_data[s] != resumed_data[s]]
    differ = sorted({s for s in common if reference[s] != resumed[s]} | set(other_data))
    if not recovered:
        why = ("the job did not resume on its own: first read its failure file and jobs/train.sh's requeue decision "
               "(training/resilience/recovery.py) in the job's log")
    elif not common:
        why = "the resumed run logged none of the reference run's steps: compare the steps each logged"
    elif other_data:
        why = (f"{len(differ)} of {len(common)} steps differ (first: step {differ[0]}); the data differs from step "
               f"{other_data[0]} (samples_crc): the resume did not restore the loader's position")
    else:
        data = ("on the same data (samples_crc equal)" if all(s in reference_data and s in resumed_data for s in differ)
                else "(samples_crc not recorded)")
        why = (f"{len(differ)} of {len(common)} steps differ (first: step {differ[0] if differ else '-'}) {data}: the "
               "resume does not restore all state (model, optimizer, RNG); on GPU, check that both runs' config line "
               "has train.deterministic true")
    ok = bool(recovered and common and not differ)
    return _check(name, ok, f"{'resumed' if recovered else 'NOT resumed'}, {len(common) - len(differ)} of "
                  f"{len(common)} steps identical", expected, why, RECOVERY_SOURCE)


def stall_detected(scope: str, detected_s: Optional[float], timeout_s: Optional[float],
                   rank_stopped: bool = True) -> Check:
    """Seconds from stopping one rank (SIGSTOP) to the job noticing (a collective timeout or the watchdog);
    ``detected_s`` None with ``timeout_s`` set: it was never noticed. ``rank_stopped`` False: the run never
    reached the step where a rank is stopped, so there was nothing to detect."""
    name = f"{scope}: stalled rank detected"
    expected = (f"<= {timeout_s + STALL_GRACE_S:.0f} s (timeout {timeout_s:.0f} s + {STALL_GRACE_S:.0f} s)"
                if timeout_s else "within the collective timeout")
    if not timeout_s:
        return _not_measured(name, expected, "stall test not recorded", STALL_SOURCE)
    if not rank_stopped:
        return _not_measured(name, expected, "no rank was stopped: the stalled run (drill/stalled) failed before its "
                             "step 2; first read its 'problem:' and Traceback lines in the job's output", STALL_SOURCE)
    if detected_s is None:
        return _check(name, False, "never detected", expected,
                      "a stopped rank left the job hanging: neither the collective timeout nor the progress watchdog "
                      "ended it; first run tests/training/test_collective_timeout.py (every process group must get "
                      "train.timeout_s) and tests/training/test_watchdog.py", STALL_SOURCE)
    limit = timeout_s + STALL_GRACE_S
    return _check(name, detected_s <= limit, f"{detected_s:.0f} s", expected,
                  "noticed later than the collective timeout: the collective that waited did not time out (a group "
                  "with the default 30 min timeout) and the watchdog's longer window ended it; first read the "
                  "hang_*.txt the watchdog wrote: its stacks name the collective", STALL_SOURCE,
                  ratio=detected_s / timeout_s, limit=limit / timeout_s)


def layout_run(layout: str, record: Mapping) -> Check:
    name = f"layout {layout}: run completes"
    error = "out of memory" if record.get("oom") else record.get("error") or ""
    return _check(name, not error, "completed" if not error else "failed", "no error", error +
                  ": first read the layout run's log (the 'problem:' and Traceback lines)", "jobs/acceptance.sh")


def layout_checks(layout: str, record: Optional[Mapping], gpu: bool = True) -> list[Check]:
    """The checks of one shrunk layout from DIR/layouts/<layout>.json (None: the run wrote nothing). Keys:

    error (str), oom (bool), init_std ({param: [std, intended]}), duplicate_hashes (int), losses, grad_norms
    ([float]), peak_memory_gib, predicted_memory_gib, tokens_per_s_per_gpu, flops_per_token, peak_flops,
    expected_mfu (float), compiled_losses, eager_losses ([float], same steps), recovered (bool),
    reference_losses, resumed_losses ({step: loss}), stall_detected_s, collective_timeout_s (float)."""
    if record is None:
        record = {"error": f"no layouts/{layout}.json: the layout's run did not start or wrote nothing"}
    r = record
    checks = [layout_run(layout, r), init_std(layout, r.get("init_std")),
              init_distinct(layout, r.get("duplicate_hashes")), loss_decreases(layout, r.get("losses")),
              grad_norm_finite(layout, r.get("grad_norms"))]
    if gpu:
        checks += [peak_memory(layout, r.get("peak_memory_gib"), r.get("predicted_memory_gib"), bool(r.get("oom"))),
                   mfu(layout, r.get("tokens_per_s_per_gpu"), r.get("flops_per_token"), r.get("peak_flops"),
                       r.get("expected_mfu")),
                   compile_matches_eager(layout, r.get("compiled_losses"), r.get("eager_losses"))]
    else:
        checks += [Check.no_gpu(f"layout {layout}: peak GPU memory vs dry run",
                                f"-{MEMORY_CONSERVATIVE:.0%} to +{MEMORY_TOLERANCE:.0%}",
                                MEMORY_SOURCE),
                   Check.no_gpu(f"layout {layout}: MFU vs plan", f">= {MFU_MIN_RATIO:.0%} of the plan", MFU_SOURCE),
                   Check.no_gpu(f"layout {layout}: compiled vs eager losses", f"within {COMPILE_RTOL:.0%}",
                                COMPILE_SOURCE)]
    # A run that failed explains every number it did not record ("no GPU" stays as it is).
    if r.get("error") or r.get("oom"):
        cause = "out of memory" if r.get("oom") else r["error"]
        checks = [replace(c, why=f"{c.why} (the run failed: {cause})")
                  if c.status == NOT_MEASURED and (gpu or not c.needs_gpu) else c for c in checks]
    return checks


# --- assembling DIR ------------------------------------------------------------------------------

class BadInput(ValueError):
    pass


def _known(cls, data: Mapping) -> dict:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _read_json(path: Path) -> Optional[dict]:
    """The file's JSON object; None if absent. A file that is there but unreadable raises BadInput."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path} is not valid JSON ({exc}) — the step that wrote it was cut off; rerun it") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path} holds {type(data).__name__}, not a JSON object — rerun the step that wrote it")
    return data


DRILL = "drill"


def drill_checks(record: Optional[Mapping], scope: str = DRILL) -> list[Check]:
    """Recovery and stall detection from DIR/drill/drill.json (``drill_record``); None: the drill did not run."""
    r = record or {}
    return [recovery(scope, r.get("recovered"), r.get("reference_losses"), r.get("resumed_losses"),
                     r.get("reference_samples"), r.get("resumed_samples")),
            stall_detected(scope, r.get("stall_detected_s"), r.get("collective_timeout_s"),
                           r.get("rank_stopped", True))]


def _losses(metrics: Path) -> tuple[dict[int, float], dict[int, int], list[dict]]:
    """(step -> the last loss logged for it, step -> its samples_crc, the event lines) of a run's metrics.jsonl."""
    losses, samples, events = {}, {}, []
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a line cut by the kill
                continue
            if "loss" in record and "step" in record:
                losses[int(record["step"])] = record["loss"]
                if "samples_crc" in record:
                    samples[int(record["step"])] = record["samples_crc"]
            elif "event" in record:
                events.append(record)
    return losses, samples, events


def drill_record(drill_dir: Path, stall_detected_s: Optional[float], timeout_s: float,
                 rank_stopped: bool = True) -> dict:
    """What jobs/acceptance.sh's drill did: runs ``reference`` (uninterrupted), ``recovered`` (killed after a
    checkpoint, then started again) and ``stalled`` under DIR/<run>/logs/metrics.jsonl; ``rank_stopped``:
    the stalled run reached the step where one of its ranks is stopped."""
    reference, reference_samples, _ = _losses(drill_dir / "reference" / "logs" / "metrics.jsonl")
    recovered, recovered_samples, events = _losses(drill_dir / "recovered" / "logs" / "metrics.jsonl")
    resumes = [e for e in events if e.get("event") == "start" and e.get("resumed")]
    finished = any(e.get("event") == "complete" for e in events)
    resumed_from = int(resumes[-1]["step"]) if resumes else None
    after = [s for s in recovered if resumed_from is not None and s > resumed_from]
    return {"recovered": bool(resumes and finished), "resumed_from_step": resumed_from,
            "reference_losses": reference, "resumed_losses": {s: recovered[s] for s in after},
            "reference_samples": reference_samples,
            "resumed_samples": {s: recovered_samples[s] for s in after if s in recovered_samples},
            "rank_stopped": rank_stopped, "stall_detected_s": stall_detected_s, "collective_timeout_s": timeout_s}


# The drill's batch, from its allocation: 4 sequences per rank per micro-batch, 2 micro-batches per step
# (the resumed steps accumulate, as production steps do). A fixed global batch fits one allocation only
# (32 cannot start on 2 x 8 GPUs: 16 ranks x 4 > 32).
DRILL_MICRO_BATCH, DRILL_ACCUMULATION = 4, 2


def drill_overrides(ranks: int) -> list[str]:
    """The drill's training overrides that depend on its allocation (``ranks`` = nodes x workers per node,
    each a data-parallel rank under FSDP) and on its recovery criterion: deterministic kernels, so that a
    resumed run repeats the uninterrupted one's losses bit for bit on GPUs too (docs/acceptance.md)."""
    if ranks < 1:
        raise BadInput(f"--ranks {ranks}: the drill needs at least one rank — pass nodes x workers per node")
    return ["train.parallelism=fsdp", f"train.micro_batch_size={DRILL_MICRO_BATCH}",
            f"train.global_batch_size={DRILL_MICRO_BATCH * DRILL_ACCUMULATION * ranks}", "train.deterministic=true"]


def training_workers(node: str, module: str = "training.train") -> list[int]:
    """PIDs of the training workers (``python -u -m <module>``, not torchrun or srun) of a Slurm job on
    ``node``: by their command line and the node Slurm started them on (SLURMD_NODENAME), so that
    nodes sharing one process table (the local cluster) are told apart too."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        words = [a.decode(errors="replace") for a in argv]
        worker = Path(words[0]).name.startswith("python") and module in words[1:4] and "-m" in words[1:4]
        if worker and f"SLURMD_NODENAME={node}".encode() in environ and int(proc.name) != os.getpid():
            pids.append(int(proc.name))
    return pids


def assemble(results_dir: Path) -> Report:
    """The whole report from a results folder (the layout is in this module's docstring)."""
    if not results_dir.is_dir():
        raise BadInput(f"{results_dir} is not a folder — pass the acceptance job's results folder "
                       "(/fsx/logs/acceptance/<job id>)")
    manifest = _read_json(results_dir / "expected.json")
    if manifest is None or not isinstance(manifest.get("gpu"), bool):
        raise BadInput(f"no expected.json with \"gpu\": true|false in {results_dir} — jobs/acceptance.sh writes it "
                       "first; without it nothing says what the run had to cover")
    gpu = manifest["gpu"]
    records = [NodeRecord(**_known(NodeRecord, {"node": p.stem, **(_read_json(p) or {})}))
               for p in sorted((results_dir / "nodes").glob("*.json"))]
    checks = node_checks(records, manifest.get("queues") or {}, gpu)
    checks += network_checks(results_dir / "nccl", gpu)
    checks += storage_checks(_read_json(results_dir / "storage" / "summary.json"), manifest.get("mounts") or ())
    layouts = manifest.get("layouts") or []
    if not layouts:
        checks.append(_not_measured("layouts: production layouts, shrunk", "every layout of the plan",
                                    "expected.json names no layouts", "cluster_config/plan.py"))
    for layout in layouts:
        checks += layout_checks(layout, _read_json(results_dir / "layouts" / f"{layout}.json"), gpu)
    checks += drill_checks(_read_json(results_dir / "drill" / "drill.json"))
    context = {k: manifest[k] for k in ("job",) if k in manifest}
    return Report(gpu, checks, {**context, "results_dir": str(results_dir)})


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cluster_checks.acceptance", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="write report.json, report.txt and report.png; exit 0 go, 1 no-go")
    rep.add_argument("results_dir", type=Path, help="the acceptance job's results folder")
    rep.add_argument("--out", type=Path, help="where to write the report (default: results_dir)")
    drill = sub.add_parser("drill", help="write drill.json from the recovery and stall runs of jobs/acceptance.sh")
    drill.add_argument("drill_dir", type=Path, help="the results folder's drill/ (runs reference, recovered, stalled)")
    stall = drill.add_mutually_exclusive_group()
    stall.add_argument("--stall-detected-s", type=float, help="seconds from stopping a rank to the run ending "
                       "(omit: it never ended on its own)")
    stall.add_argument("--no-rank-stopped", action="store_true", help="the stalled run never reached the step "
                       "where a rank is stopped: the stall check says not measured")
    drill.add_argument("--timeout-s", type=float, required=True, help="the drill's collective timeout (train.timeout_s)")
    overrides = sub.add_parser("drill-args", help="print the drill's training overrides for its allocation")
    overrides.add_argument("--ranks", type=int, required=True, help="training ranks: nodes x workers per node")
    sig = sub.add_parser("signal", help="signal the training workers on a node (the drill's fault)")
    sig.add_argument("--node", required=True, help="the node whose workers to signal")
    sig.add_argument("--signal", required=True, choices=["KILL", "STOP", "CONT"])
    args = parser.parse_args(argv)
    if args.command == "signal":
        pids = training_workers(args.node)
        for pid in pids:
            os.kill(pid, getattr(signal, f"SIG{args.signal}"))
        print(f"SIG{args.signal} to {len(pids)} training worker(s) on {args.node}: {' '.join(map(str, pids))}")
        return 0 if pids else 1
    if args.command == "drill-args":
        try:
            print(" ".join(drill_overrides(args.ranks)))
        except BadInput as exc:
            return fail(exc)
        return 0
    if args.command == "drill":
        record = drill_record(args.drill_dir, args.stall_detected_s, args.timeout_s, not args.no_rank_stopped)
        (args.drill_dir / "drill.json").write_text(json.dumps(record, indent=1) + "\n")
        stall = f"stall detected in {args.stall_detected_s} s" if record["rank_stopped"] else "no rank stopped"
        print(f"drill: recovered {record['recovered']} (resumed from step {record['resumed_from_step']}), "
              f"{stall} -> {args.drill_dir / 'drill.json'}")
        return 0
    try:
        report = assemble(args.results_dir)
    except BadInput as exc:
        return fail(exc)
    paths = report.write(args.out or args.results_dir)
    print(report.table(), end="")
    print("report:", ", ".join(str(p) for p in paths.values()))
    for check in report.blocking():
        print(f"problem: {check.name}: {check.status}: {check.why}", file=sys.stderr)
    return 0 if report.verdict == GO else 1


if __name__ == "__main__":
    sys.exit(main())
