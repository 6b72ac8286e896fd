"""The speed and memory levers (docs/training.md, Levers): each is a typed setting, wired into the job, and
refused with the fix where the layout or the device cannot take it. What they gain is measured on a GPU
(benchmarks.gpu_check's lever stages); here, on the CPU, that each does what it says."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import fully_shard

from training.components.optim import build_optimizer
from training.config import ConfigError, OptimConfig, load_config
from training.models.llama import build_model, chunked_cross_entropy, compute_loss, hf_config, init_weights
from training.parallel import distributed, float8

REPO = Path(__file__).resolve().parents[2]
# torchao lives apart from the venv (requirements-float8.txt; make deps installs it there): on the path for these tests.
FLOAT8_PACKAGES = REPO / ".build/float8"
if str(FLOAT8_PACKAGES) not in sys.path:
    sys.path.append(str(FLOAT8_PACKAGES))


@pytest.fixture(autouse=True)
def fsx(tmp_path, monkeypatch):
    """The folders the tiny config's paths name."""
    for var in ("FSX_DATA", "FSX_CHECKPOINTS", "FSX_LOGS"):
        monkeypatch.setenv(var, str(tmp_path))


def tiny_model(vocab: int = 256, seq_len: int = 64):
    config = hf_config("tiny", vocab, seq_len)
    model = build_model(config)
    init_weights(model, config, torch.device("cpu"), seed=0)
    return model


@pytest.mark.parametrize("overrides, message", [
    (["train.parallelism=ddp", "train.float8=tensorwise"], "train.float8 tensorwise is wired for FSDP2"),
    (["train.float8=fp8"], "train.float8"),
    (["train.parallelism=ddp", "train.reduce_dtype=bfloat16"], "train.reduce_dtype bfloat16 is FSDP's"),
    (["train.reduce_dtype=fp16"], "train.reduce_dtype"),
    (["train.parallelism=fsdp", "train.tensor_parallel=2", "train.loss_chunks=4"],
     "the loss already runs on vocabulary shards (loss_parallel), no rank holds whole logits; set train.loss_chunks: 1"),
    (["train.loss_chunks=0"], "train.loss_chunks"),
])
def test_levers_that_the_layout_cannot_take_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match="train.float8|train.reduce_dtype|train.loss_chunks") as err:
        load_config(REPO / "jobs/training/configs/tiny.yaml", overrides)
    assert message in str(err.value)


def test_every_lever_is_off_by_default_until_a_gpu_measures_it():
    cfg = load_config(REPO / "jobs/training/configs/tiny.yaml")
    t = cfg.train
    assert (t.float8, t.reduce_dtype, t.loss_chunks, t.async_tp, t.grad_reduce, cfg.optim.fused) == (
        "off", "float32", 1, False, "every_micro_batch", False)


@pytest.mark.parametrize("device_type, capability, name, torchao_error, says", [
    ("cpu", None, "", None, "this rank runs on cpu: set train.float8: off"),
    ("cuda", (8, 0), "NVIDIA A100-SXM4-80GB", None, "NVIDIA A100-SXM4-80GB has 8.0: set train.float8: off"),
    ("cuda", (8, 6), "NVIDIA A10G", None, "NVIDIA A10G has 8.6"),
    ("cuda", (9, 0), "NVIDIA H200", "No module named 'torchao'", "install requirements-float8.txt into FLOAT8_PACKAGES"),
])
def test_float8_is_refused_without_fp8_tensor_cores_or_torchao(device_type, capability, name, torchao_error, says):
    assert says in float8.why_not(device_type, capability, name, torchao_error)


def test_float8_runs_on_an_h100_or_h200_with_torchao():
    assert float8.why_not("cuda", (9, 0), "NVIDIA H200", None) is None
    assert float8.why_not("cuda", (8, 9), "NVIDIA L40S", None) is None
    assert float8.torchao_missing() is None, f"torchao not in {FLOAT8_PACKAGES}: run make deps"


def test_the_trainer_refuses_float8_on_a_cpu(d):
    cfg = load_config(REPO / "jobs/training/configs/tiny.yaml", ["train.parallelism=fsdp", "train.float8=tensorwise"])
    model = build_model(hf_config("tiny", 256, 64))
    with pytest.raises(ConfigError, match="train.float8 needs a CUDA GPU with fp8 tensor cores .* runs on cpu"):
        distributed.parallelize(model, cfg.train, d, distributed.device_mesh(d, cfg.train))


