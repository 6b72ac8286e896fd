"""Parallel layouts on CPU with real gloo processes: FSDP x tensor parallel, FSDP, HSDP, DDP give the same
training; checkpoints move between layouts and world sizes; HSDP checkpoints are read and written by
one replica; torch.compile matches eager.

The same global batch (32 sequences) is consumed per step in every layout: the loader interleaves
ranks (data_pipeline.loader), so 4 ranks x 8, or 2 model copies x 8 x 2 micro-batches, read the
same 32 sequences per step. The initial weights do not depend on the layout (training.models.llama).
"""

from __future__ import annotations

import json
import re
import shutil
from math import prod
from pathlib import Path

import pytest
from conftest import Run
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

STEPS = ("train.steps=8", "checkpoint.every=4", "log.interval=1", "train.micro_batch_size=8",
         "optim.warmup_steps=2", "data.num_workers=0")
FSDP = ("train.parallelism=fsdp",)
FSDP_TP = ("train.parallelism=fsdp", "train.tensor_parallel=2")
# model7's form: sequence-parallel TP with 1 layer in 2 recomputed (the tiny model has 2 layers)
FSDP_TP_SELECTIVE = (*FSDP_TP, "train.activation_checkpointing=true", "train.activation_checkpointing_every=2")
DDP = ("train.parallelism=ddp",)
HSDP = ("train.parallelism=hsdp", "train.hsdp_shard_size=2")  # 2 replicas x 2 shards
# fp32 on CPU: layouts sum the same numbers in different orders (gloo all-reduce vs reduce-scatter,
# a row-parallel matmul's two partial sums), ~1e-7 relative per operation, grown by 8 Adam steps.
RTOL = 2e-4


def losses(run: Run) -> dict[int, float]:
    return {step: loss for step, (loss, _) in run.losses().items()}


def assert_close(a: dict[int, float], b: dict[int, float]):
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=RTOL), (step, a[step], b[step])


def resume_from(tmp_path, name: str, source: Run, step: int) -> Run:
    """A run whose checkpoint folder holds only ``source``'s checkpoint of ``step``."""
    run = Run(tmp_path / name)
    run.checkpoints.mkdir(parents=True)
    folder = f"step_{step:08d}"
    shutil.copytree(source.checkpoints / folder, run.checkpoints / folder)
    (run.checkpoints / "latest").write_text(folder + "\n")
    return run


@pytest.fixture(scope="module")
def layouts(tiny_data, tmp_path_factory) -> dict[str, Run]:
    """8 steps of each layout on 4 processes, checkpoints at steps 4 and 8."""
    runs = {}
    for name, layout in (("fsdp_tp", FSDP_TP), ("fsdp", FSDP), ("ddp", DDP), ("hsdp", HSDP),
                         ("fsdp_tp_selective", FSDP_TP_SELECTIVE)):
        run = Run(tmp_path_factory.mktemp(name))
        assert run.run(tiny_data, *STEPS, *layout, nproc=4) == 0, run.output[-4000:]
        runs[name] = run
    return runs


def test_fsdp_x_tensor_parallel_and_hsdp_match_fsdp_and_ddp(layouts):
    tp, fsdp, ddp, hsdp = (losses(layouts[name]) for name in ("fsdp_tp", "fsdp", "ddp", "hsdp"))
    assert sorted(tp) == list(range(1, 9)) and tp[8] < tp[1] - 0.5  # it learns
    assert_close(tp, fsdp)
    assert_close(tp, ddp)
    assert_close(hsdp, fsdp)
    assert_close(losses(layouts["fsdp_tp_selective"]), fsdp)
    assert "fsdp x tensor parallel 2 over 4 ranks" in layouts["fsdp_tp"].output
    # one copy of each shard: no copies to compare, yet every layout's checkpoints are verified, by the state at rest
    # (training/resilience/replicas.py); the layouts with copies record when those last agreed
    for name, run in layouts.items():
        meta = json.loads((run.checkpoints / "step_00000008/train_meta.json").read_text())
        assert meta["verified"] is True, (name, meta)
        assert meta["replicas_checked"] is (name != "fsdp"), (name, meta)


@pytest.mark.parametrize("saved, loaded, nproc", [("fsdp_tp", FSDP, 4), ("fsdp", FSDP_TP, 4),
                                                   ("hsdp", FSDP, 2), ("fsdp", HSDP, 4)])
