"""A torch-free stand-in for ``training.train``, for the goodput simulation on the local cluster.

    TRAIN_LAUNCHER="python local_cluster/stand_ins/trainer.py" SIM_STEP_S=23.5 SIM_SAVE_S=118 \\
        SIM_TIME_SCALE=2000 sbatch --gpus-per-node=0 jobs/train_model7.sh

``jobs/train.sh`` runs it in its srun step instead of torchrun + ``training.train`` (one task per node),
with the trainer's own arguments (``--config FILE``, ``--model MODEL``, ``section.key=value``). It keeps what a failure and
a restart see of the trainer, in compressed time (``SIM_TIME_SCALE`` simulated seconds per second):

- rank 0 resumes from the checkpoint ``latest`` names, reading it for ``SIM_LOAD_S`` (default
  ``SIM_SAVE_S``); runs each step in ``SIM_STEP_S``, paced against the clock so that late wake-ups do
  not add up; saves every ``checkpoint.every`` steps (and after ``checkpoint.every_minutes`` simulated
  minutes) in the background: the checkpoint commits ``SIM_SAVE_S`` later and training goes on
  meanwhile, one save in flight at most; the final save waits. Checkpoint rules as in
  ``training/checkpoints/checkpointer.py``: ``step_<8 digits>/``, complete once ``.metadata`` and ``train_meta.json``
  exist, ``latest`` replaced last, ``checkpoint.keep`` complete ones kept, older unfinished ones removed;
- ``metrics.jsonl`` gets the trainer's lines: events ``start``, ``complete``, ``stopped``, and every
  ``log.interval`` steps a line with step, loss, step time ... and ``time``; ``STATUS`` is written at
  the end, as the trainer writes it;
- the ranks are coupled as a collective couples them: every other rank holds a TCP connection to rank
  0 (on the first node). A rank whose node fails dies with it and its connection closes: the others
  fail at once (exit 1) and nothing is saved, as NCCL fails a collective with a dead peer (here without
  its timeout). SIGUSR1/SIGTERM make rank 0 check at the next step that every rank is still there, save,
  write STATUS stopped and release the others (exit 0);
- a slow node (a straggler, docs/goodput.md): the simulation writes its slowdown ``x`` to
  ``$SIM_SLOW_MARKERS/<node>``. A node's pace is ``1 + x`` (1 without a marker); rank 0 reads its ranks'
  markers whenever the folder changes (one stat a step) and paces every step at the slowest node's, as a
  synchronous step waits for its slowest rank. Each log interval it applies the trainer's rule
  (``training/resilience/straggler_rule.py``) to probes with the H200's measured noise (probe_noise.py): each
  node's figure is ``1 + x`` times the median of its 8 GPUs' noisy probes, host probes likewise without ``x``
  (``probe_node``, ``probe_excess_pct`` in the line; ``slowest_*`` are the noiseless pace's, the report's
  measure of what slow nodes held back). A node over ``train.straggler_margin`` in
  ``train.straggler_intervals`` of the last ``train.straggler_window`` intervals is a straggler (a ``straggler``
  event). With ``train.straggler_evict`` (unset: on, the GPUs stood in for) and its slowdown until the run's
  end costing more than ``train.straggler_evict_cost_s`` (simulated seconds),
  it then does what the trainer does: saves synchronously, has the straggler's rank report its node to
  the epilog (training/resilience/node_suspect.py: drained with the reason), writes the reason to
  ``TRAIN_FAILURE_FILE`` and an ``evict`` event, and every rank exits 1 for jobs/train.sh to requeue.

Times in the files are wall-clock seconds, as the real trainer's are; the simulation converts them.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import select
import signal
import socket
import statistics
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # probe_noise.py beside it, run as a script or a module
import probe_noise  # noqa: E402
from training.resilience.straggler_rule import Figures, Finding, NodeRule, describe, worth_evicting  # noqa: E402 (torch-free)

GPUS_PER_NODE = 8  # each rank stands for a node of 8 GPUs

LATEST, META, STATUS = "latest", "train_meta.json", "STATUS"
STEP_DIR = re.compile(r"step_(\d{8})")
PING, ACK, RELEASE = b"p", b"k", b"s"
EVICT, EVICTED = b"e", b"x"  # to the straggler's rank: report your node (then the reason); to every rank: exit 1
EVICTED_EXIT = 1  # training.train's EVICTED: a failure, requeued by jobs/train.sh


class PeerLost(RuntimeError):
    """A rank's connection closed: its node failed (the collective a real trainer is in fails)."""


