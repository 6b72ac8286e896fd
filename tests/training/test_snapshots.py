"""Snapshots in memory (training/checkpoints/snapshot.py): real 2-node gloo runs killed and started again.

Each "node" is a launcher of its own (SLURMD_NODENAME n1, n2, ...: the name Slurm gives a job step), with
one rank; its memory is its folder under the test's snapshot_dir, as /dev/shm is a node's. A node lost is
a folder deleted and a new name in its place. Every loss of every launch must equal the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CONFIG, REPO, SHORT, TORCHRUN, Run, free_port
from training.checkpoints.snapshot import Copy, buddies, plan_restore

LAYOUT = {"preset": "tiny", "world_size": 2}


def copy(node, rank, step, **manifest):
    return Copy(node, rank, step, {"world_size": 2, "layout": LAYOUT, **manifest})


def test_the_newest_step_whole_for_every_rank_is_chosen():
    held = [copy("n1", 0, 6), copy("n1", 1, 6), copy("n2", 1, 6), copy("n1", 0, 9)]  # rank 1's step 9: never written
    assert plan_restore(held, world_size=2, layout=LAYOUT, not_before=0, refused=set())[0] == 6
    step, sources = plan_restore(held, world_size=2, layout=LAYOUT, not_before=0, refused={("n1", 1, 6)})
    assert step == 6 and [c.node for c in sources[1]] == ["n2"]  # a refused copy: the other one
    assert plan_restore(held, world_size=2, layout=LAYOUT, not_before=0, refused={("n1", 1, 6), ("n2", 1, 6)}) is None
    assert plan_restore(held, world_size=2, layout=LAYOUT, not_before=7, refused=set()) is None  # the FSx one is newer
    other_layout = [copy("n1", r, 6, layout={**LAYOUT, "preset": "other"}) for r in (0, 1)]
    assert plan_restore(other_layout, world_size=2, layout=LAYOUT, not_before=0, refused=set()) is None


def test_a_step_whole_on_another_world_size_is_chosen_for_resharding():
    held = [copy("n1", r, 6) for r in (0, 1)] + [Copy("n1", r, 8, {"world_size": 4, "layout": {**LAYOUT, "world_size": 4}})
                                                 for r in range(4)]
    step, sources = plan_restore(held, world_size=2, layout=LAYOUT, not_before=0, refused=set())
    assert step == 8 and sorted(sources) == [0, 1, 2, 3]  # written by 4 ranks: loaded resharded onto 2
    step, sources = plan_restore(held, world_size=2, layout=LAYOUT, not_before=0, refused={("n1", 3, 8)})
    assert step == 6 and sorted(sources) == [0, 1]  # old rank 3's only copy refused: step 8 is not whole


def test_chunks_follow_torchs_sharding_uneven_and_replicated():
    from torch.distributed.tensor import Replicate, Shard

    from training.checkpoints.reshard import chunk_indices

    # 10 rows over 4 ranks: 3, 3, 3, 1 (torch.chunk); a replicated dimension is whole on every rank.
    rows = [chunk_indices((10, 2), (4,), [r], [Shard(0)])[0].tolist() for r in range(4)]
    assert rows == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert [i.tolist() for i in chunk_indices((4, 6), (2, 3), [1, 2], [Replicate(), Shard(1)])] == [[0, 1, 2, 3], [4, 5]]
    assert chunk_indices((3,), (4,), [3], [Shard(0)])[0].tolist() == []  # more ranks than rows: an empty chunk


def test_buddies_pair_each_rank_with_the_same_place_half_the_nodes_away():
    nodes = [n for n in ("a", "b", "c", "d") for _ in range(2)]  # 4 nodes x 2 ranks
    pairs = [buddies(nodes, r) for r in range(8)]
    assert [p[0] for p in pairs] == [4, 5, 6, 7, 0, 1, 2, 3]
    assert sorted(p[0] for p in pairs) == list(range(8))  # a permutation: each rank keeps exactly one copy
    assert all(pairs[buddy][1] == r for r, (buddy, _) in enumerate(pairs))
    assert buddies(["a", "a"], 0) == (None, None)  # one node: no copy elsewhere
    assert buddies(["a", "a", "b"], 0) == (None, None)  # unequal nodes: no pairing


class TwoNodes:
    """``nproc`` ranks on each of the named nodes (two, unless a start names fewer or more), as torchrun
    launchers joined by a c10d rendezvous."""

    def __init__(self, run: Run, data: Path, shm: Path, *, nproc: int = 1, settings: tuple[str, ...] = SHORT):
        self.run, self.data, self.shm, self.nproc, self.settings = run, data, shm, nproc, settings
        self.processes: list[subprocess.Popen] = []
        self.outputs: list[Path] = []

    def start(self, *nodes: str, extra: tuple[str, ...] = ()) -> None:
        port, self.processes, self.outputs = free_port(), [], []
        for node in nodes:
            out = self.run.root / f"launch-{len(self.run.records())}-{node}.txt"
            cmd = [*TORCHRUN, f"--nnodes={len(nodes)}", f"--nproc-per-node={self.nproc}", "--rdzv-backend=c10d",
                   f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=snap{port}", "-m", "training.train",
                   "--config", str(CONFIG), f"data.path={self.data}", *self.settings, "checkpoint.every=100",
                   "checkpoint.snapshot_every=2", f"checkpoint.snapshot_dir={self.shm}", *extra]
            self.processes.append(subprocess.Popen(cmd, env={**self.run.env(), "SLURMD_NODENAME": node}, cwd=REPO,
                                                   stdout=open(out, "w"), stderr=subprocess.STDOUT, start_new_session=True))
            self.outputs.append(out)

    def output(self) -> str:
        return "\n".join(out.read_text() for out in self.outputs)

    def kill(self) -> None:
        """Every process of both nodes, at once (SIGKILL): what a failure leaves is memory and the file system."""
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:  # ended already (a failure: the assertions after say which)
                pass
        for process in self.processes:
            process.wait()

    def wait(self, timeout: float = 180) -> list[int]:
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"training did not finish within {timeout} s:\n{self.output()[-4000:]}")
        return [p.returncode for p in self.processes]

    def node_dir(self, node: str) -> Path:
        return self.shm / f"llm-snapshots-model1-{os.getuid()}/job_local" / node

    def whole_steps(self, *nodes: str) -> set[int]:
        """Steps with a manifest for every rank of the world on every one of ``nodes`` (own copies and buddies')."""
        world = self.nproc * len(nodes)
        found = [{int(m.parent.name[5:]) for m in self.node_dir(n).glob("step_*/rank_*.json")
                  if len(list(m.parent.glob("rank_*.json"))) == world} for n in nodes]
        return set.intersection(*found) if found else set()

    def kill_after_snapshot(self, step: int, *nodes: str, timeout: float = 90) -> int:
        """Kill both nodes once the snapshot of ``step`` is whole; the newest whole snapshot step when killed."""
        deadline = time.monotonic() + timeout
        while not any(s >= step for s in self.whole_steps(*nodes)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                self.kill()
                pytest.fail(f"no whole snapshot of step {step}:\n{self.output()[-4000:]}")
            time.sleep(0.05)
        self.kill()
        return max(self.whole_steps(*nodes))


def starts(run: Run) -> list[dict]:
    return [r for r in run.records() if r.get("event") == "start"]


def test_a_killed_run_resumes_from_memory_then_a_buddys_copy_then_the_file_system(run, tiny_data, reference_losses, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    nodes = TwoNodes(run, tiny_data, shm)

    # Snapshots every 2 steps, no checkpoint on the file system before the last step (16) until the last part.
    # Every process of both nodes killed after a snapshot: the relaunch on the same nodes loads it from their
    # memory. A later snapshot cut short (its files written, their manifests not: what a kill while writing
    # leaves) is not loaded.
    nodes.start("n1", "n2")
    killed_at = nodes.kill_after_snapshot(4, "n1", "n2")
    assert not (run.checkpoints / "latest").exists()
    half = nodes.node_dir("n1") / "step_99999990"
    half.mkdir()
    for pt in (nodes.node_dir("n1") / f"step_{killed_at:08d}").glob("*.pt"):
        (half / pt.name).write_bytes(pt.read_bytes())
    nodes.start("n1", "n2")
    nodes.kill_after_snapshot(killed_at + 2, "n1", "n2")
    first = starts(run)[-1]
    assert first["resumed_from"]["source"] == "snapshot" and first["step"] == killed_at, (first, nodes.output()[-3000:])
    assert first["resumed_from"]["own_node"] == 2 and first["resumed_from"]["other_node"] == 0
    shutil_rmtree(half)

    # Node n2 lost (its memory with it) and n3 in its place: n3's rank gets n2's state from the copy n1 keeps.
    killed_at = max(nodes.whole_steps("n1", "n2"))
    shutil_rmtree(nodes.node_dir("n2"))
    nodes.start("n1", "n3")
    killed_at_2 = nodes.kill_after_snapshot(killed_at + 2, "n1", "n3")
    second = starts(run)[-1]
    assert second["resumed_from"]["source"] == "snapshot" and second["step"] == killed_at, (second, nodes.output()[-3000:])
    assert second["resumed_from"]["own_node"] == 1 and second["resumed_from"]["other_node"] == 1
    assert second["resumed_from"]["bytes_moved"] > 0

    # A flipped byte in n1's own copy: refused (logged), the buddy's copy on n3 loaded instead.
    step_dir = nodes.node_dir("n1") / f"step_{killed_at_2:08d}"
    own = next(m for m in step_dir.glob("rank_*.json") if json.loads(m.read_text())["written_on"] == "n1")
    damaged = own.with_suffix(".pt")
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x40
    damaged.write_bytes(bytes(data))
    started = len(starts(run))
    nodes.start("n1", "n3")
    deadline = time.monotonic() + 90
    while len(starts(run)) == started and time.monotonic() < deadline:
        time.sleep(0.1)
    third = starts(run)[-1]
    assert third["resumed_from"]["source"] == "snapshot" and third["step"] == killed_at_2, (third, nodes.output()[-3000:])
    assert third["resumed_from"]["other_node"] >= 1
    assert f"refused: {damaged}: its SHA-256 does not match its manifest; trying another copy" in nodes.output()
    nodes.kill()

    # Checkpoints on the file system at every step (no snapshot then) for a few steps, then both nodes lost together
    # (n1 and its buddy n3): no copy in memory, the file system's latest; the run completes.
    started = len(starts(run))
    nodes.start("n1", "n3", extra=("checkpoint.every=1",))
    deadline = time.monotonic() + 90
    while not (len(starts(run)) > started and any(r["step"] >= killed_at_2 + 2 for r in run.records()[-3:] if "loss" in r)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in nodes.processes), nodes.output()[-3000:]
        time.sleep(0.05)
    nodes.kill()
    assert starts(run)[-1]["resumed_from"]["source"] == "snapshot"
    shutil_rmtree(nodes.node_dir("n1"))
    shutil_rmtree(nodes.node_dir("n3"))
    latest_fsx = int((run.checkpoints / "latest").read_text().strip()[5:])
    nodes.start("n4", "n5")
    assert nodes.wait() == [0, 0], nodes.output()[-4000:]
    last = starts(run)[-1]
    assert last["resumed_from"] == {"source": "checkpoint", "step": latest_fsx}
    assert run.status() == "complete"
    assert not nodes.node_dir("n4").exists() and not nodes.node_dir("n5").exists()  # a clean end removes them

    # Every loss logged by every launch, repeated steps included, is the uninterrupted run's.
    for record in run.records():
        if "loss" in record:
            assert (record["loss"], record["samples_crc"]) == reference_losses[record["step"]], record
    assert {r["step"] for r in run.records() if "loss" in r} == set(reference_losses)


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


FSDP = ("train.parallelism=fsdp", "train.steps=12", "log.interval=1", "train.micro_batch_size=8",
        "optim.warmup_steps=2", "data.num_workers=0")


def resumed_from_checkpoint(root: Path, source: Run, step: int, data: Path, nproc: int) -> Run:
    """A run on ``nproc`` ranks resumed from ``source``'s checkpoint of ``step`` on the file system, saving every 2
    steps (a checkpoint at each step where the snapshots' run took a snapshot)."""
    resumed = Run(root)
    resumed.checkpoints.mkdir(parents=True)
    shutil_copytree(source.checkpoints / f"step_{step:08d}", resumed.checkpoints / f"step_{step:08d}")
    (resumed.checkpoints / "latest").write_text(f"step_{step:08d}\n")
    assert resumed.run(data, *FSDP, "checkpoint.every=2", "checkpoint.keep=100", nproc=nproc) == 0, resumed.output[-4000:]
    return resumed


def test_a_node_lost_without_a_spare_goes_on_with_fewer_ranks_then_grows_back(run, tiny_data, tmp_path):
    """FSDP on 2 nodes x 2 ranks; n2 lost: its state resharded from n1's memory (its own shards and the buddy
    copies of n2's) onto n1's 2 ranks, the global batch kept by twice the micro-batches; then 2 nodes again
    (n3 holding nothing: its shards cut from n1's snapshot, sent over the network). Every loss equals a
    resume from the file system's checkpoint of the same step on the same world size."""
    shm = tmp_path / "shm"
    shm.mkdir()
    nodes = TwoNodes(run, tiny_data, shm, nproc=2, settings=FSDP)
    nodes.start("n1", "n2")
    lost_at = nodes.kill_after_snapshot(4, "n1", "n2")
    shutil_rmtree(nodes.node_dir("n2"))

    nodes.start("n1")
    shrunk_at = nodes.kill_after_snapshot(lost_at + 2, "n1")
    shrunk = starts(run)[-1]
    assert shrunk["world_size"] == 2 and shrunk["step"] == lost_at, (shrunk, nodes.output()[-3000:])
    assert shrunk["resumed_from"]["source"] == "snapshot" and shrunk["resumed_from"]["saved_world"] == 4
    assert shrunk["resumed_from"]["own_node"] == 2 and shrunk["resumed_from"]["bytes_moved"] == 0
    assert f"resumed from the snapshot in memory of step {lost_at}, resharded from 4 ranks" in nodes.output()

    nodes.start("n1", "n3")
    assert nodes.wait() == [0, 0], nodes.output()[-4000:]
    grown = starts(run)[-1]
    assert grown["world_size"] == 4 and grown["step"] == shrunk_at, grown
    assert grown["resumed_from"]["saved_world"] == 2 and grown["resumed_from"]["other_node"] == 2
    assert grown["resumed_from"]["bytes_moved"] > 0
    assert run.status() == "complete"

    # The same story through the file system: 4 ranks saving every 2 steps, resumed on 2 from the step n2 was
    # lost at, and that on 4 from the step the shrunk run was stopped at.
    full = Run(tmp_path / "full")
    assert full.run(tiny_data, *FSDP, "checkpoint.every=2", "checkpoint.keep=100", nproc=4) == 0, full.output[-4000:]
    on_two = resumed_from_checkpoint(tmp_path / "on_two", full, lost_at, tiny_data, nproc=2)
    on_four = resumed_from_checkpoint(tmp_path / "on_four", on_two, shrunk_at, tiny_data, nproc=4)
    launches: list[list[dict]] = []
    for record in run.records():
        if record.get("event") == "start":
            launches.append([])
        elif "loss" in record and launches:
            launches[-1].append(record)
    first, second, third = launches[-3:]
    losses = lambda records: {r["step"]: (r["loss"], r["samples_crc"]) for r in records}  # noqa: E731
    assert losses(first) == {s: v for s, v in full.losses().items() if s in losses(first)}
    assert losses(second) == {s: v for s, v in on_two.losses().items() if s in losses(second)}
    assert sorted(losses(second)) == list(range(lost_at + 1, max(losses(second)) + 1)) and max(losses(second)) >= shrunk_at
    assert losses(third) == on_four.losses() and sorted(losses(third)) == list(range(shrunk_at + 1, 13))


def shutil_copytree(source: Path, target: Path) -> None:
    import shutil

    shutil.copytree(source, target)
