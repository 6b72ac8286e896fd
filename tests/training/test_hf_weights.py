"""Released weights (training.models.hf_weights, model.init_from) land in every layout as transformers reads them.

Tiny checkpoints of each supported family are made here (transformers' own classes, seeded, fp32,
``save_pretrained``): Llama 3.1 (rope_scaling llama3, rope_theta 500000, grouped-query attention),
Llama 3.2 (tied embeddings), Qwen2 (q/k/v biases) and Mistral (sliding_window null), the last one
sharded into several files with a model.safetensors.index.json. One torchrun of 4 gloo ranks imports
each into DDP 4, FSDP 4, HSDP 2 x 2 and FSDP 2 x TP 2 (tied: no TP, which the config refuses), with
``model.preset`` the checkpoint's folder; the first forward's loss on a fixed batch must be the one
transformers' ``from_pretrained`` model computes, and each rank must read only its part.

Widths split unevenly (FFN 90: TP 45 + 45, then FSDP 23 + 22; vocab 250: FSDP 4 gives 63, 63, 63, 61).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import CONFIG, torchrun_script
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

from training.config import ConfigError
from training.dry_run import load_model_config
from training.models.hf_weights import WeightsError, load
from training.models.llama import build_model, hf_config, init_weights
from training.models.presets import resolve

SEQ = 32
COMMON = dict(hidden_size=48, intermediate_size=90, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
              head_dim=8, max_position_embeddings=64)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
# family -> (model_type, its options, save_pretrained's max_shard_size or None: one file)
FAMILIES = {
    # vocab 512: the tiny dataset's tokenizer, so the trainer test can start from this one
    "llama3.1": ("llama", dict(vocab_size=512, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE), None),
    "llama3.2": ("llama", dict(vocab_size=250, rope_theta=500000.0, tie_word_embeddings=True), None),
    "qwen2": ("qwen2", dict(vocab_size=250, use_sliding_window=False), None),
    "mistral": ("mistral", dict(vocab_size=250, sliding_window=None), "40KB"),
}
LAYOUTS = {"ddp": ["train.parallelism=ddp"], "fsdp": ["train.parallelism=fsdp"],
           "hsdp": ["train.parallelism=hsdp", "train.hsdp_shard_size=2"],
           "fsdp_tp": ["train.parallelism=fsdp", "train.tensor_parallel=2"]}


def make_checkpoint(folder: Path, family: str, **changes) -> Path:
    """A released-style checkpoint of ``family``: transformers' model, seeded, fp32 safetensors."""
    model_type, options, shard = FAMILIES[family]
    config = AutoConfig.for_model(model_type, **{**COMMON, "tie_word_embeddings": False, **options,
                                                 **changes})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # transformers starts biases at 0: make them count
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder, safe_serialization=True, **({"max_shard_size": shard} if shard else {}))
    return folder


def batch(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, SEQ + 1), generator=torch.Generator().manual_seed(1))


def transformers_loss(folder: Path) -> float:
    """The loss transformers' own model, read by from_pretrained, computes on ``batch``."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokens = batch(model.config.vocab_size)
    with torch.no_grad():
        return model(input_ids=tokens, labels=tokens).loss.item()


def tensor_bytes(folder: Path) -> dict[str, int]:
    """Each stored tensor's bytes."""
    sizes = {}
    for file in folder.glob("*.safetensors"):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                numel = 1
                for n in sl.get_shape():
                    numel *= n
                sizes[name] = numel * 4  # fp32
    return sizes


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("released")
    return {family: make_checkpoint(root / family, family) for family in FAMILIES}


