"""Corruption checks for every layout, on real gloo processes (tests/training/corruption_faults.py injects the
fault): optimizer state flipped at rest before a save, a TP-replicated norm weight flipped under FSDP x TP,
and a transient compute error caught by the sampled replay; none of them fires on a clean run. The at-rest
digest on its own, in one process: a flip after a step, and one during the next forward and backward."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest
import torch
from conftest import SHORT

from training.checkpoints.checkpointer import Checkpointer
from training.components.optim import build_optimizer
from training.config import OptimConfig
from training.models.llama import build_model, hf_config, init_weights
from training.resilience.replicas import AtRest, ReplicaMismatch

FAULTS = Path(__file__).with_name("corruption_faults.py")
HOST = socket.gethostname()


def fault(*args) -> tuple[str, ...]:
    return (str(FAULTS), *map(str, args))


def test_exp_avg_flipped_before_a_save_is_caught_at_rest_and_that_step_is_not_written(run, tiny_data):
    """FSDP on 2 ranks keeps one copy of each shard: the at-rest digest finds the flip. The replay of every
    step before it agrees bit for bit (no false alarm)."""
    assert run.run(tiny_data, *SHORT, "train.parallelism=fsdp", "train.replay_every=1",
                   program=fault("optim", 1, 8)) != 0
    assert "corruption_faults: flipped a bit of model.embed_tokens.weight:exp_avg on rank 1 after step 8" in run.output
    assert (f"state changed at rest on rank 1 on {HOST}: model.embed_tokens.weight:exp_avg differ from what the "
            f"optimizer wrote, after step 8 (found at step 8, before its save)") in run.output, run.output[-3000:]
    assert "replay of step" not in run.output
    # Step 8 was never written: `latest` is step 4, verified at its step.
    assert (run.checkpoints / "latest").read_text().strip() == "step_00000004"
    assert sorted(p.name for p in run.checkpoints.glob("step_*")) == ["step_00000004"]
    assert json.loads((run.checkpoints / "step_00000004/train_meta.json").read_text())["verified"] is True


def test_a_flipped_norm_weight_under_fsdp_x_tp_is_caught_by_its_tp_group(run, tiny_data):
    """Model7's layout at 2 shards x TP 2: every rank of a TP group holds the same final-norm weight shard."""
    layout = ("train.parallelism=fsdp", "train.tensor_parallel=2", "train.replica_check_every=2", "train.replay_every=1")
    assert run.run(tiny_data, *SHORT, *layout, nproc=4, program=fault("param", 1, 5, "model.norm.weight")) != 0
    assert "corruption_faults: flipped a bit of model.norm.weight on rank 1 after step 5" in run.output
    assert ("tensor-parallel copies disagree after step 6 (last agreed at step 4) in model.norm.weight; suspect "
            f"(no majority: every copy): rank 0 on {HOST}, rank 1 on {HOST}.") in run.output, run.output[-3000:]
    assert "replay of step" not in run.output  # six replayed steps under TP, each bit-exact
    assert (run.checkpoints / "latest").read_text().strip() == "step_00000004"
    assert sorted(p.name for p in run.checkpoints.glob("step_*")) == ["step_00000004"]


def test_a_transient_compute_error_is_caught_by_the_replay_within_its_interval(run, tiny_data, reference_losses):
    """DDP on 2 ranks, replay every 4 steps: from step 5 on, rank 1 computes one activation wrong in every
    other forward pass; the replay of step 8 (its first run or its second is perturbed, not both) names
    rank 1 before the optimizer step. The replay of step 4 agreed and left training exactly as without it."""
    assert run.run(tiny_data, *SHORT, "train.replay_every=4", program=fault("compute", 1, 5, 2)) != 0
    assert "corruption_faults: perturbed an activation on rank 1 in step 5" in run.output
    assert (f"replay of step 8's first micro-batch differs from its first run: its loss or activation gradients "
            f"differ on rank 1 on {HOST}.") in run.output, run.output[-3000:]
    assert [r["step"] for r in run.records() if r.get("event") == "replica_mismatch"] == [7]
    assert sorted(p.name for p in run.checkpoints.glob("step_*")) == ["step_00000004"]
    losses = run.losses()
    assert {s: losses[s] for s in range(1, 5)} == {s: reference_losses[s] for s in range(1, 5)}


def trained(steps: int = 2):
    """The tiny model and its AdamW after ``steps`` steps, its state digested after each (as the trainer does)."""
    config = hf_config("tiny", 512, 128)
    model = build_model(config)
    init_weights(model, config, torch.device("cpu"), 0)
    optimizer = build_optimizer(model, OptimConfig())
    at_rest = AtRest(model, optimizer, rank=3, host="gpu-7")
    for step in range(1, steps + 1):
        at_rest.before_step()
        model(input_ids=torch.randint(0, 512, (2, 16))).logits.square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        at_rest.record(step)
    return model, optimizer, at_rest


def flip_exp_avg(model, optimizer) -> None:
    words = optimizer.state[model.model.norm.weight]["exp_avg"].view(torch.int32)
    words[0] ^= 1 << 20


def test_state_at_rest_passes_untouched_and_names_a_flip_after_the_step():
    model, optimizer, at_rest = trained()
    at_rest.check(2)  # untouched since the step: nothing to report
    flip_exp_avg(model, optimizer)
    with pytest.raises(ReplicaMismatch, match=r"state changed at rest on rank 3 on gpu-7: model.norm.weight:exp_avg "
                                              r"differ from what the optimizer wrote, after step 2 \(found at step 2"):
        at_rest.check(2)


def test_a_flip_during_forward_and_backward_is_kept_until_the_check():
    """Flipped before step 3's optimizer step: that step writes over it, yet the next check still names it."""
    model, optimizer, at_rest = trained()
    flip_exp_avg(model, optimizer)
    at_rest.before_step()
    optimizer.step()  # the corrupted moment is read and a new state written
    at_rest.record(3)
    with pytest.raises(ReplicaMismatch, match=r"model.norm.weight:exp_avg differ from what the optimizer wrote, "
                                              r"between optimizer steps 1 and 3, before one read it") as caught:
        at_rest.check(3)
    assert caught.value.suspects == (3,)
    at_rest.check(3)  # reported once; the state since is as the optimizer wrote it


def test_a_resume_from_an_unverified_checkpoint_says_so(tmp_path, d, caplog):
    ckpt = Checkpointer(tmp_path, keep=5, async_save=False, d=d, identity={"preset": "tiny"})
    ckpt.save(10, {"w": torch.ones(4), "step": 10}, meta={"verified": True})
    ckpt.close()
    with caplog.at_level(logging.WARNING):
        assert ckpt.load({"w": torch.zeros(4), "step": 0}) == 10
    assert "not verified" not in caplog.text
    ckpt = Checkpointer(tmp_path, keep=5, async_save=False, d=d, identity={"preset": "tiny"})
    ckpt.save(20, {"w": torch.ones(4), "step": 20}, meta={"replicas_checked": False})
    ckpt.close()
    with caplog.at_level(logging.WARNING):
        assert ckpt.load({"w": torch.zeros(4), "step": 0}) == 20
    assert "step_00000020 is not verified" in caplog.text