def test_checkpoint_of_one_layout_resumes_under_another(layouts, tiny_data, tmp_path, saved, loaded, nproc):
    """HSDP's checkpoint holds one replica's copy: FSDP on 2 ranks reshards it; HSDP's replica 0 reshards FSDP's."""
    run = resume_from(tmp_path, "resumed", layouts[saved], 4)
    assert run.run(tiny_data, *STEPS, *loaded, nproc=nproc) == 0, run.output[-4000:]
    assert "resumed from" in run.output
    if nproc != 4:
        assert f"resuming on {nproc} ranks from a checkpoint of 4 ranks" in run.output
    expected = {s: v for s, v in losses(layouts[saved]).items() if s > 4}
    assert_close(losses(run), expected)


@pytest.fixture(scope="module")
def fsdp_on_two(layouts, tiny_data, tmp_path_factory) -> Run:
    """FSDP's checkpoint of step 4 (4 ranks) resumed on 2 ranks, which save at every step from there."""
    run = resume_from(tmp_path_factory.mktemp("fsdp_on_two"), "resumed", layouts["fsdp"], 4)
    assert run.run(tiny_data, *STEPS, *FSDP, "checkpoint.every=1", "checkpoint.keep=4", nproc=2) == 0, \
        run.output[-4000:]
    return run


@pytest.mark.parametrize("before, after", [(2, 4), (4, 2)])
def test_resume_on_another_world_size_reshards_and_continues_the_data(layouts, fsdp_on_two, tiny_data, tmp_path,
                                                                      before, after):
    """FSDP2 on 4 ranks to step 4, then 2 ranks (``fsdp_on_two``); those 2 ranks' checkpoint of step 5 then resumed
    on 4 ranks: the same losses as staying on ``before`` ranks."""
    if before == 4:
        full, run, at = layouts["fsdp"], fsdp_on_two, 4
    else:
        full, at = fsdp_on_two, 5
        run = resume_from(tmp_path, "resumed", full, at)
        assert run.run(tiny_data, *STEPS, *FSDP, nproc=after) == 0, run.output[-4000:]
    assert f"resuming on {after} ranks from a checkpoint of {before} ranks" in run.output
    expected = {s: v for s, v in losses(full).items() if s > at}
    assert sorted(expected) == list(range(at + 1, 9))
    assert_close(losses(run), expected)


def test_resume_with_another_global_batch_is_refused_before_training(tiny_data, tmp_path, layouts):
    run = resume_from(tmp_path, "resumed", layouts["fsdp"], 4)
    assert run.run(tiny_data, *STEPS, *FSDP, "train.global_batch_size=64", nproc=2) != 0
    assert "global_batch_size: checkpoint has 32, config has 64" in run.output  # the worker exits 2
    assert "step 5/" not in run.output


# --- HSDP: one replica reads and writes the shards ------------------------------------------------
CHECKPOINT_IO = Path(__file__).with_name("checkpoint_io.py")  # the trainer, recording its checkpoint I/O
MODEL_OPTIM = ("model.", "optim.")
REPLICA_0, REPLICA_1 = (0, 1), (2, 3)  # 2 replicas x 2 shards: rank 2 holds rank 0's shard, rank 3 rank 1's


def writer(relative_path: str) -> int:
    """The rank that wrote a DCP file (``__<rank>_<n>.distcp``)."""
    return int(re.fullmatch(r"__(\d+)_\d+\.distcp", relative_path).group(1))


def test_hsdp_checkpoint_holds_each_chunk_once_written_by_replica_0(layouts):
    for step in (4, 8):  # an asynchronous save and the final synchronous one
        folder = layouts["hsdp"].checkpoints / f"step_{step:08d}"
        meta = FileSystemReader(folder).read_metadata()
        tensors = {fqn: md for fqn, md in meta.state_dict_metadata.items()
                   if fqn.startswith(MODEL_OPTIM) and isinstance(md, TensorStorageMetadata)}
        assert any(".exp_avg_sq" in fqn for fqn in tensors) and len(tensors) > 20
        for fqn, md in tensors.items():  # the chunks tile the tensor: every element once
            assert sum(prod(chunk.sizes) for chunk in md.chunks) == prod(md.size), fqn
        writers = {index.fqn: writer(info.relative_path) for index, info in meta.storage_data.items()}
        assert {writers[fqn] for fqn in writers if fqn.startswith(MODEL_OPTIM)} <= set(REPLICA_0)
        for rank in range(4):  # every rank's own items, each written by that rank
            own = {w for fqn, w in writers.items() if fqn.startswith(f"rank{rank}.")}
            assert own == {rank}, (rank, own)
        # Replica 1 wrote its RNG state, loader position and step, nothing else.
        assert {fqn.split(".")[0] for fqn, w in writers.items() if w in REPLICA_1} <= {"rank2", "rank3", "step"}


