"""Node failures and slow nodes for the simulation: when they happen, and what one does to a local node.

When: every node in service fails at ``rate`` per 1,000 node-days of simulated time, independently
(cluster_config/goodput.py's failure model). ``failure_times`` draws the cluster's failures as one
Poisson process over all nodes from a seeded generator; at each time one node is picked at random, and a
pick that is already out of service (being replaced) is skipped, which leaves each node in service
failing at exactly ``rate``.

What, two kinds (Llama 3's interruptions were mostly GPUs, some whole hosts):
  lose_node  the instance dies: every process in the node's namespaces is killed (its slurmd, the job
             steps, the job's tasks) and the node is set DOWN with the reason. Slurm would find it
             unresponsive only after SlurmdTimeout (ParallelCluster: 180 s) or clustermgtd after its EC2
             health check; here that detection is immediate. Slurm requeues the job (node failure).
  fail_gpu   a GPU fails (an Xid): the job's tasks on the node die, its slurmd lives on and the node's
             health check fails from now on (local_cluster/health_check.sh's marker). The job's other
             ranks fail, srun ends the step (--kill-on-bad-exit), jobs/train.sh asks training.resilience.recovery
             and requeues, and the epilog's health check drains the node.
Either way the stand-in for clustermgtd (local_cluster/stand_ins/clustermgtd.py) replaces the node.

Slow nodes (stragglers: slow, not failed) arrive the same way at their own rate, from a generator of their
own (the failures of a seed stay the same). ``slow_down`` writes the node's slowdown to the marker the
stand-in trainer's ranks read as their probe (local_cluster/stand_ins/trainer.py: a synchronous step at
the slowest rank's pace): the stand-in sleeps its steps, it burns no CPU a cgroup quota could slow. The
marker goes when the node leaves service (``clear_slow``): its replacement is a new instance.
"""

from __future__ import annotations

import os
import random
import signal

from local_cluster.simulation.cluster import SimCluster

DAY_S = 86400.0
TRAINER = b"stand_ins/trainer.py"  # the ranks; the batch script and srun run on the CPUs and live


def failure_times(rate_per_1000_node_days: float, nodes: int, days: float, rng: random.Random) -> list[float]:
    """Simulated seconds (from 0 to ``days``) at which some node fails: a Poisson process at the
    cluster's rate, ``nodes`` x ``rate`` / 1000 per day."""
    per_s = rate_per_1000_node_days / 1000 * nodes / DAY_S
    times, t = [], 0.0
    while per_s > 0:
        t += rng.expovariate(per_s)
        if t >= days * DAY_S:
            break
        times.append(t)
    return times


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _is_trainer(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return TRAINER in f.read()
    except OSError:
        return False


def lose_node(cluster: SimCluster, node: str) -> None:
    """The node's instance dies: everything in it, then DOWN (the detection, made immediate)."""
    _kill(cluster.node_pids(node))
    cluster.slurm("scontrol", "update", f"nodename={node}", "state=down", "reason=simulated failure: node lost")


def fail_gpu(cluster: SimCluster, node: str) -> None:
    """A GPU of the node fails: its health check fails from now on, the job's ranks there die."""
    marker = cluster.fsx / ".node-health" / node
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("simulated failure: GPU fell off the bus (Xid 79)\n")
    _kill([pid for pid in cluster.node_pids(node) if _is_trainer(pid)])


def slow_markers(cluster: SimCluster):
    """The folder of the slow nodes' markers, as the nodes see it (the same path: they share the host's
    file system but for /dev/shm and their own mounts)."""
    return cluster.fsx / ".node-slow"


def slow_down(cluster: SimCluster, node: str, slowdown: float) -> None:
    """The node turns slow: its ranks' steps take ``1 + slowdown`` times as long (and every rank's of its job)."""
    folder = slow_markers(cluster)
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder.parent / f".node-slow.{node}"  # beside it: the folder changes once, whole
    partial.write_text(f"{slowdown!r}\n")
    os.replace(partial, folder / node)  # the folder's change is what the ranks look for


def clear_slow(cluster: SimCluster, node: str) -> None:
    (slow_markers(cluster) / node).unlink(missing_ok=True)


FIRST_NODE_LOST = "first node lost"  # the job's first node: its batch script, rank 0, its step's tree root
KINDS = {"GPU failed": fail_gpu, "node lost": lose_node, FIRST_NODE_LOST: lose_node}