WORKER = r"""
import json, sys, time, torch
from training.parallel import distributed
from training.dry_run import load_model_config
from training.models.hf_weights import load
from training.models.llama import compute_loss, hf_config
from training.models.presets import resolve
from training.train import build

folders, layouts, config, seq, out = json.loads(sys.argv[1])
d = distributed.init(60)
result = {}
for family, folder in folders.items():
    arch = resolve(folder)
    tokens = torch.load(f"{out}/batch_{family}.pt")
    for layout, overrides in layouts.items():
        if arch.tied_embeddings and "train.tensor_parallel=2" in overrides:
            continue  # refused by the config (test_tied_embeddings_refuse_tensor_parallel)
        cfg = load_model_config(config, [*overrides, f"model.preset={folder}"])
        model, _ = build(cfg, hf_config(arch, arch.vocab, seq), d, distributed.device_mesh(d, cfg.train))
        start = time.process_time()
        source = load(model, folder, arch, folder)
        load_cpu_s = time.process_time() - start
        with torch.no_grad(), distributed.loss_parallel(cfg.train):
            loss = compute_loss(model, tokens[:, :-1], tokens[:, 1:]).item()
        result[f"{family}/{layout}"] = {"loss": loss, "bytes": source["bytes_read_by_rank"], "load_cpu_s": load_cpu_s,
                                        "files": source["files"]}
        del model
json.dump(result, open(f"{out}/rank{d.rank}.json", "w"))
distributed.shutdown()
"""


@pytest.fixture(scope="module")
def imported(checkpoints, tmp_path_factory) -> list[dict]:
    """Per rank: {"family/layout": {loss, bytes, load_cpu_s, files}}."""
    out = tmp_path_factory.mktemp("import")
    for family, folder in checkpoints.items():
        torch.save(batch(resolve(str(folder)).vocab), out / f"batch_{family}.pt")
    (out / "worker.py").write_text(WORKER)
    folders = {family: str(folder) for family, folder in checkpoints.items()}
    code, output = torchrun_script(out / "worker.py", json.dumps([folders, LAYOUTS, str(CONFIG), SEQ, str(out)]),
                                   timeout=300)
    assert code == 0, output[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]


def runs(family: str) -> list[str]:
    return [layout for layout in LAYOUTS if not (family == "llama3.2" and layout == "fsdp_tp")]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_layout_computes_transformers_loss(checkpoints, imported, family):
    expected = transformers_loss(checkpoints[family])
    for layout in runs(family):
        for rank in imported:
            assert rank[f"{family}/{layout}"]["loss"] == pytest.approx(expected, abs=1e-5), (layout, expected)


def test_the_checkpoints_are_what_they_claim(checkpoints):
    """What the test above covers: rope llama3, GQA, tied, biases, sliding_window null, several files."""
    archs = {family: resolve(str(folder)) for family, folder in checkpoints.items()}
    assert dict(archs["llama3.1"].rope_scaling)["rope_type"] == "llama3" and archs["llama3.1"].rope_theta == 500000
    assert all(a.kv_heads == 2 and a.heads == 6 for a in archs.values())
    assert archs["llama3.2"].tied_embeddings and "lm_head.weight" not in tensor_bytes(checkpoints["llama3.2"])
    assert archs["qwen2"].qkv_bias and "model.layers.0.self_attn.q_proj.bias" in tensor_bytes(checkpoints["qwen2"])
    assert json.loads((checkpoints["mistral"] / "config.json").read_text())["sliding_window"] is None
    assert (checkpoints["mistral"] / "model.safetensors.index.json").is_file()
    assert len(list(checkpoints["mistral"].glob("*.safetensors"))) > 2