def env_float(name: str, default: float | None = None) -> float:
    value = os.environ.get(name)
    if value is None and default is not None:
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value or ''} is not a number — the goodput simulation sets it "
                         "when it submits the job (local_cluster/simulation/run.py)") from None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: ``node[3-5,9]`` -> ``node3``."""
    match = re.match(r"([^\[,]+)(?:\[(\d+))?", nodelist)
    if not match:
        raise SystemExit(f"error: cannot read the node list {nodelist!r}")
    return match.group(1) + (match.group(2) or "")


class Clock:
    """Simulated seconds to wall-clock seconds."""

    def __init__(self, scale: float):
        self.scale = scale

    def wall(self, simulated_s: float) -> float:
        return simulated_s / self.scale


# --- the other ranks ------------------------------------------------------------------------------
def follower(rank: int, address: tuple[str, int], timeout_s: float) -> int:
    """Connect to rank 0, answer its checks, leave when it releases us (0) or is gone (1).

    A stop signal before the rendezvous ends the rank (torchrun's agent stops its workers); after it,
    rank 0 decides at a step boundary, as the trainer's ranks vote."""
    stopped: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda signum, _: stopped.append(signum))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = socket.create_connection(address, timeout=2)
            break
        except OSError:
            if stopped or time.monotonic() > deadline:
                print(f"rank {rank}: no rendezvous with {address[0]}:{address[1]}", file=sys.stderr)
                return 1
            time.sleep(0.05)
    conn.settimeout(None)
    host = node_name().encode()
    conn.sendall(struct.pack("!IB", rank, len(host)) + host)
    while True:
        try:
            message = conn.recv(1)
        except InterruptedError:
            continue
        except OSError:
            message = b""
        if message == PING:
            conn.sendall(ACK)
        elif message == RELEASE:
            return 0
        elif message == EVICT:  # this rank's node is the straggler: it reports it, on its own node
            report_node(receive(conn, struct.unpack("!H", receive(conn, 2))[0]).decode())
            conn.sendall(ACK)
        elif message == EVICTED:
            print(f"rank {rank}: a straggler's node is evicted: exiting for the job to be requeued", file=sys.stderr)
            return EVICTED_EXIT
        else:
            print(f"rank {rank}: rank 0 is gone (its node failed): leaving as a failed collective does",
                  file=sys.stderr)
            return 1


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def receive(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise PeerLost("a rank's connection closed (its node failed)")
        data += chunk
    return data


def report_node(why: str) -> None:
    """This rank's node to be drained by the epilog, with ``why`` (the trainer's own report)."""
    from training.resilience import node_suspect  # the bundle's, torch-free

    node_suspect.report(why)


# --- rank 0 ---------------------------------------------------------------------------------------
class Peers:
    """Rank 0's connections to the other ranks, and every rank's node (``hosts``, by rank)."""

    def __init__(self, world: int, port: int, timeout_s: float, stop: list[str]):
        self.conns: list[socket.socket] = []
        self.by_rank: dict[int, socket.socket] = {}
        self.hosts = [node_name()] * world
        if world == 1:
            return
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))
        server.listen(world)
        # the line says rank 0 is up: its stop handlers installed, the others' connections taken from here on
        print(f"rank 0: waiting for {world - 1} more ranks on port {port}", file=sys.stderr, flush=True)
        # a stop signal ends the wait (a job requeued meanwhile: its prolog failed on another node), as
        # torchrun's agent stops its workers; else the job would hold its nodes until Slurm's KillWait
        server.settimeout(0.25)
        deadline = time.monotonic() + timeout_s
        try:
            while len(self.conns) < world - 1:
                if stop or time.monotonic() > deadline:
                    raise PeerLost(f"rendezvous: {len(self.conns) + 1} of {world} ranks, "
                                   + (f"stopped by {stop[0]}" if stop else f"none more after {timeout_s:g} s"))
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                conn.settimeout(timeout_s)
                rank, size = struct.unpack("!IB", receive(conn, 5))
                self.hosts[rank] = receive(conn, size).decode()
                conn.settimeout(None)
                self.conns.append(conn)
                self.by_rank[rank] = conn
        except (TimeoutError, OSError) as exc:
            raise PeerLost(f"rendezvous: {len(self.conns) + 1} of {world} ranks after {timeout_s:g} s ({exc})") from None
        finally:
            server.close()

    def sleep_until(self, wall_time: float) -> None:
        """Sleep until ``wall_time``; raise PeerLost as soon as a rank's connection closes."""
        while (left := wall_time - time.time()) > 0:
            if not self.conns:
                time.sleep(left)
                return
            try:
                readable, _, _ = select.select(self.conns, [], [], left)
            except InterruptedError:
                continue
            if readable:  # a follower never speaks first: this is its connection closing
                raise PeerLost("a rank's connection closed (its node failed)")

    def check(self) -> None:
        """Every rank answers: the agreement a save or a stop needs."""
        try:
            for conn in self.conns:
                conn.sendall(PING)
            for conn in self.conns:
                conn.settimeout(10)
                if conn.recv(1) != ACK:
                    raise PeerLost("a rank did not answer (its node failed)")
                conn.settimeout(None)
        except OSError as exc:
            raise PeerLost(f"a rank did not answer ({exc})") from None

    def release(self, message: bytes = RELEASE) -> None:
        for conn in self.conns:
            try:
                conn.sendall(message)
            except OSError:
                pass

    def report_node(self, rank: int, why: str) -> None:
        """Rank ``rank`` reports its own node to the epilog (a node-local marker: only it can write it)."""
        if rank == 0:
            report_node(why)
            return
        conn, text = self.by_rank[rank], why.encode()
        try:
            conn.sendall(EVICT + struct.pack("!H", len(text)) + text)
            conn.settimeout(10)
            if conn.recv(1) != ACK:
                raise PeerLost(f"rank {rank} did not report its node")
            conn.settimeout(None)
        except OSError as exc:
            raise PeerLost(f"rank {rank} did not report its node ({exc})") from None


