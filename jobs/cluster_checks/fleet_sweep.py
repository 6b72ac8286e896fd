"""The fleet sweep's parts (jobs/fleet_sweep.sh): the pairing schedule, one node's checks, and the verdict.

    python -m cluster_checks.fleet_sweep schedule NODE...            rounds of pairs, one round a line ("a,b c,d")
    python -m cluster_checks.fleet_sweep node --out DIR --probe FILE  this node: health check, GPU diagnostics,
                                                                      a storage read -> DIR/<node>.json
    python -m cluster_checks.fleet_sweep report --out DIR [--drain]   the per-node table, report.json, drains

Pairs: the round-robin (circle) schedule, so that in n - 1 rounds (n rounds for an odd n, one node sitting
out each) every node meets every other once, and every node works in every round.
A link is slow when its all_reduce bus bandwidth is below ``--link-ratio`` of the reference: the median,
over nodes, of each node's best link (a bad node drags down only its own best, so half the fleet would
have to be bad to move it). A node is bad when its health check or GPU diagnostics fail, its storage read
fails or is below ``--read-ratio`` of the median read, or every one of its links is slow or failed (its
own network, not one path). A slow link between two otherwise good nodes is named, not drained: one
link cannot say which end is at fault.
Exit status of ``report``: 0 when every node and link is good, 1 otherwise; 2 on bad input.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cli import ArgumentParser, fail

from cluster_checks.node_record import run_health_check

DCGM_TIMEOUT_S = 600  # dcgmi diag -r 1 takes well under a minute on 8 GPUs; a hung one is a failure
READ_CHUNK = 8 << 20


def schedule(nodes: list[str]) -> list[list[tuple[str, str]]]:
    """Round-robin pairings: every pair of ``nodes`` exactly once, each node at most once per round."""
    ring: list[str | None] = list(nodes) + ([None] if len(nodes) % 2 else [])
    rounds = []
    for _ in range(len(ring) - 1):
        half = len(ring) // 2
        pairs = [(ring[i], ring[-1 - i]) for i in range(half)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]  # the first stays, the others turn one place
    return rounds


def round_count(nodes: int) -> int:
    return nodes - 1 if nodes % 2 == 0 else nodes


# --- one node -------------------------------------------------------------------------------------------
@dataclass
class NodeChecks:
    node: str
    health_rc: int
    health_reason: str  # the check's last line
    gpu_diag: str  # "pass", "fail" or "not available" (no dcgmi on this node)
    gpu_diag_detail: str
    read_mb_s: float | None  # the probe file, read from the shared file system with the page cache dropped
    read_error: str = ""


def gpu_diagnostics() -> tuple[str, str]:
    """``dcgmi diag -r 1`` (DCGM's quick run: deployment and software checks) where DCGM is installed.
    The official ParallelCluster AMI has DCGM but leaves its service stopped after boot; ParallelCluster's
    own GPU check starts it and stops it again, and so does this, through sudo when not root."""
    if not shutil.which("dcgmi"):
        return "not available", "no dcgmi on this node: GPU diagnostics skipped"
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    started = False
    if subprocess.run(["dcgmi", "discovery", "-l"], capture_output=True).returncode != 0:
        started = subprocess.run([*sudo, "systemctl", "start", "nvidia-dcgm"], capture_output=True).returncode == 0
    try:
        done = subprocess.run(["dcgmi", "diag", "-r", "1"], capture_output=True, text=True, timeout=DCGM_TIMEOUT_S)
        output = (done.stdout + done.stderr).strip()
        failed = done.returncode != 0 or any("fail" in line.lower() for line in output.splitlines())
        reason = next((line.strip(" |") for line in output.splitlines() if "fail" in line.lower()), output[-200:])
        return ("fail", reason) if failed else ("pass", "dcgmi diag -r 1 passed")
    except subprocess.TimeoutExpired:
        return "fail", f"dcgmi diag -r 1 did not finish within {DCGM_TIMEOUT_S}s"
    finally:
        if started:
            subprocess.run([*sudo, "systemctl", "stop", "nvidia-dcgm"], capture_output=True)


def storage_read(probe: Path) -> tuple[float | None, str]:
    """MB/s reading ``probe`` once, after asking the kernel to drop its cached pages (the node that wrote it)."""
    try:
        fd = os.open(probe, os.O_RDONLY)
    except OSError as exc:
        return None, f"cannot open {probe}: {exc.strerror}"
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        total, start = 0, time.perf_counter()
        while chunk := os.read(fd, READ_CHUNK):
            total += len(chunk)
        seconds = time.perf_counter() - start
    except OSError as exc:
        return None, f"reading {probe}: {exc.strerror}"
    finally:
        os.close(fd)
    if total == 0:
        return None, f"{probe} is empty"
    return total / 1e6 / max(seconds, 1e-9), ""


def check_node(probe: Path) -> NodeChecks:
    rc, output = run_health_check()
    diag, detail = gpu_diagnostics()
    read, error = storage_read(probe)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    lines = output.splitlines()
    return NodeChecks(node, rc, lines[-1] if lines else "", diag, detail, read, error)


# --- the verdict ----------------------------------------------------------------------------------------
@dataclass
class Link:
    a: str
    b: str
    round: int
    busbw_gbps: float | None  # None: the pair's all_reduce failed, timed out or was wrong
    detail: str = ""
    slow: bool = False


@dataclass
class Verdict:
    nodes: dict[str, list[str]]  # node -> reasons it is bad (empty: good)
    links: list[Link]
    slow_links: list[Link]  # slow or failed links between two otherwise good nodes
    reference_gbps: float | None
    read_median_mb_s: float | None
    checks: dict[str, NodeChecks] = field(default_factory=dict)

    @property
    def bad_nodes(self) -> list[str]:
        return [n for n, reasons in self.nodes.items() if reasons]


def load_link(pair_dir: Path, round_index: int) -> Link:
    a, b = pair_dir.name.split("_", 1)
    rc_file, results = pair_dir / "rc", pair_dir / "results.json"
    rc = rc_file.read_text().strip() if rc_file.exists() else "missing"
    if rc != "0" or not results.exists():
        why = "timed out" if rc == "124" else f"exit {rc}"
        return Link(a, b, round_index, None, f"all_reduce failed ({why}, see {pair_dir / 'log'})")
    rows = json.loads(results.read_text())["results"]
    row = max(rows, key=lambda r: r["size_bytes"])
    if not row["correct"]:
        return Link(a, b, round_index, None, "all_reduce gave wrong results")
    return Link(a, b, round_index, row["busbw_gbps"])


def judge(nodes: list[str], checks: dict[str, NodeChecks], links: list[Link], link_ratio: float,
          read_ratio: float, min_busbw_gbps: float = 0.0) -> Verdict:
    reasons: dict[str, list[str]] = {n: [] for n in nodes}
    for node in nodes:
        c = checks.get(node)
        if c is None:
            reasons[node].append("no record: its checks did not run")
            continue
        if c.health_rc != 0:
            reasons[node].append(f"health check: {c.health_reason or f'exit {c.health_rc}'}")
        if c.gpu_diag == "fail":
            reasons[node].append(f"GPU diagnostics: {c.gpu_diag_detail}")
        if c.read_mb_s is None:
            reasons[node].append(f"storage read: {c.read_error}")
    reads = [c.read_mb_s for c in checks.values() if c.read_mb_s is not None]
    read_median = statistics.median(reads) if reads else None
    for node, c in checks.items():
        if node in reasons and c.read_mb_s is not None and read_median and c.read_mb_s < read_ratio * read_median:
            reasons[node].append(f"storage read {c.read_mb_s:.0f} MB/s, below {read_ratio:g} x the median "
                                 f"{read_median:.0f} MB/s")

    best: dict[str, float] = {}
    for link in links:
        for end in (link.a, link.b):
            if link.busbw_gbps is not None:
                best[end] = max(best.get(end, 0.0), link.busbw_gbps)
    reference = statistics.median(best.values()) if best else None
    floor = max(link_ratio * (reference or 0.0), min_busbw_gbps)  # relative, and absolute where given
    for link in links:
        link.slow = link.busbw_gbps is None or link.busbw_gbps < floor
        if link.slow and link.busbw_gbps is not None:
            link.detail = (f"{link.busbw_gbps:.3g} GB/s, below {link_ratio:g} x the reference {reference:.3g} GB/s"
                           if floor > min_busbw_gbps else
                           f"{link.busbw_gbps:.3g} GB/s, below the floor {min_busbw_gbps:g} GB/s")
    for node in nodes:
        own = [link for link in links if node in (link.a, link.b)]
        if own and all(link.slow for link in own):
            worst = min(own, key=lambda link: link.busbw_gbps or 0.0)
            reasons[node].append(f"network: all {len(own)} of its links slow or failed "
                                 f"(worst {worst.a}-{worst.b}: {worst.detail})")
    network_bad = {n for n, rs in reasons.items() if any(r.startswith("network:") for r in rs)}
    slow_links = [link for link in links if link.slow and not {link.a, link.b} & network_bad]
    return Verdict(reasons, links, slow_links, reference, read_median, checks)


def node_table(verdict: Verdict) -> str:
    header = f"{'node':<20}{'health':<9}{'gpu diag':<15}{'read MB/s':>10}{'links ok':>10}{'worst GB/s':>12}  verdict"
    lines = [header, "-" * len(header)]
    for node, reasons in verdict.nodes.items():
        c = verdict.checks.get(node)
        own = [link for link in verdict.links if node in (link.a, link.b)]
        worst = min((link.busbw_gbps for link in own if link.busbw_gbps is not None), default=None)
        health = "-" if c is None else ("ok" if c.health_rc == 0 else "FAIL")
        read = "-" if c is None or c.read_mb_s is None else f"{c.read_mb_s:.0f}"
        lines.append(f"{node:<20}{health:<9}{'-' if c is None else c.gpu_diag:<15}{read:>10}"
                     f"{f'{sum(not link.slow for link in own)}/{len(own)}':>10}"
                     f"{'-' if worst is None else f'{worst:.3g}':>12}  {'BAD: ' + '; '.join(reasons) if reasons else 'ok'}")
    return "\n".join(lines)


def read_rounds(out: Path) -> list[tuple[int, float]]:
    """(round, seconds) of each round the job ran (rounds.tsv: round, seconds, its pairs)."""
    path = out / "rounds.tsv"
    if not path.exists():
        return []
    return [(int(f[0]), float(f[1])) for f in (line.split("\t") for line in path.read_text().splitlines()) if f[0]]


def estimate(nodes: int, node_checks_s: float, round_s: list[float], fleet: int) -> str:
    """The sweep's time for ``fleet`` nodes from this run: the node checks run on every node at once, so
    they cost the same; the rounds grow to round_count(fleet), each as long as this run's median round."""
    median = statistics.median(round_s) if round_s else 0.0
    total = node_checks_s + round_count(fleet) * median
    return (f"this run: {nodes} nodes, {len(round_s)} rounds, node checks {node_checks_s:.0f} s, median round "
            f"{median:.1f} s; for {fleet} nodes: {node_checks_s:.0f} s + {round_count(fleet)} rounds x {median:.1f} s"
            f" = {total / 60:.1f} min")


def drain(nodes: dict[str, list[str]], job: str) -> list[str]:
    """Drain each bad node, as root or through sudo (the cluster's default user has it); return the commands
    that could not run, for the operator."""
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    left = []
    for node, reasons in nodes.items():
        if not reasons:
            continue
        reason = f"fleet sweep {job}: {'; '.join(reasons)}"[:200]
        command = ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]
        done = subprocess.run([*sudo, *command], capture_output=True, text=True)
        if done.returncode != 0:
            left.append(f"scontrol update nodename={node} state=drain reason=\"{reason}\"  "
                        f"# {(done.stderr or done.stdout).strip()}")
        else:
            print(f"drained {node}: {reason}")
    return left


