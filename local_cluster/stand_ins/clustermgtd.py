"""Stand-in for ParallelCluster's clustermgtd on a local cluster: it replaces failed static nodes.

    LOCAL_CLUSTER_NAME=sim ... SLURM_CONF=.local_cluster/sim/slurm.conf \\
        python -m local_cluster.stand_ins.clustermgtd --replacement-s 0.6 --log replacements.jsonl

clustermgtd finds, every 60 s, the static nodes that are DOWN or DRAINED (drained and idle: a node still
draining under a job is left until the job ends), sets them down, terminates their instances and launches
replacements, which boot through the custom actions and rejoin the cluster idle. Here, every --interval
seconds (sinfo): a node found DOWN or DRAINED is set DOWN ("replacing"), and --replacement-s later it
boots again through its custom actions (``local_cluster/cluster.sh reboot``: its slurmd and whatever is
left in it stopped, a fresh disk, resumed), without its health-check marker (--markers: the new
instance's hardware is sound). The cluster is the one the environment names (LOCAL_CLUSTER_*,
SLURM_CONF). Reboots run one at a time, with every node due by then. One JSON line per replacement in
--log: node, the state and reason found, when it was found, its boot started and it was back (epoch s).
It stops on SIGTERM, or once the process that started it is gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli import ArgumentParser
from monitoring.slurm import STATE_FLAGS as FLAGS  # sinfo's state suffixes

CLUSTER_SH = Path(__file__).resolve().parents[1] / "cluster.sh"


def failed_nodes() -> dict[str, tuple[str, str]]:
    """node -> (state, reason) of the nodes clustermgtd replaces: DOWN, or DRAINED (not draining)."""
    out = subprocess.run(["sinfo", "-h", "-N", "-p", "gpu", "-o", "%N|%T|%E"], capture_output=True, text=True,
                         timeout=60).stdout
    found = {}
    for line in out.splitlines():
        node, state, reason = line.split("|", 2)
        if state.rstrip(FLAGS) in ("down", "drained"):
            found[node] = (state, reason)
    return found


def replace(nodes: list[str], markers: Path | None) -> tuple[bool, str]:
    for node in nodes:
        if markers:
            (markers / node).unlink(missing_ok=True)
    result = subprocess.run([str(CLUSTER_SH), "reboot", *nodes], capture_output=True, text=True, timeout=600)
    return result.returncode == 0, (result.stdout + result.stderr)[-500:]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m local_cluster.stand_ins.clustermgtd", description=__doc__.splitlines()[0])
    parser.add_argument("--replacement-s", type=float, required=True,
                        help="from finding a failed node to its replacement's boot (wall seconds)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between looks at the nodes")
    parser.add_argument("--markers", type=Path, help="the health check's marker folder (<fsx>/.node-health)")
    parser.add_argument("--log", type=Path, required=True, help="JSON lines, one per replacement")
    args = parser.parse_args(argv)
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    parent = os.getppid()  # whoever started it; it goes when they go
    pending: dict[str, dict] = {}
    with open(args.log, "a") as log:
        while running[0] and os.getppid() == parent:
            now = time.time()
            for node, (state, reason) in failed_nodes().items():
                if node in pending:
                    continue
                pending[node] = {"node": node, "state": state, "reason": reason, "found": now,
                                 "due": now + args.replacement_s}
                subprocess.run(["scontrol", "update", f"nodename={node}", "state=down",
                                f"reason=replacing (clustermgtd stand-in): {reason}"[:200]], capture_output=True)
            due = sorted((n for n, p in pending.items() if p["due"] <= time.time()), key=lambda n: int(n[4:]))
            if due:
                started = time.time()
                ok, output = replace(due, args.markers)
                back = time.time()
                for node in due:
                    record = pending.pop(node)
                    if not ok:  # found again at the next look, and tried again
                        record["error"] = output
                    log.write(json.dumps({**record, "boot": started, "back": back if ok else None}) + "\n")
                log.flush()
            time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
