"""Hugging Face export of real DDP, FSDP2 and FSDP x tensor-parallel training checkpoints, checked by
logits; the output folder; the peak memory of the streaming export."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from data_pipeline.shards import read_dataset_meta
from data_pipeline.tokenizer import load_tokenizer
from training.export_hf import ExportError, export, find_checkpoint, main
from training.models import build_model, init_weights, hf_config

from conftest import REPO, Run

STEPS = ("train.steps=4", "checkpoint.every=4", "optim.warmup_steps=1", "train.micro_batch_size=8")


LAYOUTS = {"ddp": (("train.parallelism=ddp",), 2), "fsdp": (("train.parallelism=fsdp",), 2),
           "fsdp_tp": (("train.parallelism=fsdp", "train.tensor_parallel=2"), 4)}  # 2 shards x TP 2


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def trained(request, tiny_data, tmp_path_factory) -> Run:
    """Four steps of the tiny model, saved by DCP in the given layout."""
    layout, nproc = LAYOUTS[request.param]
    run = Run(tmp_path_factory.mktemp(request.param))
    assert run.run(tiny_data, *STEPS, *layout, nproc=nproc) == 0, run.output[-3000:]
    return run


def reference_model(checkpoint) -> torch.nn.Module:
    """The trained weights through another path: PyTorch's own DCP -> torch.save converter, loaded
    strictly into the model training builds."""
    converted = checkpoint.parent / "converted.pt"
    dcp_to_torch_save(checkpoint, converted)
    weights = torch.load(converted, weights_only=True)["model"]
    meta_vocab = weights["model.embed_tokens.weight"].shape[0]
    config = hf_config("tiny", meta_vocab, 128)
    model = build_model(config).to_empty(device="cpu")
    model.load_state_dict(weights, strict=True)
    model.model.rotary_emb = LlamaRotaryEmbedding(config)
    return model.eval()


def test_exported_model_gives_the_trained_models_logits(trained, tiny_data, tmp_path):
    meta = read_dataset_meta(tiny_data)
    out = export(trained.checkpoints, tmp_path / "hf", tokenizer=meta.tokenizer["name"], dtype="float32",
                 expected_sha256=meta.tokenizer["sha256"])
    assert (out / "config.json").is_file() and (out / "model.safetensors.index.json").is_file()
    assert (out / "tokenizer.json").is_file()

    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    reference = reference_model(find_checkpoint(trained.checkpoints))
    ids = torch.randint(0, meta.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
        got = hf(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # Trained, not freshly initialized: the weights moved away from the seed's initialization.
    fresh = build_model(hf.config).to_empty(device="cpu")
    init_weights(fresh, hf.config, torch.device("cpu"), seed=0)
    assert not torch.equal(fresh.lm_head.weight, hf.lm_head.weight)

    # The tokenizer round-trips: the same ids as the one the dataset was tokenized with.
    text = "The quick brown fox jumps over the lazy dog."
    assert AutoTokenizer.from_pretrained(out).encode(text, add_special_tokens=False) == \
        load_tokenizer(meta.tokenizer["name"]).backend.encode(text, add_special_tokens=False).ids


def test_bfloat16_export_is_within_bf16_tolerance(trained, tiny_data, tmp_path):
    meta = read_dataset_meta(tiny_data)
    out = export(trained.checkpoints, tmp_path / "hf", tokenizer=meta.tokenizer["name"], max_shard_size="100KB")
    assert len(list(out.glob("*.safetensors"))) > 1 and (out / "model.safetensors.index.json").is_file()
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"  # the default
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    reference = reference_model(find_checkpoint(trained.checkpoints))
    ids = torch.randint(0, meta.vocab_size, (2, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, reference(input_ids=ids).logits, rtol=0.05, atol=0.05)


def test_cli_refuses_a_folder_without_a_checkpoint_and_a_wrong_tokenizer(trained, tiny_data, tmp_path):
    env = {**trained.env(), "PYTHONPATH": str(REPO / "jobs")}
    empty = tmp_path / "empty"
    empty.mkdir()
    result = subprocess.run([sys.executable, "-m", "training.export_hf", str(empty), "--out", str(tmp_path / "out"),
                             "--dataset", str(tiny_data)], env=env, capture_output=True, text=True)
    assert result.returncode == 2
    assert f"{empty} has no 'latest' file: no complete checkpoint to export" in result.stderr
    with pytest.raises(ExportError, match="is not the one the dataset was tokenized with"):
        export(trained.checkpoints, tmp_path / "out", tokenizer=read_dataset_meta(tiny_data).tokenizer["name"],
               expected_sha256="0" * 64)
    with pytest.raises(ExportError, match=r"step_00000003 is not a complete checkpoint"):
        find_checkpoint(trained.checkpoints, step=3)


def test_export_lands_beside_the_checkpoint_whole_or_not_at_all(trained, tiny_data, tmp_path, capsys):
    """Default folder: <checkpoint dir>/export/step_<N> (on FSx); no partial folder left, a second
    export of the step refused, a failed one leaves nothing."""
    tokenizer = read_dataset_meta(tiny_data).tokenizer["name"]
    checkpoints = tmp_path / "model1"
    shutil.copytree(trained.checkpoints, checkpoints)
    out = export(checkpoints, tokenizer=tokenizer)
    assert out == checkpoints / "export" / find_checkpoint(checkpoints).name
    assert sorted(p.name for p in (checkpoints / "export").iterdir()) == [out.name]
    with pytest.raises(ExportError, match="already exists: that step is exported"):
        export(checkpoints, tokenizer=tokenizer)
    shutil.rmtree(out)
    (find_checkpoint(checkpoints) / "__0_0.distcp").write_bytes(b"truncated")
    with pytest.raises(CheckpointException):  # DCP's own, a BaseException
        export(checkpoints, tokenizer=tokenizer)
    assert list((checkpoints / "export").iterdir()) == []
    assert main([str(checkpoints), "--tokenizer", tokenizer]) == 2  # the command: one error line, no traceback
    assert capsys.readouterr().err.startswith(f"error: the checkpoint in {checkpoints} cannot be read (")


def test_peak_memory_follows_the_largest_tensor_not_the_model(tmp_path):
    """The benchmark's measurement: a synthetic checkpoint 15 times its largest tensor, exported in a
    process of its own; the peak above the interpreter stays within a few largest tensors."""
    out = tmp_path / "export.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.export", "--vocab", "4096", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())["measured"]
    assert run["model_bytes"] > 10 * run["largest_tensor_bytes"]
    assert run["peak_bytes"] < 4 * run["largest_tensor_bytes"] + 32 * 2**20, run