class Probes:
    """Each rank's pace: ``1 + x`` for a node the simulation slowed by ``x`` (``<folder>/<node>``), else 1.
    The markers are read again when the folder changes: a stat a step, nothing while no node is slow.
    ``figures`` draws an interval's probes from them with the measured noise."""

    def __init__(self, folder: str | None, hosts: list[str], seed: str = ""):
        self.folder, self.hosts = Path(folder) if folder else None, hosts
        self.seen: int | None = None
        self.values = [1.0] * len(hosts)
        self.rng = random.Random(seed)

    def figures(self, interval_s: float) -> Figures:
        """One interval's figures: each node (one rank here) stands for its 8 GPUs, the median of their probes."""
        def node(pace: float) -> float:
            return pace * statistics.median(probe_noise.ratio(self.rng) for _ in range(GPUS_PER_NODE))

        return Figures(probe_s=[node(v) for v in self.values], host_s=[node(1.0) for _ in self.values],
                       data_wait_s=[0.0] * len(self.values), arrival_s=[0.0] * len(self.values), interval_s=interval_s)

    def refresh(self) -> list[float]:
        if self.folder is None:
            return self.values
        try:
            changed = self.folder.stat().st_mtime_ns
        except FileNotFoundError:
            changed = None
        if changed != self.seen:
            self.seen = changed
            self.values = [1.0 + self._slowdown(host) for host in self.hosts]
        return self.values

    def _slowdown(self, host: str) -> float:
        try:
            return float((self.folder / host).read_text())
        except (FileNotFoundError, ValueError):  # not slow, or being replaced
            return 0.0


class Checkpoints:
    """training/checkpoints/checkpointer.py's layout and rules, with nothing in the folders but the markers."""

    def __init__(self, directory: Path, keep: int, world: int):
        self.dir, self.keep, self.world = directory, keep, world
        self.dir.mkdir(parents=True, exist_ok=True)

    def step_dir(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}"

    def steps(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := STEP_DIR.fullmatch(p.name)))

    def is_complete(self, step: int) -> bool:
        path = self.step_dir(step)
        return (path / ".metadata").is_file() and (path / META).is_file()

    def latest_step(self) -> int:
        try:
            m = STEP_DIR.fullmatch((self.dir / LATEST).read_text().strip())
        except OSError:
            return -1
        return int(m.group(1)) if m else -1

    def newest_loadable(self) -> int:
        """The step to resume from (0: none); folders newer than ``latest`` are unfinished saves."""
        latest = self.latest_step()
        for step in reversed([s for s in self.steps() if s <= latest]):
            if self.is_complete(step):
                return step
        return 0

    def begin(self, step: int) -> None:
        self.step_dir(step).mkdir(exist_ok=True)  # the shards being written

    def commit(self, step: int) -> None:
        from atomic_file import write_atomic  # the bundle's: jobs/ is on PYTHONPATH in the job

        path = self.step_dir(step)
        (path / ".metadata").write_text("stand-in\n")
        write_atomic(path / META, json.dumps({"step": step, "world_size": self.world}))
        write_atomic(self.dir / LATEST, path.name + "\n")
        older = [s for s in self.steps() if s < step]
        complete = [s for s in older if self.is_complete(s)]
        doomed = complete[: max(len(complete) - (self.keep - 1), 0)] + [s for s in older if not self.is_complete(s)]
        for old in doomed:
            for child in self.step_dir(old).iterdir():
                child.unlink()
            self.step_dir(old).rmdir()