def test_float8_converts_the_decoder_projections_and_keeps_the_head_embeddings_and_small_layers_bf16():
    from torchao.float8.float8_linear import Float8Linear

    model = tiny_model()  # hidden 64, FFN 192: every projection a multiple of 16
    converted = float8.convert(model, "tensorwise", torch.device("cpu"), sharded=False, emulate=True, min_features=16)
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert sorted(converted) == sorted(f"model.layers.{i}.{block}.{p}" for i in range(2)
                                       for block, p in (("self_attn" if p[0] in "qkvo" else "mlp", p) for p in projections))
    assert type(model.lm_head) is torch.nn.Linear and type(model.model.embed_tokens) is torch.nn.Embedding
    assert isinstance(model.model.layers[0].mlp.up_proj, Float8Linear)
    # At the default threshold the tiny model's 64-wide projections are too small to gain: all stay bf16.
    assert float8.convert(tiny_model(), "rowwise", torch.device("cpu"), sharded=False, emulate=True) == []


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_training_follows_bf16_within_its_rounding(recipe):
    """Emulated float8 (the same casts and scales, the matmul in fp32) against the plain model, same data and
    weights, 5 AdamW steps: the losses agree within 2 %, and both learn."""
    losses = {}
    for name in ("plain", recipe):
        torch.manual_seed(0)
        model = tiny_model()
        if name != "plain":
            float8.convert(model, recipe, torch.device("cpu"), sharded=False, emulate=True, min_features=16)
        optimizer = build_optimizer(model, OptimConfig(lr=3e-3))
        generator = torch.Generator().manual_seed(1)
        batch = torch.randint(0, 256, (2, 64), generator=generator)
        losses[name] = []
        for _ in range(4):
            loss = compute_loss(model, batch, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[name].append(loss.item())
    assert losses[recipe] != losses["plain"]  # the float8 casts ran
    for plain, low in zip(losses["plain"], losses[recipe]):
        assert abs(low - plain) / plain < 0.02, losses
    assert losses[recipe][-1] < losses[recipe][0] - 0.1


def test_float8_weights_are_gathered_by_fsdp_in_float8_with_tensorwise_scaling(d):
    """FSDP2 over the converted model (one gloo rank): tensorwise weights are sharded as torchao's float8-castable
    tensors (gathered in float8), rowwise ones as plain tensors; a training step runs through both."""
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    for recipe, gathered_in_float8 in (("tensorwise", True), ("rowwise", False)):
        model = tiny_model()
        float8.convert(model, recipe, torch.device("cpu"), sharded=True, emulate=True, min_features=16)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        weight = model.model.layers[0].mlp.up_proj.weight.to_local()
        assert isinstance(weight, WeightWithDynamicFloat8CastTensor) is gathered_in_float8
        batch = torch.randint(0, 256, (2, 64))
        compute_loss(model, batch, batch).backward()
        assert model.model.layers[0].mlp.up_proj.weight.grad is not None


def test_tensorwise_float8_uses_torchaos_tensor_parallel_styles_where_the_projections_are_float8():
    from torchao.float8.float8_tensor_parallel import (Float8ColwiseParallel, Float8RowwiseParallel,
                                                       PrepareFloat8ModuleInput)

    converted = float8.convert(tiny_model(), "tensorwise", torch.device("cpu"), sharded=True, emulate=True,
                               min_features=16)
    plan = distributed.block_plan({name.removeprefix("model.layers.0.") for name in converted
                                   if name.startswith("model.layers.0.")})
    assert isinstance(plan["self_attn"], PrepareFloat8ModuleInput) and isinstance(plan["mlp"], PrepareFloat8ModuleInput)
    assert plan["self_attn"].input_kwarg_layouts == distributed.BLOCK_PLAN["self_attn"].input_kwarg_layouts
    assert all(isinstance(plan[f"self_attn.{p}"], Float8ColwiseParallel) for p in ("q_proj", "k_proj", "v_proj"))
    assert isinstance(plan["mlp.down_proj"], Float8RowwiseParallel)
    # A block with one projection left in bf16 keeps the plain styles for its input; the float8 output one stays.
    partial = distributed.block_plan({"mlp.gate_proj", "mlp.down_proj"})
    assert partial["mlp"] is distributed.BLOCK_PLAN["mlp"] and isinstance(partial["mlp.down_proj"], Float8RowwiseParallel)
    assert distributed.block_plan(set()) is distributed.BLOCK_PLAN  # bf16 layers, or rowwise: no torchao needed


@pytest.mark.parametrize("reduce_dtype, expected", [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_fsdp_reduces_gradients_in_the_configured_dtype(d, reduce_dtype, expected):
    cfg = load_config(REPO / "jobs/training/configs/tiny.yaml", ["train.parallelism=fsdp",
                                                                 f"train.reduce_dtype={reduce_dtype}"])
    model = distributed.parallelize(build_model(hf_config("tiny", 256, 64)), cfg.train, d,
                                    distributed.device_mesh(d, cfg.train), mixed_precision=True, compile=False)
    policy = model.model.layers[0]._get_fsdp_state()._mp_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, expected)


@pytest.mark.parametrize("ignored", [0, 37])
def test_chunked_cross_entropy_gives_the_unchunked_loss_and_gradients(ignored):
    """Loss and logit gradients of 7 slices against F.cross_entropy on the whole micro-batch, padding included."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 130, 500, generator=generator).to(torch.bfloat16)
    labels = torch.randint(0, 500, (3, 130), generator=generator)
    labels[0, :ignored] = -100
    grads = {}
    for chunks in (1, 7):
        leaf = logits.clone().requires_grad_(True)
        loss = (torch.nn.functional.cross_entropy(leaf.float().flatten(0, 1), labels.flatten()) if chunks == 1
                else chunked_cross_entropy(leaf, labels, chunks))
        loss.backward()
        grads[chunks] = (loss.detach(), leaf.grad.float())
    torch.testing.assert_close(grads[7][0], grads[1][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads[7][1], grads[1][1], rtol=0, atol=1e-3)  # bf16 gradients: one ulp


def test_the_models_loss_in_slices_matches_the_whole_and_sums_for_evaluation():
    model = tiny_model()
    batch = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    whole = compute_loss(model, batch, batch)
    whole.backward()
    grad = model.model.layers[1].mlp.down_proj.weight.grad.clone()
    model.zero_grad()
    sliced = compute_loss(model, batch, batch, chunks=4)
    sliced.backward()
    torch.testing.assert_close(sliced, whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(model.model.layers[1].mlp.down_proj.weight.grad, grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(compute_loss(model, batch, batch, reduction="sum", chunks=4),
                               compute_loss(model, batch, batch, reduction="sum"), rtol=1e-6, atol=1e-4)


def test_fused_adamw_is_used_on_cuda_only_and_a_cpu_run_says_so(caplog):
    model = tiny_model()
    with caplog.at_level(logging.INFO, logger="training"):
        optimizer = build_optimizer(model, OptimConfig(fused=True))
    assert not optimizer.defaults["fused"]
    assert "optim.fused: AdamW's fused kernel is used on CUDA only; this run's parameters are on cpu" in caplog.text
    caplog.clear()
    assert not build_optimizer(model, OptimConfig()).defaults["fused"] and not caplog.text


def test_the_job_script_sets_expandable_segments_unless_the_user_did():
    script = (REPO / "jobs/train.sh").read_text()
    assert 'export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"' in script


def test_torchao_comes_from_the_node_setups_folder_only_when_float8_asks_for_it():
    """On the cluster torchao lies in FLOAT8_PACKAGES, apart from the venv (node_scripts/directory_setup.sh):
    importing the trainer leaves it off the path; the float8 check finds it there, and only there."""
    import subprocess

    probe = ("import os, sys; from training.parallel import float8; import training.train; "
             "print('torchao' in sys.modules, float8.torchao_missing() is None); "
             f"os.environ['FLOAT8_PACKAGES'] = {str(FLOAT8_PACKAGES)!r}; print(float8.torchao_missing() is None)")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "jobs"), "FLOAT8_PACKAGES": "/nonexistent"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "True"], out.stderr
