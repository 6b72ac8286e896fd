"""Bad data and checkpoints are refused with both values named; a missing checkpoint starts fresh."""

from __future__ import annotations

import json
import shutil

import pytest

SHORT = ("train.steps=3", "optim.warmup_steps=1", "checkpoint.every=3", "log.interval=1")


def test_dataset_that_does_not_fit_the_model_is_refused_with_both_values(run, tiny_data):
    assert run.run(tiny_data, *SHORT, "data.seq_len=64", "model.vocab_size=256", nproc=1) != 0
    assert "seq_len: dataset has 128, training config has 64" in run.output
    assert "vocab_size: dataset tokenizer has 512 ids, model has 256" in run.output
    assert not (run.checkpoints / "latest").exists()


def test_missing_shard_is_refused_by_name(run, tiny_data, tmp_path):
    data = tmp_path / "broken"
    shutil.copytree(tiny_data, data)
    victim = sorted(data.glob("*.tar"))[0]
    victim.unlink()
    assert run.run(data, *SHORT, nproc=1) != 0
    assert f"{victim.name}: missing" in run.output


def test_fresh_start_then_a_checkpoint_of_another_preset_is_refused(run, tiny_data):
    assert run.run(tiny_data, *SHORT, nproc=1) == 0, run.output[-3000:]
    assert "no checkpoint in" in run.output and "starting from step 0" in run.output
    record = [r for r in run.records() if "loss" in r][-1]  # the metrics every interval reports
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "tokens_per_s_per_device", "step_time_s", "data_wait_pct",
            "checkpoint_block_s", "memory_gib", "samples_crc"} <= set(record)
    assert "mfu_pct" not in record  # GPU only
    assert "step 3/3 (elapsed 0:00:" in run.output and ", eta 0:00:00) loss=" in run.output  # progress in the line
    assert "samples_crc" not in run.output  # the checksum is for tools: metrics.jsonl only
    assert list((run.logs / "tensorboard").glob("events.out.tfevents.*"))
    meta_file = run.checkpoints / "step_00000003/train_meta.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "preset": "llama2-7b", "hidden": 4096, "layers": 32}))

    assert run.run(tiny_data, "train.steps=6", "optim.warmup_steps=1", nproc=1) != 0
    assert "was written for a different model or data order (preset: checkpoint has 'llama2-7b', config has 'tiny'" in run.output
    assert "Use a new checkpoint.dir" in run.output


@pytest.mark.parametrize("override, message", [("train.parallelism=tp", "train.parallelism: Input should be 'ddp', 'fsdp' or 'hsdp' (got 'tp')")])
def test_bad_setting_fails_before_any_work(run, tiny_data, override, message):
    assert run.run(tiny_data, override, nproc=1) != 0
    assert message in run.output


def test_async_tensor_parallel_on_cpu_is_refused_with_the_fix(run, tiny_data):
    """Async TP is a GPU-only compiler pass: asked for on CPU, the job stops with exit 2 rather than run without it."""
    code = run.run(tiny_data, "train.parallelism=fsdp", "train.tensor_parallel=2", "train.async_tp=true", nproc=2)
    assert code != 0
    assert "train.async_tp needs GPUs (symmetric memory over NVLink); set train.async_tp: false here" in run.output
