"""Hugging Face export of real DDP, FSDP2 and FSDP x tensor-parallel training checkpoints, checked by
logits; every family training builds (Llama 3.1 rope scaling with GQA, a tied embedding, Qwen2's q/k/v
biases, Mistral) saved sharded and checked against the trainer's own logits; the output folder; the
peak memory of the streaming export."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from data_pipeline.shards import read_dataset_meta
from data_pipeline.tokenizer import load_tokenizer
from training.export_hf import ExportError, export, find_checkpoint, main
from training.models.llama import build_model, init_weights, hf_config

from conftest import CONFIG, REPO, Run, torchrun_script

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
    # Each weight is the trained fp32 one rounded to bf16 as torch's .to() rounds it (DCP's chunk by chunk
    # copy into the bf16 tensor converts), every chunk in its place.
    exported = {name: t for shard in out.glob("*.safetensors") for name, t in load_file(shard).items()}
    trained_weights = reference.state_dict()
    assert sorted(exported) == sorted(trained_weights)
    for name, tensor in exported.items():
        assert torch.equal(tensor, trained_weights[name].to(torch.bfloat16)), name


def test_cli_refuses_a_folder_without_a_checkpoint(tiny_data, tmp_path, capsys):
    """The command's main, once, not per layout (``python -m training.export_hf`` runs it: tests/test_cli.py)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty), "--out", str(tmp_path / "out"), "--dataset", str(tiny_data)]) == 2
    assert f"error: {empty} has no 'latest' file: no complete checkpoint to export" in capsys.readouterr().err


def test_export_refuses_a_wrong_tokenizer_and_an_incomplete_step(trained, tiny_data, tmp_path):
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
    """The benchmark's measurement: a synthetic checkpoint 5 times its largest tensor (a 32 MiB embedding),
    exported to bf16 in a process of its own; the peak above the interpreter stays under 2 largest
    tensors (each is read into its bf16 place, half its fp32 size, chunk by chunk; reading it whole
    in fp32 and converting it after, as before, measured 2.8) and under half the model."""
    out = tmp_path / "export.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.export", "--vocab", "16384", "--dtype", "bfloat16",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())["measured"]
    assert run["model_bytes"] > 5 * run["largest_tensor_bytes"] == 5 * 2**25
    assert run["peak_bytes"] < 2 * run["largest_tensor_bytes"] + 16 * 2**20, run
    assert run["peak_bytes"] < run["model_bytes"] / 2, run


# Tiny models of each family, as config.json files named by model.preset (its absolute path). The
# vocabulary is the tiny dataset's, rounded up as training does.
TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 192, "rms_norm_eps": 1e-5}
FAMILIES = {
    # Llama 3.1's rotary scaling (original window 32 < the 128 trained: the low frequencies are scaled) and GQA
    "llama3": ({**TINY, "model_type": "llama", "rope_theta": 500000.0,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 32}},
               ["train.parallelism=fsdp", "train.tensor_parallel=2"]),
    # Llama 3.2 1B/3B: the output projection is the embedding (no tensor parallelism for it)
    "tied": ({**TINY, "model_type": "llama", "num_key_value_heads": 4, "tie_word_embeddings": True},
             ["train.parallelism=fsdp"]),
    "qwen2": ({**TINY, "model_type": "qwen2", "rope_theta": 1000000.0, "use_sliding_window": False,
               "sliding_window": None}, ["train.parallelism=fsdp", "train.tensor_parallel=2"]),
    "mistral": ({**TINY, "model_type": "mistral", "sliding_window": None},
                ["train.parallelism=fsdp", "train.tensor_parallel=2"]),
}

