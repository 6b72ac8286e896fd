"""The simulation's own Slurm cluster: ``local_cluster/cluster.sh`` under a name, beside the default one.

    cluster = SimCluster(nodes=80)
    cluster.up()                      # LOCAL_CLUSTER_NAME=sim ... local_cluster/cluster.sh up
    cluster.slurm("sinfo", "-N")      # always with SLURM_CONF=<its slurm.conf>, never the host's
    cluster.down()

Every Slurm command goes through ``slurm`` (or ``env``), which names this cluster's slurm.conf: the
default cluster's nodes are called node1..node3 too, and a bare ``scontrol`` would reach them.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from monitoring.slurm import STATE_FLAGS as FLAGS  # sinfo's state suffixes (jobs/ is on the path)

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "local_cluster" / "cluster.sh"
USABLE = {"idle", "allocated", "mixed", "completing"}  # sinfo's states of a node in service (no flag)


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list to names: ``node[1-3,7],node9`` -> node1 node2 node3 node7 node9."""
    names: list[str] = []
    for prefix, ranges, single in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", hostlist):
        if single:
            names.append(single)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            names += [f"{prefix}{n:0{width}d}" for n in range(int(low), int(high or low) + 1)]
    return names


@dataclass
class SimCluster:
    """A named local cluster (``LOCAL_CLUSTER_NAME``) of ``nodes`` nodes booting ``env``'s config."""

    nodes: int = 80
    name: str = "sim"
    net: str = "10.199.78"  # the default cluster has 10.199.77
    port_offset: int = 100
    env_name: str = "prod"
    boot_env: dict[str, str] = field(init=False)

    def __post_init__(self):
        self.base = REPO / ".local_cluster" / self.name
        self.fsx = self.base / "fsx"  # what its nodes see as /fsx
        self.jobs_home = self.base / "opt" / "llm-jobs"  # JOBS_HOME: the head node's bundle, venv, accounts
        self.slurm_conf = self.base / "slurm.conf"
        self.boot_env = {"LOCAL_CLUSTER_NAME": self.name, "LOCAL_CLUSTER_NODES": str(self.nodes),
                         "LOCAL_CLUSTER_NET": self.net, "LOCAL_CLUSTER_PORT_OFFSET": str(self.port_offset),
                         "LOCAL_CLUSTER_ENV": self.env_name}

    @property
    def env(self) -> dict[str, str]:
        """The environment for anything that talks to this cluster (Slurm commands, cluster.sh)."""
        return {**os.environ, **self.boot_env, "SLURM_CONF": str(self.slurm_conf),
                # the node health check's settings (ParallelCluster's /opt/slurm/etc/llm/health.conf): a relaunch's
                # probe runs it, so a node whose GPU failed is left out, as the epilog would drain it
                "HEALTH_CONF": str(self.base / "opt" / "slurm" / "etc" / "llm" / "health.conf")}

    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    def netns(self, node: str) -> str:
        """The node's network namespace, as cluster.sh names it (netns_of)."""
        return f"lc{self.name}-{node}"

    # --- cluster.sh -------------------------------------------------------------------------------
    def cluster_sh(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return subprocess.run([str(CLUSTER_SH), *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def up(self) -> float:
        """Start it (every node booted through its custom actions); the seconds it took."""
        start = time.monotonic()
        result = self.cluster_sh("up")
        if result.returncode != 0:
            raise RuntimeError(f"cluster.sh up ({self.name}) failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
        return time.monotonic() - start

    def down(self) -> None:
        result = self.cluster_sh("down")
        if result.returncode != 0:
            raise RuntimeError(f"cluster.sh down ({self.name}) failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")

    def is_up(self) -> bool:
        return self.cluster_sh("status", timeout=120).returncode == 0

    # --- Slurm ------------------------------------------------------------------------------------
    def slurm(self, *command: str, check: bool = True, timeout: float = 60) -> str:
        result = subprocess.run(list(command), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip() or result.stdout.strip()}")
        return result.stdout

    def node_states(self) -> dict[str, tuple[str, str]]:
        """node -> (state as sinfo prints it, e.g. idle, down*, drained; reason)."""
        out = self.slurm("sinfo", "-h", "-N", "-p", "gpu", "-o", "%N|%T|%E")
        states = {}
        for line in out.splitlines():
            node, state, reason = line.split("|", 2)
            states[node] = (state, reason)
        return states

    def jobs(self) -> list[dict[str, str]]:
        """Jobs as squeue shows them: id, name, account, state, nodes (count), reason, nodelist."""
        out = self.slurm("squeue", "-h", "-o", "%i|%j|%a|%T|%D|%r|%N")
        keys = ("id", "name", "account", "state", "nodes", "reason", "nodelist")
        return [dict(zip(keys, line.split("|"))) for line in out.splitlines() if line.strip()]

    def wait_all_usable(self, timeout: float = 300) -> None:
        """Until every node is usable (idle, allocated, ...): after a run, the replacements are back."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            bad = {n: s for n, (s, _) in states.items() if s not in USABLE}
            if len(states) == self.nodes and not bad:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not usable after {timeout:.0f} s: {bad}")
            time.sleep(1)

    # --- processes --------------------------------------------------------------------------------
    def node_pids(self, node: str) -> list[int]:
        """Every process in the node's network namespace: its slurmd, job steps, the job's tasks."""
        out = subprocess.run(["ip", "netns", "pids", self.netns(node)], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

    def daemon_pids(self) -> dict[str, list[int]]:
        """This cluster's slurmctld, slurmdbd, each node's slurmd, and its MariaDB and munged (pid files)."""
        run = self.base / "run"
        found: dict[str, list[int]] = {"slurmctld": [], "slurmdbd": [], "slurmd": [], "mariadbd": [], "munged": []}
        files = [(run / f"{name}.pid", name) for name in ("slurmctld", "slurmdbd", "munged")]
        files += [(run / "mariadb.pid", "mariadbd")] + [(run / f"slurmd-{n}.pid", "slurmd") for n in self.node_names()]
        for path, name in files:
            try:
                pid = int(path.read_text().split()[0])
                if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                    found[name].append(pid)
            except (OSError, ValueError, IndexError):
                continue
        return found


def process_usage(pids: list[int]) -> tuple[float, float]:
    """(resident MiB, CPU seconds with the children they reaped) summed over live ``pids``."""
    ticks = os.sysconf("SC_CLK_TCK")
    rss = cpu = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        cpu += sum(int(f) for f in fields[11:15]) / ticks  # utime, stime, cutime, cstime
        match = re.search(r"VmRSS:\s+(\d+) kB", status)
        rss += int(match.group(1)) / 1024 if match else 0.0
    return rss, cpu


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (every core, since boot)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