def loss_at(step: int) -> float:
    """A plausible, deterministic loss curve: a resumed run logs what the interrupted one would have."""
    return round(2.0 + 8.0 / math.sqrt(1 + step / 50), 6)


def leader(cfg, world: int, port: int, clock: Clock, step_s: float, save_s: float, load_s: float,
           slow_markers: str | None = None) -> int:
    stop: list[str] = []
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda signum, _: stop.append(signal.Signals(signum).name))
    Path(cfg.log.dir).mkdir(parents=True, exist_ok=True)
    metrics = open(Path(cfg.log.dir) / "metrics.jsonl", "a")

    def write(record: dict) -> None:
        metrics.write(json.dumps({**record, "time": time.time()}) + "\n")
        metrics.flush()

    peers = Peers(world, port, float(cfg.train.init_timeout_s), stop)
    probes = Probes(slow_markers, peers.hosts, seed=os.environ.get("SLURM_JOB_ID", ""))
    detector = NodeRule(peers.hosts, margin=cfg.train.straggler_margin, intervals=cfg.train.straggler_intervals,
                        window=cfg.train.straggler_window)
    evicts = cfg.train.straggler_evict is not False  # unset: on, as on the GPUs the simulation stands in for
    ckpt = Checkpoints(Path(cfg.checkpoint.dir), cfg.checkpoint.keep, world)
    step = ckpt.newest_loadable()
    if step:
        peers.sleep_until(time.time() + clock.wall(load_s))  # every rank reads its part
    every, every_s = cfg.checkpoint.every, 60 * cfg.checkpoint.every_minutes
    tokens = cfg.train.global_batch_size * cfg.data.seq_len
    write({"event": "start", "step": step, "world_size": world, "resumed": step > 0})
    step_wall, save_wall = clock.wall(step_s), clock.wall(save_s)
    pending: tuple[int, float] | None = None  # the save in flight: (step, when it commits)
    last_save = interval_start = next_end = time.time()
    interval_steps = 0
    stopping = False
    while step < cfg.train.steps and not stopping:
        next_end += step_wall * max(probes.refresh())  # a synchronous step waits for its slowest rank
        peers.sleep_until(next_end)
        step += 1
        interval_steps += 1
        if pending and time.time() >= pending[1]:
            ckpt.commit(pending[0])
            pending = None
        if stop:
            peers.check()  # the stop vote: a collective
            stopping = True
        last = step == cfg.train.steps or stopping
        evict = None  # the straggler whose node this run leaves, after saving
        if step % cfg.log.interval == 0 or last:
            now = time.time()
            elapsed = max(now - interval_start, 1e-9)
            verdict = detector.update(probes.figures(elapsed))
            # The pace (the slowest node's 1 + x, noiseless) in slowest_*: the simulation's report counts the slow
            # nodes a model met and the time they held it back by it; what the rule saw in probe_*.
            values = probes.values
            slowest = max(range(len(values)), key=values.__getitem__)
            others = values[:slowest] + values[slowest + 1:]
            excess = values[slowest] / statistics.median(others) - 1 if others else 0.0
            write({"step": step, "loss": loss_at(step), "lr": cfg.optim.lr, "grad_norm": 1.0,
                   "tokens_per_s": tokens * interval_steps / elapsed,
                   "tokens_per_s_per_device": tokens * interval_steps / elapsed / world,
                   "step_time_s": elapsed / interval_steps, "data_wait_pct": 0.0, "checkpoint_block_s": 0.0,
                   "memory_gib": 0.0, "samples_crc": step, "slowest_rank": slowest,
                   "slowest_excess_pct": 100 * excess, "slowest_node": peers.hosts[slowest],
                   "probe_node": verdict.slowest.node, "probe_excess_pct": 100 * verdict.slowest.excess})
            interval_start, interval_steps = now, 0
            for found in verdict.new:
                write({"event": "straggler", "step": step, "rank": found.rank, "node": found.node,
                       "cause": found.cause, "excess_pct": round(100 * found.excess, 1), "intervals": found.counted,
                       "window": found.window, "scope": found.scope, "margin_pct": 100 * cfg.train.straggler_margin})
            if evicts and not last:
                remaining_s = (cfg.train.steps - step) * step_s  # simulated, as the cost is
                evict = next((f for f in verdict.standing if worth_evicting(
                    f, remaining_s=remaining_s, cost_s=cfg.train.straggler_evict_cost_s)), None)
        due = step % every == 0 or last or (every_s and (time.time() - last_save) * clock.scale >= every_s)
        if due or evict:
            if pending:  # one save in flight at most: the next waits for it
                peers.sleep_until(pending[1])
                ckpt.commit(pending[0])
                pending = None
            peers.check()  # every rank writes its shards
            ckpt.begin(step)
            if last or evict:  # the final save is synchronous, an eviction's too
                peers.sleep_until(time.time() + save_wall)
                ckpt.commit(step)
            else:
                pending = (step, time.time() + save_wall)
            last_save = time.time()
            next_end = max(next_end, time.time())
        if evict:
            return leave(cfg, peers, write, step, evict)
    status = "complete" if step >= cfg.train.steps else "stopped"
    write({"event": status, "step": step, "signal": stop[0] if stop else None})
    metrics.close()
    from atomic_file import write_atomic

    write_atomic(Path(cfg.checkpoint.dir) / STATUS, status + "\n")
    peers.release()
    return 0