def test_tied_embeddings_refuse_tensor_parallel(checkpoints):
    with pytest.raises(ConfigError, match="ties its output projection"):
        load_model_config(CONFIG, ["train.parallelism=fsdp", "train.tensor_parallel=2",
                                   f"model.preset={checkpoints['llama3.2']}"])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_rank_reads_its_part(checkpoints, imported, family):
    """FSDP 4 and FSDP 2 x TP 2: about a quarter each, DDP the whole, HSDP 2 x 2 half; together, the
    checkpoint once per copy of each shard (TP ranks share the embedding and the norms: both read them)."""
    sizes = tensor_bytes(checkpoints[family])
    total = sum(sizes.values())
    read = {layout: [rank[f"{family}/{layout}"]["bytes"] for rank in imported] for layout in runs(family)}
    assert read["ddp"] == [total] * 4
    assert sum(read["fsdp"]) == total and all(0.2 < b / total < 0.3 for b in read["fsdp"]), read["fsdp"]
    assert sum(read["hsdp"]) == 2 * total and all(0.45 < b / total < 0.55 for b in read["hsdp"]), read["hsdp"]
    if "fsdp_tp" in read:
        # not split by TP: the embedding (FSDP only) and the norms (sequence parallel: replicated)
        whole = sum(b for name, b in sizes.items() if name.endswith("norm.weight") or "embed_tokens" in name)
        assert sum(read["fsdp_tp"]) == total + whole, (read["fsdp_tp"], total, whole)
        assert all(0.2 < b / total < 0.25 + 0.5 * whole / total for b in read["fsdp_tp"]), read["fsdp_tp"]


# Bad inputs: one process, no distribution. The error must name what is wrong.

def plain_model(folder: Path):
    arch = resolve(str(folder))
    config = hf_config(arch, arch.vocab, SEQ)
    model = build_model(config)
    init_weights(model, config, torch.device("cpu"), seed=0)
    return model, arch


def rewrite(folder: Path, tmp_path: Path, edit) -> Path:
    """A copy of the one-file checkpoint ``folder`` whose tensors ``edit`` changed (a dict, in place)."""
    copy = tmp_path / "edited"
    copy.mkdir()
    (copy / "config.json").write_text((folder / "config.json").read_text())
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    edit(tensors)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    return copy


def test_a_plain_model_loads_the_checkpoint_exactly(checkpoints):
    folder = checkpoints["qwen2"]
    model, arch = plain_model(folder)
    source = load(model, folder, arch, str(folder))
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        for name, p in model.named_parameters():
            assert torch.equal(p.detach(), f.get_tensor(name)), name
    assert source["bytes_read_by_rank"] == sum(tensor_bytes(folder).values())
    assert source["files"] == {"model.safetensors": (folder / "model.safetensors").stat().st_size}
    assert len(source["config_sha256"]) == 64 and source["path"] == str(folder)