def report(out: Path, link_ratio: float, read_ratio: float, min_busbw_gbps: float, do_drain: bool, fleet: int) -> int:
    nodes_file = out / "nodes.txt"
    if not nodes_file.exists():
        return fail(f"{nodes_file} not found", "point --out at the folder jobs/fleet_sweep.sh wrote")
    nodes = nodes_file.read_text().split()
    checks = {}
    for path in sorted((out / "nodes").glob("*.json")):
        record = NodeChecks(**json.loads(path.read_text()))
        checks[record.node] = record
    rounds = read_rounds(out)
    links = [load_link(pair, r) for r, _ in rounds for pair in sorted((out / "rounds" / str(r)).glob("*_*"))]
    verdict = judge(nodes, checks, links, link_ratio, read_ratio, min_busbw_gbps)
    timing = json.loads((out / "timing.json").read_text()) if (out / "timing.json").exists() else {}
    time_line = estimate(len(nodes), timing.get("node_checks_s", 0.0), [s for _, s in rounds], fleet)

    print(node_table(verdict))
    print(f"links: {len(links)} measured, reference {verdict.reference_gbps or 0:.3g} GB/s (median of each node's "
          f"best), slow below {link_ratio:g} x")
    for link in verdict.slow_links:
        print(f"slow link {link.a}-{link.b} (round {link.round}): {link.detail}")
    print(time_line)
    bad = verdict.bad_nodes
    print(f"fleet sweep: {len(nodes) - len(bad)} of {len(nodes)} nodes good"
          + (f"; bad: {', '.join(bad)}" if bad else "") + (f"; {len(verdict.slow_links)} slow link(s)"
                                                            if verdict.slow_links else ""))
    left = drain(verdict.nodes, os.environ.get("SLURM_JOB_ID", "")) if do_drain else []
    for command in left:
        print(f"could not drain; run as root: {command}", file=sys.stderr)
    (out / "report.json").write_text(json.dumps({
        "nodes": verdict.nodes, "bad_nodes": bad, "reference_gbps": verdict.reference_gbps,
        "read_median_mb_s": verdict.read_median_mb_s, "links": [asdict(link) for link in verdict.links],
        "slow_links": [f"{link.a}-{link.b}" for link in verdict.slow_links], "rounds": rounds,
        "estimate": time_line, "not_drained": left, "checks": {n: asdict(c) for n, c in checks.items()}},
        indent=1) + "\n")
    return 1 if bad or verdict.slow_links else 0


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cluster_checks.fleet_sweep", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("schedule", help="rounds of pairs, one round a line")
    plan.add_argument("nodes", nargs="+")
    one = sub.add_parser("node", help="this node's checks")
    one.add_argument("--out", type=Path, required=True, help="folder for <node>.json")
    one.add_argument("--probe", type=Path, required=True, help="a file on the shared file system to read")
    verdict = sub.add_parser("report", help="the verdict over the sweep's folder")
    verdict.add_argument("--out", type=Path, required=True, help="the sweep's folder")
    verdict.add_argument("--link-ratio", type=float, default=0.75, help="slow below this x the reference")
    verdict.add_argument("--read-ratio", type=float, default=0.5, help="slow below this x the median read")
    verdict.add_argument("--min-busbw-gbps", type=float, default=0.0,
                         help="slow below this too, whatever the others do (0: off); a fleet on TCP is uniformly slow")
    verdict.add_argument("--drain", action="store_true", help="drain the bad nodes")
    verdict.add_argument("--fleet", type=int, default=80, help="nodes to estimate the sweep's time for")
    args = parser.parse_args(argv)

    if args.command == "schedule":
        if len(set(args.nodes)) != len(args.nodes):
            return fail(f"a node named twice in {args.nodes}", "name each node once")
        for pairs in schedule(args.nodes):
            print(" ".join(f"{a},{b}" for a, b in pairs))
        return 0
    if args.command == "node":
        record = check_node(args.probe)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{record.node}.json").write_text(json.dumps(asdict(record), indent=1) + "\n")
        read = f"{record.read_mb_s:.0f} MB/s" if record.read_mb_s is not None else record.read_error
        print(f"{record.node}: health {'ok' if record.health_rc == 0 else record.health_reason}, "
              f"GPU diagnostics {record.gpu_diag}, read {read}")
        return 0
    if not 0 < args.link_ratio <= 1 or not 0 < args.read_ratio <= 1:
        return fail(f"--link-ratio {args.link_ratio} / --read-ratio {args.read_ratio}", "give ratios in (0, 1]")
    return report(args.out, args.link_ratio, args.read_ratio, args.min_busbw_gbps, args.drain, args.fleet)


if __name__ == "__main__":
    sys.exit(main())
