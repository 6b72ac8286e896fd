"""The analytic sizing (jobs/training/sizing/memory.py) against the real model on CPU: parameters, saved
activations and checkpoint bytes, measured, not restated."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict

from training.models.llama import build_model, count_parameters, init_weights, hf_config
from training.components.optim import build_optimizer
from training.config import OptimConfig
from training.models.architecture import Architecture
from training.config import validate_config
from training.dry_run import vocabulary as dry_run_vocabulary
from training.models.presets import PRESETS, resolve, shipped
from training.sizing.memory import RunShape, activation_bytes, checkpoint_bytes

SMALL = Architecture(layers=4, hidden=128, heads=4, kv_heads=2, ffn=352)  # several layers, grouped-query attention


@pytest.mark.parametrize("name", list(PRESETS) + shipped())
def test_parameter_count_matches_the_built_model(name):
    """The planner's count (Architecture.parameters at the vocabulary it plans with), the dry run's model and the
    trainer's (transformers' class from hf_config, built on the meta device) agree for every shorthand and every
    shipped config.json, tied embeddings and Qwen's q/k/v biases included."""
    arch = resolve(name)
    vocab = arch.vocab or 32000  # a config.json fixes it; a shorthand takes the tokenizer's (plan.vocab_size)
    assert dry_run_vocabulary(validate_config({"model": {"preset": name}})) == vocab
    config = hf_config(name, vocab, 4096)
    model = build_model(config)  # meta device: shapes only
    assert arch.parameters(vocab) == sum(p.numel() for p in model.parameters()) == count_parameters(config)[0]


def saved_activation_bytes(preset: Architecture, vocab: int, seq_len: int, micro: int, checkpointing: bool) -> int:
    """Bytes autograd really keeps for backward in one CPU training forward (unique storages, no weights)."""
    PRESETS["_measured"] = preset
    try:
        config = hf_config("_measured", vocab, seq_len)
    finally:
        del PRESETS["_measured"]
    model = build_model(config)
    init_weights(model, config, torch.device("cpu"), seed=0)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(0, vocab, (micro, seq_len), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(input_ids=ids).logits
        F.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
    return sum(saved.values())


@pytest.mark.parametrize("preset,vocab,seq_len,micro,checkpointing", [
    (PRESETS["tiny"], 512, 128, 16, False),
    (SMALL, 512, 64, 2, False),
    (SMALL, 512, 256, 2, False),  # 4x the sequence: linear, no seq_len^2 term with the fused kernel
    (SMALL, 512, 256, 2, True),
])
def test_activation_estimate_is_within_10_percent_of_what_autograd_saves(preset, vocab, seq_len, micro, checkpointing):
    measured = saved_activation_bytes(preset, vocab, seq_len, micro, checkpointing)
    estimate = activation_bytes(RunShape(preset, vocab, seq_len, micro, world_size=1,
                                         activation_checkpointing=checkpointing, compute_bytes=4))
    assert estimate == pytest.approx(measured, rel=0.10)


def test_checkpoint_size_matches_a_real_dcp_save(tmp_path):
    config = hf_config("tiny", 8192, 128)  # big enough that DCP's ~2 KB per tensor of headers is small
    model = build_model(config)
    init_weights(model, config, torch.device("cpu"), seed=0)
    optimizer = build_optimizer(model, OptimConfig())
    model(input_ids=torch.zeros(1, 8, dtype=torch.long)).logits.sum().backward()
    optimizer.step()  # creates the AdamW moments
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp_path / "ckpt")
    on_disk = sum(f.stat().st_size for f in (tmp_path / "ckpt").iterdir())
    assert checkpoint_bytes(PRESETS["tiny"], 8192) == pytest.approx(on_disk, rel=0.02)
