"""Lost nodes found in seconds: each node's heartbeat in the job's store, watched by every rank.

A node that disappears (an instance lost, a kernel panic, a cut link) says nothing: its peers' NCCL
collectives wait for it until ``train.timeout_s``, and only then does the training step end. Here each
node's first rank (local rank 0) adds 1 to the node's counter in the job's c10d store every sixth of
``train.peer_timeout_s``, and every rank reads all the counters as often (one ``multi_get``). A node
whose counter has not moved across the reads of ``peer_timeout_s`` (each rank's own clock: no clocks of
two nodes are compared) is lost, and so is the store when it does not answer for as long (it lives on
the first node: torchrun's agent store, or rank 0's own without torchrun). The rank then

  1. logs which node was lost and how long ago it was last heard;
  2. names the cause in the job's failure file (``node lost: ...``; the first rank to write it), which
     jobs/train.sh hands to ``training.resilience.recovery decide`` for the recovery event in metrics.jsonl;
  3. exits with ``EXIT_NODE_LOST``: every rank leaves by itself (torchrun, once one worker has exited,
     gives the others its shutdown timeout, KillWait, before it kills them), the step ends, and
     jobs/train.sh relaunches it on the nodes still healthy.

One writer per node, not per rank: what is detected is a node; a rank dying on a live node ends the step
through its launcher within a second, and a stuck one is the progress watchdog's (watchdog.py). Every rank
reads, so that none waits to be told. Beats and reads come from a daemon thread on a store connection of
its own, judged by a second thread: a long step, a synchronous save, compilation or a data wait do not
stop them (the store's calls, torch's operators and collectives release the GIL; only a C call holding it
for longer than ``peer_timeout_s`` would: a snapshot's serialization into memory holds it for its length,
seconds), and a lost store host, whose calls never return, blocks that thread only, not the training's
own store traffic. At the end of training a node's writer marks it ``stopped`` before its ranks leave,
so nodes still finishing their last save do not take it for lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from datetime import timedelta

from training.checkpoints.snapshot import node_name  # Slurm's name for the node, as the snapshots name it

log = logging.getLogger(__name__)

BEATS_PER_TIMEOUT = 6  # beats in a peer timeout: a node is lost after about five missed in a row
EXIT_NODE_LOST = 4  # any non-zero code relaunches (training/resilience/recovery.py); a distinct one reads clearly
STOPPED = b"stopped"  # a node's counter once its ranks have finished: no longer watched
PREFIX = "heartbeat"


class Heartbeat:
    """Start with ``start()`` once every rank has joined the process group; ``close()`` at the end of training.

    ``node``, ``nodes``: this rank's node (torchrun's GROUP_RANK) and how many train; ``writer``: whether this
    rank beats for its node (its local rank 0). ``connect(timeout_s)``: a new client of the job's store.
    Two threads: one talks to the store, and blocks for as long as a lost host does not answer (a TCPStore
    client's calls wait for the answer, whatever its timeout); the other judges, from what the first last heard.
    """

    def __init__(self, *, connect, node: int, nodes: int, writer: bool, peer_timeout_s: float, interval_s: float,
                 store_at: str, prefix: str = PREFIX, failure_file: str | None = None, exit=os._exit,
                 clock=time.monotonic):
        self.node, self.nodes, self.writer = node, nodes, writer
        self.peer_timeout_s, self.interval_s, self.store_at = peer_timeout_s, interval_s, store_at
        self._connect, self.failure_file, self._exit, self._clock = connect, failure_file, exit, clock
        self._keys = [f"{prefix}/node{n}" for n in range(nodes)]
        self._store = None
        self._hosts: list[str] = []
        self._lock = threading.Lock()
        self._values: dict[int, bytes] = {}  # each node's counter as last read
        self._heard: dict[int, float] = {}  # when each counter last moved, on this clock
        self._answered = 0.0  # the store's last answer
        self._stop = threading.Event()
        self._beater = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._watcher = threading.Thread(target=self._watch, name="heartbeat-watch", daemon=True)
        self.fired: str | None = None
        self.rounds = 0  # beats written and read: the overhead's count

    def start(self) -> "Heartbeat":
        self._answered = self._clock()
        self._heard = dict.fromkeys(range(self.nodes), self._answered)
        self._beater.start()
        self._watcher.start()
        return self

    def close(self) -> None:
        """Stop watching, and tell the other nodes this one has finished (its writer does, as its last beat)."""
        self._stop.set()
        self._watcher.join(timeout=2 * self.interval_s)
        self._beater.join(timeout=2 * self.interval_s)  # a store that no longer answers: left behind (a daemon)

    @property
    def heard(self) -> set[int]:
        """The nodes whose beat this rank has read."""
        with self._lock:
            return set(self._values)

    def _beat(self) -> None:
        while True:
            try:
                if self._store is None:
                    self._store = self._connect(self.interval_s)
                    if self.writer:
                        self._store.set(f"{self._keys[self.node]}/host", node_name())
                values = self.round()
            except Exception:  # noqa: BLE001  (a refused or reset connection: a new one next time; the watcher judges)
                self._store = None
            else:
                now = self._clock()
                with self._lock:
                    self._answered = now
                    for n, value in values.items():
                        if value != self._values.get(n):
                            self._values[n], self._heard[n] = value, now
                    self.rounds += 1
            if self._stop.wait(self.interval_s):
                break
        if self.writer and self.fired is None and self._store is not None:
            with contextlib.suppress(Exception):  # the end of training: a store already gone changes nothing
                self._store.set(self._keys[self.node], STOPPED)

    def round(self) -> dict[int, bytes]:
        """This node's beat (its writer's), then every node's counter that exists yet (a node's first beat may
        still be on its way at the start): one add and one multi_get."""
        if self.writer:
            self._store.add(self._keys[self.node], 1)
        if not self._store.check(self._keys):
            return {n: self._store.get(key) for n, key in enumerate(self._keys) if self._store.check([key])}
        if not self._hosts:  # each writer names its node before its first beat
            self._hosts = [host.decode() for host in self._store.multi_get([f"{key}/host" for key in self._keys])]
        return dict(enumerate(self._store.multi_get(self._keys)))

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                now = self._clock()
                if now - self._answered > self.peer_timeout_s:
                    what = (f"the job's store at {self.store_at} (on the first node) has not answered for "
                            f"{now - self._answered:.1f} s")
                else:  # silent: its counter unchanged by the reads of the last peer_timeout_s
                    watched = [n for n in range(self.nodes) if n != self.node and self._values.get(n) != STOPPED]
                    silent = min(watched, key=lambda n: self._heard[n], default=None)
                    if silent is None or self._answered - self._heard[silent] <= self.peer_timeout_s:
                        continue
                    host = self._hosts[silent] if self._hosts else "host unknown"
                    what = f"node {silent} ({host}) lost: " + (
                        f"never heard in {now - self._heard[silent]:.1f} s" if silent not in self._values else
                        f"last heard {now - self._heard[silent]:.1f} s ago")
            self._fire(f"{what} (train.peer_timeout_s {self.peer_timeout_s:g})")
            return

    def _fire(self, what: str) -> None:
        self.fired = what
        line = f"node {self.node} ({node_name()}): {what}"
        log.error("heartbeat: %s; exiting for the job to relaunch without it", line)
        if self.failure_file:  # the first rank to report names the cause
            with contextlib.suppress(OSError), open(self.failure_file, "x") as f:
                f.write(f"node lost: {line}\n")
        self._exit(EXIT_NODE_LOST)


def start(*, rank: int, world_size: int, peer_timeout_s: float, collective_timeout_s: float | None = None,
          failure_file: str | None = None) -> Heartbeat | None:
    """This rank's heartbeat, started, from torchrun's environment (GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE and the
    store's MASTER_ADDR:MASTER_PORT); None when off (``peer_timeout_s`` 0), when one node trains, or when the
    collectives' own timeout (``train.timeout_s``) is no longer: it finds a lost node as soon."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    nodes = world_size // per_node if per_node else 1
    if not peer_timeout_s or nodes < 2:
        return None
    if collective_timeout_s is not None and collective_timeout_s <= peer_timeout_s:
        log.info("peer heartbeats off: train.timeout_s %g finds a lost node no later than train.peer_timeout_s %g",
                 collective_timeout_s, peer_timeout_s)
        return None
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])

    def connect(timeout_s: float):
        import torch.distributed as dist

        return dist.TCPStore(host, port, None, False, timedelta(seconds=timeout_s), wait_for_workers=False)

    # Keys of this launch alone (torchrun's run id and restart): a store outlives a restart of the agent's workers.
    prefix = f"{PREFIX}/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}"
    return Heartbeat(connect=connect, node=int(os.environ.get("GROUP_RANK", rank // per_node)), nodes=nodes,
                     writer=int(os.environ.get("LOCAL_RANK", rank % per_node)) == 0, peer_timeout_s=peer_timeout_s,
                     interval_s=peer_timeout_s / BEATS_PER_TIMEOUT, store_at=f"{host}:{port}", prefix=prefix,
                     failure_file=failure_file).start()
