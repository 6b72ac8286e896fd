"""Parallel layouts on CPU with real gloo processes: FSDP x tensor parallel, FSDP, HSDP, DDP give the same
training; checkpoints move between layouts and world sizes; torch.compile matches eager.

The same global batch (32 sequences) is consumed per step in every layout: the loader interleaves
ranks (data_pipeline.loader), so 4 ranks x 8, or 2 model copies x 8 x 2 micro-batches, read the
same 32 sequences per step. The initial weights do not depend on the layout (training.models).
"""

from __future__ import annotations

import shutil

import pytest
from conftest import Run

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


@pytest.mark.parametrize("saved, loaded", [("fsdp_tp", FSDP), ("fsdp", FSDP_TP)])
def test_checkpoint_of_one_layout_resumes_under_another(layouts, tiny_data, tmp_path, saved, loaded):
    run = resume_from(tmp_path, "resumed", layouts[saved], 4)
    assert run.run(tiny_data, *STEPS, *loaded, nproc=4) == 0, run.output[-4000:]
    assert "resumed from" in run.output
    expected = {s: v for s, v in losses(layouts[saved]).items() if s > 4}
    assert_close(losses(run), expected)


@pytest.mark.parametrize("before, after", [(2, 4), (4, 2)])
def test_resume_on_another_world_size_reshards_and_continues_the_data(layouts, tiny_data, tmp_path, before, after):
    """FSDP2 on ``before`` ranks to step 4, then ``after`` ranks: the same losses as staying on ``before``."""
    full = layouts["fsdp"]
    if before != 4:
        full = Run(tmp_path / "full")
        assert full.run(tiny_data, *STEPS, *FSDP, nproc=before) == 0, full.output[-4000:]
    run = resume_from(tmp_path, "resumed", full, 4)
    assert run.run(tiny_data, *STEPS, *FSDP, nproc=after) == 0, run.output[-4000:]
    assert f"resuming on {after} ranks from a checkpoint of {before} ranks" in run.output
    expected = {s: v for s, v in losses(full).items() if s > 4}
    assert_close(losses(run), expected)


def test_resume_with_another_global_batch_is_refused_before_training(tiny_data, tmp_path, layouts):
    run = resume_from(tmp_path, "resumed", layouts["fsdp"], 4)
    assert run.run(tiny_data, *STEPS, *FSDP, "train.global_batch_size=64", nproc=2) != 0
    assert "global_batch_size: checkpoint has 32, config has 64" in run.output  # the worker exits 2
    assert "step 5/" not in run.output