@pytest.fixture(scope="module")
def hsdp_resumed(layouts, tiny_data, tmp_path_factory) -> tuple[Run, list[dict]]:
    """The HSDP run resumed from its checkpoints, the newest one corrupt on one replica-0 rank, with its I/O recorded.

    Rank 1's file of step 8 (its shard) is truncated: only rank 1 fails to read, and every rank must
    fall back to step 4 together. Checkpoints every 2 steps: an asynchronous save at 6, a final one at 8.
    """
    full = layouts["hsdp"]
    run = resume_from(tmp_path_factory.mktemp("hsdp_resumed"), "resumed", full, 4)
    shutil.copytree(full.checkpoints / "step_00000008", run.checkpoints / "step_00000008")
    (run.checkpoints / "latest").write_text("step_00000008\n")
    shard = run.checkpoints / "step_00000008/__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    assert run.run(tiny_data, *STEPS, *HSDP, "checkpoint.every=2", nproc=4, program=(str(CHECKPOINT_IO),)) == 0, \
        run.output[-4000:]
    return run, [json.loads((run.root / f"logs/checkpoint_io/rank{r}.json").read_text()) for r in range(4)]


def test_hsdp_resume_falls_back_together_and_continues_exactly(layouts, hsdp_resumed):
    run, _ = hsdp_resumed
    assert "step_00000008 could not be read" in run.output and "resumed from" in run.output
    assert list(run.checkpoints.glob("unreadable_step_00000008_*"))
    expected = {s: v for s, v in layouts["hsdp"].losses().items() if s > 4}
    assert run.losses() == expected and sorted(expected) == [5, 6, 7, 8]  # bit for bit, and the same samples


def test_hsdp_resume_reads_each_shard_once_then_replica_1_has_replica_0s_state(layouts, hsdp_resumed):
    run, io = hsdp_resumed
    reads = [rank["reads"]["step_00000004"] for rank in io]
    for rank in REPLICA_1:  # its own items and step, no model or optimizer data
        assert {fqn.split(".")[0] for fqn, _, _ in reads[rank]} == {f"rank{rank}", "step"}, reads[rank]
    for rank in REPLICA_0:
        assert {fqn for fqn, _, _ in reads[rank]} >= {"step", f"rank{rank}.rng.cpu"}
    # Replica 0's two ranks read every chunk of the sharded tensors once between them (Adam's step
    # counters, scalars that every shard holds, aside).
    meta = FileSystemReader(layouts["hsdp"].checkpoints / "step_00000004").read_metadata()  # pruned in ``run``
    sharded = {fqn for fqn, md in meta.state_dict_metadata.items()
               if fqn.startswith(MODEL_OPTIM) and isinstance(md, TensorStorageMetadata) and md.size}
    on_disk = sorted((index.fqn, info.length) for index, info in meta.storage_data.items() if index.fqn in sharded)
    read = sorted((fqn, size) for rank in REPLICA_0 for fqn, size, _ in reads[rank] if fqn in sharded)
    assert read == on_disk and len(on_disk) > 40
    # ... and the broadcast gave each replica-1 rank the state of the replica-0 rank with the same shard.
    assert io[2]["resumed"] == io[0]["resumed"] and io[3]["resumed"] == io[1]["resumed"]
    assert io[0]["resumed"]["model"] != io[1]["resumed"]["model"]  # two different shards
    assert "sent from replica 0 to the other 1 replica(s)" in run.output


def test_hsdp_save_stages_one_copy_and_sizes_it_once(hsdp_resumed):
    run, io = hsdp_resumed
    assert [save["step"] for save in io[0]["saves"]] == [6, 8]
    for rank in REPLICA_1:  # only its RNG state: nothing big to stage or write
        assert all(save["tensor_bytes"] < 16 * 1024 for save in io[rank]["saves"]), io[rank]["saves"]
    for rank in REPLICA_0:
        assert all(save["tensor_bytes"] > 100 * 1024 for save in io[rank]["saves"]), io[rank]["saves"]
    # The free-space check counts the checkpoint's tensors once, not once per replica (2x here): the
    # same bytes as the checkpoint holds, but for the other ranks' RNG states.
    meta = FileSystemReader(run.checkpoints / "step_00000008").read_metadata()
    data = sum(prod(md.size) * md.properties.dtype.itemsize for md in meta.state_dict_metadata.values()
               if isinstance(md, TensorStorageMetadata))
    assert len(io[0]["sized"]) == 2 and abs(io[0]["sized"][-1] - data) < 0.01 * data, (io[0]["sized"], data)