def test_wrapped_layers_load_by_the_model_s_own_names(checkpoints):
    """Activation checkpointing (and DDP, torch.compile) add parts to parameter names; the checkpoint has none."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    folder = checkpoints["llama3.1"]
    model, arch = plain_model(folder)
    for i, layer in enumerate(model.model.layers):
        model.model.layers[i] = checkpoint_wrapper(layer)
    assert "_checkpoint_wrapped_module" in next(n for n, _ in model.named_parameters() if ".layers." in n)
    load(model, folder, arch, str(folder))
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        layer = model.model.layers[1]._checkpoint_wrapped_module
        assert torch.equal(layer.mlp.down_proj.weight.detach(), f.get_tensor("model.layers.1.mlp.down_proj.weight"))


def test_a_tied_model_stays_tied_and_takes_the_table(checkpoints):
    folder = checkpoints["llama3.2"]
    model, arch = plain_model(folder)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    load(model, folder, arch, str(folder))
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        assert torch.equal(model.lm_head.weight.detach(), f.get_tensor("model.embed_tokens.weight"))


def test_a_missing_tensor_is_named(checkpoints, tmp_path):
    bad = rewrite(checkpoints["qwen2"], tmp_path, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    model, arch = plain_model(bad)
    with pytest.raises(WeightsError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias is missing"):
        load(model, bad, arch, str(bad))


def test_a_wrong_shape_is_named(checkpoints, tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    bad = rewrite(checkpoints["qwen2"], tmp_path, lambda t: t.update({name: t[name][:-1].clone()}))
    model, arch = plain_model(bad)
    with pytest.raises(WeightsError, match=rf"{name} has shape \[89, 48\], the model \[90, 48\]"):
        load(model, bad, arch, str(bad))


def test_a_tensor_the_model_lacks_is_named(checkpoints, tmp_path):
    bad = rewrite(checkpoints["qwen2"], tmp_path, lambda t: t.update({"model.extra.weight": torch.zeros(2)}))
    model, arch = plain_model(bad)
    with pytest.raises(WeightsError, match=r"model\.extra\.weight is not in the model"):
        load(model, bad, arch, str(bad))


def test_a_config_other_than_the_preset_names_the_field(checkpoints, tmp_path):
    """model.preset a shipped or other config, init_from a checkpoint of other widths: refused before any read."""
    other = make_checkpoint(tmp_path / "other", "qwen2", num_key_value_heads=3)
    model, arch = plain_model(checkpoints["qwen2"])
    with pytest.raises(WeightsError, match=r"kv_heads: 2 vs 3.*set model\.preset to"):
        load(model, other, arch, str(checkpoints["qwen2"]))


def test_a_folder_without_safetensors_says_so(checkpoints, tmp_path):
    (tmp_path / "config.json").write_text((checkpoints["qwen2"] / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    model, arch = plain_model(checkpoints["qwen2"])
    with pytest.raises(WeightsError, match=r"holds no \*\.safetensors"):
        load(model, tmp_path, arch, str(checkpoints["qwen2"]))


# The trainer: model.init_from starts a run, saved as step 0; a restart resumes and never reads it again.

TRAIN = ("train.parallelism=fsdp", "train.steps=6", "checkpoint.every=3", "checkpoint.keep=10", "log.interval=1",
         "train.micro_batch_size=8", "optim.warmup_steps=2", "eval.every=0")


def first_batch_loss(folder: Path, data: Path, ranks: int = 2, micro: int = 8, global_batch: int = 32) -> float:
    """transformers' loss (from_pretrained) on the first global batch the trainer's ranks read."""
    import torch.nn.functional as F
    from data_pipeline.loader import TokenLoader

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    losses = []
    for rank in range(ranks):
        loader = iter(TokenLoader(data, batch_size=micro, seq_len=128, rank=rank, world_size=ranks, num_workers=0,
                                  seed=0, vocab_size=model.config.vocab_size, global_batch_size=global_batch))
        for _ in range(global_batch // (micro * ranks)):
            b = next(loader)
            with torch.no_grad():
                logits = model(input_ids=b["input_ids"]).logits
            losses.append(F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten()).item())
    return sum(losses) / len(losses)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.load of step 0 in this process
def test_the_trainer_starts_from_released_weights_and_resumes_exactly(checkpoints, tiny_data, tmp_path):
    import signal

    import torch.distributed.checkpoint as dcp
    from conftest import Run
    from torch.distributed.checkpoint import FileSystemReader

    released = tmp_path / "released"  # a copy: its weights are deleted before the restart below
    released.mkdir()
    for file in checkpoints["llama3.1"].iterdir():
        (released / file.name).write_bytes(file.read_bytes())
    options = (*TRAIN, f"model.preset={released}", f"model.init_from={released}")

    full = Run(tmp_path / "full")
    assert full.run(tiny_data, *options) == 0, full.output[-4000:]
    assert "weights from" in full.output
    step0 = full.checkpoints / "step_00000000"
    meta = json.loads((step0 / "train_meta.json").read_text())
    provenance = meta["init_from"]
    assert provenance["path"] == str(released) and provenance["files"] == {
        "model.safetensors": (released / "model.safetensors").stat().st_size}
    total = sum(tensor_bytes(released).values())
    assert 0.45 < provenance["bytes_read_by_rank"] / total < 0.55  # FSDP 2: rank 0's half
    # Step 0 holds the released weights exactly, and the first step's loss is transformers' on that batch.
    with safe_open(released / "model.safetensors", framework="pt") as f:
        for name in f.keys():
            saved = torch.empty(f.get_slice(name).get_shape())
            dcp.load({"model": {name: saved}}, storage_reader=FileSystemReader(step0), no_dist=True)
            assert torch.equal(saved, f.get_tensor(name)), name
    # The optimizer starts fresh: after 3 steps AdamW has counted 3 (saving step 0 must not count one).
    saved = FileSystemReader(full.checkpoints / "step_00000003").read_metadata().state_dict_metadata
    counts = {key: torch.empty(saved[key].size) for key in saved if key.startswith("optim.state.") and key.endswith(".step")}
    dcp.load(counts, storage_reader=FileSystemReader(full.checkpoints / "step_00000003"), no_dist=True)
    assert counts and {float(count) for count in counts.values()} == {3.0}
    losses = full.losses()
    assert sorted(losses) == list(range(1, 7))
    assert losses[1][0] == pytest.approx(first_batch_loss(released, tiny_data), abs=1e-5)

    # Interrupted (SIGUSR1 after step 2), then restarted with the released weights gone: it resumes from its own
    # checkpoint, reads nothing of init_from, and every step repeats the uninterrupted run's loss bit for bit.
    run = Run(tmp_path / "interrupted")
    run.start(tiny_data, *options)
    run.wait_for_step(2)
    for pid in run.worker_pids():
        os.kill(pid, signal.SIGUSR1)
    assert run.wait() == 0, run.output[-4000:]
    assert run.status() == "stopped" and max(run.losses()) < 6
    assert (run.checkpoints / "step_00000000/train_meta.json").is_file()
    for file in released.glob("*.safetensors"):
        file.unlink()
    assert run.run(tiny_data, *options) == 0, run.output[-4000:]
    assert "resumed from" in run.output and "weights from" not in run.output
    assert f"model.init_from {released} is ignored: {run.checkpoints} already holds this run's checkpoints" in run.output
    assert run.status() == "complete"
    assert run.losses() == losses

    # Resumed from step 0 itself (the job died before its first checkpoint): the same run again.
    again = Run(tmp_path / "from_step_0")
    again.checkpoints.mkdir(parents=True)
    shutil.copytree(step0, again.checkpoints / "step_00000000")
    (again.checkpoints / "latest").write_text("step_00000000\n")
    assert again.run(tiny_data, *options) == 0, again.output[-4000:]
    assert "resumed from" in again.output and "weights from" not in again.output
    assert "is ignored" in again.output and "it resumed from step 0" in again.output
    assert again.losses() == losses


def test_a_bad_init_from_is_the_user_s_error_not_a_requeue(checkpoints, tiny_data, tmp_path, monkeypatch):
    """Exit 2 and a "user:" line for jobs/train.sh, as for any bad input: a requeue would fail the same way
    (it was an unexpected exception: exit 1, which jobs/train.sh requeues)."""
    from conftest import Run

    released = tmp_path / "released"
    released.mkdir()
    (released / "config.json").write_text((checkpoints["llama3.1"] / "config.json").read_text())
    monkeypatch.setenv("TRAIN_FAILURE_FILE", str(tmp_path / "failure"))
    run = Run(tmp_path / "run")
    assert run.run(tiny_data, *TRAIN, f"model.preset={released}", f"model.init_from={released}", nproc=1) != 0
    assert "exitcode: 2" in run.output, run.output[-4000:]  # the worker's; torchrun's own is 1
    assert "error: model.init_from:" in run.output and "holds no *.safetensors" in run.output
    assert (tmp_path / "failure").read_text().startswith("user: model.init_from:")
    assert not run.checkpoints.exists() or not list(run.checkpoints.glob("step_*"))


def test_a_folder_without_config_json_says_so(checkpoints, tmp_path):
    (tmp_path / "model.safetensors").write_bytes((checkpoints["qwen2"] / "model.safetensors").read_bytes())
    model, arch = plain_model(checkpoints["qwen2"])
    with pytest.raises(WeightsError, match=r"model\.init_from: .*config\.json: no such file"):
        load(model, tmp_path, arch, str(checkpoints["qwen2"]))
