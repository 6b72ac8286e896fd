"""The replica-consistency sentinel (training/resilience/replicas.py) on real gloo processes: a bit flipped in one
rank's copy of a parameter (tests/training/sdc_fault.py) stops the run at the next check, naming the
parameter, the rank and its node, before any checkpoint holds it; the rerun resumes from the last
checkpoint (checked at its step) and repeats the uninterrupted run's losses."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import torch
from conftest import SHORT, Run

from training.models.llama import build_model, init_weights, hf_config
from training.resilience.replicas import parameter_sums

SDC_FAULT = Path(__file__).with_name("sdc_fault.py")
HOST = socket.gethostname()


def fault(rank: int, after: int) -> tuple[str, ...]:
    return (str(SDC_FAULT), str(rank), str(after))


def test_equal_copies_sum_equal_and_one_flipped_bit_changes_its_parameter_only():
    config = hf_config("tiny", 512, 128)
    model = build_model(config)
    init_weights(model, config, torch.device("cpu"), 0)
    names, before = parameter_sums(model)
    assert torch.equal(parameter_sums(model)[1], before)
    weight = dict(model.named_parameters())[names[3]]
    with torch.no_grad():
        weight.data.view(torch.int32).view(-1)[7] ^= 1 << 3
    _, after = parameter_sums(model)
    assert (after != before).nonzero().flatten().tolist() == [3]


def test_corrupted_ddp_rank_stops_the_run_before_it_saves_and_the_rerun_continues_exactly(
        run, tiny_data, reference_losses, monkeypatch, tmp_path):
    """Two copies (DDP on 2 ranks): the check after step 6 finds them apart and cannot tell which is wrong."""
    failure = tmp_path / "FAILURE"
    monkeypatch.setenv("TRAIN_FAILURE_FILE", str(failure))
    # Snapshots in memory every 3 steps: the one of step 3 was taken before the flip, and is still discarded.
    snapshots = ("checkpoint.snapshot_every=3", f"checkpoint.snapshot_dir={tmp_path / 'shm'}")
    assert run.run(tiny_data, *SHORT, "train.replica_check_every=2", *snapshots, program=fault(1, 5)) != 0
    assert "sdc_fault: flipped a bit of module.model.embed_tokens.weight on rank 1 after step 5" in run.output
    assert not list((tmp_path / "shm").rglob("rank_*")), "snapshots taken since the copies last agreed must go"
    message = (f"replicas disagree after step 6 (last agreed at step 4) in module.model.embed_tokens.weight; "
               f"suspect (no majority: every copy): rank 0 on {HOST}, rank 1 on {HOST}")
    assert message in run.output, run.output[-3000:]
    assert failure.read_text().startswith(f"sdc: {message}")
    [event] = [r for r in run.records() if r.get("event") == "replica_mismatch"]
    assert event["step"] == 6
    # Nothing saved after the corruption: `latest` is step 4, checked at its step.
    assert (run.checkpoints / "latest").read_text().strip() == "step_00000004"
    assert sorted(p.name for p in run.checkpoints.glob("step_*")) == ["step_00000004"]
    meta = json.loads((run.checkpoints / "step_00000004" / "train_meta.json").read_text())
    assert (meta["replicas_checked"], meta["replicas_agreed_at"]) == (True, 4)

    rerun = Run(run.root)  # the requeue, on healthy GPUs: resumes from step 4
    assert rerun.run(tiny_data, *SHORT, "train.replica_check_every=2", *snapshots) == 0, rerun.output[-3000:]
    assert [r["resumed_from"] for r in rerun.records() if r.get("event") == "start"][-1] == {"source": "checkpoint",
                                                                                           "step": 4}
    assert rerun.losses() == reference_losses  # steps 5-6 again, then on as if nothing had happened


def test_three_copies_agreeing_name_the_fourth(run, tiny_data, monkeypatch, tmp_path):
    """DDP on 4 ranks: the majority's sums are the right ones; only the corrupted rank is named."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # the suspect rank reports its node to the epilog under the job's id
    monkeypatch.setenv("NODE_SUSPECT_DIR", str(tmp_path))
    assert run.run(tiny_data, *SHORT, "train.replica_check_every=2", nproc=4, program=fault(2, 1)) != 0
    assert f"suspect (the minority): rank 2 on {HOST}." in run.output, run.output[-3000:]
    assert "replicas disagree after step 2 (last agreed at step -1)" in run.output
    assert not list(run.checkpoints.glob("step_*"))
    # Only rank 2 wrote it (the others' copies agree): the epilog drains that rank's node with this line.
    assert (tmp_path / "llm-node-suspect.4242").read_text() == (
        "sdc: rank 2: replicas disagree after step 2 (agreed at -1) in module.model.embed_tokens.weight; "
        "suspect (the minority)\n")


def test_hsdp_compares_each_shard_with_its_replica_and_every_rank_stops(run, tiny_data):
    """HSDP 2 replicas x 2 shards: rank 1's shard has one copy, on rank 3; ranks 0 and 2 agree but stop too.
    Every step's first micro-batch replayed (reduced across the replicas at once): bit-exact, no false alarm."""
    hsdp = ("train.parallelism=hsdp", "train.hsdp_shard_size=2", "train.replica_check_every=2", "train.replay_every=1")
    assert run.run(tiny_data, *SHORT, *hsdp, nproc=4, program=fault(1, 5)) != 0
    assert "replay of step" not in run.output
    assert f"suspect (no majority: every copy): rank 1 on {HOST}, rank 3 on {HOST}." in run.output, run.output[-3000:]
    assert "another rank's state is corrupt after step 6: stopping with it" in run.output
    assert (run.checkpoints / "latest").read_text().strip() == "step_00000004"  # checked at 4, then saved
    assert sorted(p.name for p in run.checkpoints.glob("step_*")) == ["step_00000004"]