def leave(cfg, peers: Peers, write, step: int, found: Finding) -> int:
    """training.train's eviction, the checkpoint of ``step`` saved: the straggler's rank reports its node to
    the epilog, FAILURE says why, and every rank exits 1 (jobs/train.sh requeues; the drained node is left out)."""
    why = f"{describe(found, margin=cfg.train.straggler_margin)}; saved step {step}, evicting the node"
    peers.report_node(found.rank, why)
    write({"event": "evict", "step": step, "rank": found.rank, "node": found.node, "cause": found.cause,
           "reason": "straggler", "excess_pct": round(100 * found.excess, 1)})
    failure = os.environ.get("TRAIN_FAILURE_FILE")
    if failure:
        Path(failure).write_text(why + "\n")
    print(f"rank 0: {why}: exiting for the job to be requeued on other nodes", file=sys.stderr, flush=True)
    peers.release(EVICTED)
    return EVICTED_EXIT


def main(argv: list[str] | None = None) -> int:
    from cli import ArgumentParser, fail  # the bundle's: jobs/ is on PYTHONPATH in the job

    parser = ArgumentParser(prog="trainer.py", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML config file, as training.train takes it")
    parser.add_argument("--model", help="the model whose job this is, as training.train takes it")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_intermixed_args(argv)
    rank, world = int(os.environ.get("SLURM_PROCID", 0)), int(os.environ.get("SLURM_NTASKS", 1))
    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST") or "localhost"
    address = (first_host(nodes), int(os.environ.get("RDZV_PORT", 29500)))
    try:
        clock = Clock(env_float("SIM_TIME_SCALE"))
        step_s, save_s = env_float("SIM_STEP_S"), env_float("SIM_SAVE_S")
        load_s = env_float("SIM_LOAD_S", save_s)
    except ValueError as exc:
        return fail(exc)
    if rank:
        return follower(rank, address, timeout_s=60)
    from training.config import ConfigError, load_config  # torch-free; only rank 0 reads the config

    try:
        cfg = load_config(args.config, args.overrides, model=args.model)
    except ConfigError as exc:
        failure = os.environ.get("TRAIN_FAILURE_FILE")
        if failure:
            Path(failure).write_text(f"user: config error: {exc}\n")
        return fail(exc, "see python -m training.train --help for every key")
    try:
        return leader(cfg, world, address[1], clock, step_s, save_s, load_s, os.environ.get("SIM_SLOW_MARKERS"))
    except PeerLost as exc:
        print(f"rank 0: training failed: {exc}", file=sys.stderr, flush=True)
        os._exit(1)  # as the trainer leaves on an infrastructure failure: at once, saving nothing


if __name__ == "__main__":
    sys.exit(main())
