"""Validation loss: the held-out split, every rank's share, logged everywhere, and exact across a resume."""

from __future__ import annotations

import math
import os
import signal

import pytest
from conftest import SHORT, Run
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

EVAL = (*SHORT, "eval.every=4")


def val_records(run) -> list[dict]:
    return [r for r in run.records() if "val_loss" in r]


def val_losses(run) -> dict[int, float]:
    return {r["step"]: r["val_loss"] for r in val_records(run)}


@pytest.fixture(scope="module")
def evaluated(tiny_data, tmp_path_factory) -> Run:
    """An uninterrupted 2-process DDP run of EVAL: what the resumed and the tensor-parallel runs are held to."""
    run = Run(tmp_path_factory.mktemp("eval-reference"))
    assert run.run(tiny_data, *EVAL) == 0, run.output[-4000:]
    return run


def test_validation_loss_is_logged_and_does_not_change_training(evaluated, reference_losses):
    run = evaluated
    records = val_records(run)
    assert [r["step"] for r in records] == [4, 8, 12, 16]
    for r in records:
        assert r["perplexity"] == math.exp(r["val_loss"])
        assert r["val_tokens"] == 2 * 8 * 128 * 2  # 2 ranks x their whole share: 2 batches of 8 x 128 tokens
    assert records[-1]["val_loss"] < records[0]["val_loss"] - 0.5  # it learns what it never trained on
    assert run.losses() == reference_losses  # evaluating is read-only: training is bit for bit the same
    assert f"step 16 val_loss={records[-1]['val_loss']:.4g}" in run.output
    tensorboard = EventAccumulator(str(run.logs / "tensorboard"))
    tensorboard.Reload()
    assert [e.step for e in tensorboard.Scalars("val/val_loss")] == [4, 8, 12, 16]


def test_validation_loss_resumes_exactly(run, tiny_data, evaluated):
    run.start(tiny_data, *EVAL)
    run.wait_for_step(6)
    for pid in run.worker_pids():
        os.kill(pid, signal.SIGUSR1)
    assert run.wait() == 0, run.output[-4000:]
    assert run.status() == "stopped" and max(run.losses()) < 16
    assert run.run(tiny_data, *EVAL) == 0, run.output[-4000:]
    assert "resumed from" in run.output
    assert val_losses(run) == val_losses(evaluated)


def test_evaluation_without_a_validation_split_fails_naming_the_fix(run, tiny_data, tmp_path):
    assert run.run(tiny_data, *EVAL, f"eval.path={tmp_path / 'missing'}", nproc=1) != 0
    assert "eval.every is 4 but there is no validation split" in run.output
    assert "Tokenize with --val-fraction" in run.output


def test_tensor_parallel_ranks_score_their_tokens_once(run, tiny_data, evaluated):
    """The 2 ranks of one tensor-parallel copy read the same validation batches: counted once, the same loss as
    2 DDP ranks, each a copy of its own, scoring half of them each."""
    assert run.run(tiny_data, *EVAL, "train.parallelism=fsdp", "train.tensor_parallel=2") == 0, run.output[-4000:]
    tp, ddp = (val_records(r) for r in (run, evaluated))
    assert [r["val_tokens"] for r in tp] == [r["val_tokens"] for r in ddp] == [2 * 8 * 128 * 2] * 4
    for a, b in zip(tp, ddp):
        assert math.isclose(a["val_loss"], b["val_loss"], rel_tol=2e-4), (a, b)