# On 4 gloo processes, per family: the trainer's model (training.train.build, sharded as overrides say)
# with every parameter moved off its initialization (biases and norm gains too: zeros and ones would
# hide a missing one), its logits on a fixed batch, and the trainer's Checkpointer saving it as step 1.
FAMILY_WORKER = r"""
import json, sys, zlib
from pathlib import Path
import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor
from training.parallel import distributed
from training.checkpoints.checkpointer import Checkpointer
from training.dry_run import load_model_config
from training.models.llama import canonical_name, hf_config
from training.models.presets import resolve
from training.train import build

config, families, out = json.loads(sys.argv[1])
d = distributed.init(60)
ids = torch.randint(0, 200, (2, 64), generator=torch.Generator().manual_seed(3))
for name, overrides in families.items():
    preset = f"{out}/{name}/config.json"
    cfg = load_model_config(config, [f"model.preset={preset}", *overrides])
    arch = resolve(preset)
    model_config = hf_config(arch, arch.vocab, 128)
    model, _ = build(cfg, model_config, d, distributed.device_mesh(d, cfg.train))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            g = torch.Generator().manual_seed(zlib.crc32(canonical_name(pname).encode()))
            noise = torch.randn(p.shape, generator=g) * 0.05
            if isinstance(p, DTensor):
                p.to_local().add_(distribute_tensor(noise, p.device_mesh, p.placements, src_data_rank=None).to_local())
            else:
                p.add_(noise)
        logits = model(input_ids=ids).logits
        logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
    identity = {"preset": preset, "vocab_size": arch.vocab, "seq_len": 128, "global_batch_size": 8,
                "layers": arch.layers, "hidden": arch.hidden}
    ckpt = Checkpointer(Path(out) / name / "checkpoints", keep=1, async_save=False, d=d, identity=identity)
    ckpt.save(1, {"model": get_model_state_dict(model), "step": 1}, wait=True)
    ckpt.close()
    if d.is_main:
        torch.save({"ids": ids, "logits": logits}, Path(out) / name / "logits.pt")
distributed.shutdown()
"""


@pytest.fixture(scope="module")
def families(tiny_data, tmp_path_factory):
    """Per family: its folder (config.json, checkpoints/, logits.pt), all saved by one 4-process launch."""
    out = tmp_path_factory.mktemp("families")
    vocab = -(-read_dataset_meta(tiny_data).vocab_size // 64) * 64
    for name, (config, _) in FAMILIES.items():
        (out / name).mkdir()
        (out / name / "config.json").write_text(json.dumps({**config, "vocab_size": vocab}))
    (out / "worker.py").write_text(FAMILY_WORKER)
    overrides = {name: layout for name, (_, layout) in FAMILIES.items()}
    code, output = torchrun_script(out / "worker.py", json.dumps([str(CONFIG), overrides, str(out)]), timeout=300)
    assert code == 0, output[-4000:]
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_exports_to_its_own_transformers_class_with_the_trainers_logits(families, family, tiny_data,
                                                                                      tmp_path):
    meta = read_dataset_meta(tiny_data)
    out = export(families / family / "checkpoints", tmp_path / "hf", tokenizer=meta.tokenizer["name"],
                 dtype="float32", expected_sha256=meta.tokenizer["sha256"])
    config = json.loads((out / "config.json").read_text())
    source = FAMILIES[family][0]
    assert config["model_type"] == source["model_type"] and config["dtype"] == "float32"
    assert config["tie_word_embeddings"] == source.get("tie_word_embeddings", False)
    names = set(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"])
    assert ("lm_head.weight" in names) == (family != "tied")  # a tied head is the embedding, written once
    assert ("model.layers.0.self_attn.k_proj.bias" in names) == (family == "qwen2")

    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == {"llama3": "LlamaForCausalLM", "tied": "LlamaForCausalLM",
                                 "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}[family]
    if family == "tied":
        assert hf.lm_head.weight is hf.model.embed_tokens.weight
    if family == "llama3":
        assert hf.config.rope_parameters["rope_type"] == "llama3"
    saved = torch.load(families / family / "logits.pt")
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=saved["ids"]).logits, saved["logits"], rtol=1e-5, atol=1e-5)


def test_a_preset_config_gone_since_training_is_an_export_error(families, tiny_data, tmp_path):
    """train_meta.json names model.preset as training did: an absolute path must still hold its config.json."""
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(families / "qwen2" / "checkpoints", checkpoints)
    step = find_checkpoint(checkpoints)
    meta = json.loads((step / "train_meta.json").read_text())
    (step / "train_meta.json").write_text(json.dumps({**meta, "preset": str(tmp_path / "gone" / "config.json")}))
    with pytest.raises(ExportError, match=r"names model.preset '.*gone/config.json', which no longer gives an "
                                          r"architecture \(.*no such file"):
        export(checkpoints, tmp_path / "hf", tokenizer=read_dataset_meta(tiny_data).tokenizer["name"])
    assert not (tmp_path / "hf").exists()
