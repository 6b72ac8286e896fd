"""Causal language models of the Llama decoder family, built from an ``Architecture``.

The model is transformers' own class for the family (``LlamaForCausalLM``, ``MistralForCausalLM``,
``Qwen2ForCausalLM``), configured by ``architecture.to_hf_config``; this module builds it without
allocating the full weights (meta device, so a 70B model never exists whole on one rank) and
initializes whatever part a rank holds after sharding.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from training.models.architecture import Architecture, from_hf_config, to_hf_config
from training.models.presets import resolve


def hf_config(preset: str | Architecture, vocab_size: int, seq_len: int) -> PretrainedConfig:
    """The transformers config of an architecture (or of what ``model.preset`` names)."""
    arch = resolve(preset) if isinstance(preset, str) else preset
    raw = to_hf_config(arch, vocab_size, seq_len)
    return AutoConfig.for_model(**raw, attn_implementation="sdpa", use_cache=False)


def architecture_of(config: PretrainedConfig) -> Architecture:
    return from_hf_config(config.to_dict())


def build_model(config: PretrainedConfig) -> PreTrainedModel:
    """The model on the meta device: shapes only, no memory. Shard it, then ``init_weights``."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


# Residual output projections: each block adds their output to the residual stream, whose variance
# then grows with depth; GPT-2 and torchtitan scale their init by 1/sqrt(2 x layers) (2 per block).
RESIDUAL_OUTPUTS = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


@torch.no_grad()
def init_weights(model: nn.Module, config: PretrainedConfig, device: torch.device, seed: int) -> None:
    """Allocate on ``device`` and initialize, seeded; every layout gets the same model.

    Matrices ~ normal(0, 0.02), the residual output projections (``RESIDUAL_OUTPUTS``) ~
    normal(0, 0.02 / sqrt(2 x layers)), norms 1, biases 0. Each matrix is drawn whole, on its own device, from
    a generator seeded by (seed, its name), and each rank keeps its shard: DDP, FSDP, HSDP and FSDP x
    TP start from the same weights at any world size (on a given device type: CUDA and CPU
    generators differ). One matrix exists whole at a time (70B's largest: 1 GiB in fp32).
    """
    allocate(model, config, device)
    std = config.initializer_range
    for name, param in model.named_parameters():
        name = canonical_name(name)
        if param.dim() < 2:  # RMSNorm gains, projection biases (Qwen2)
            param.fill_(0.0 if name.endswith(".bias") else 1.0)
            continue
        sigma = std / math.sqrt(2 * config.num_hidden_layers) if name.endswith(RESIDUAL_OUTPUTS) else std
        _normal_by_name(param, sigma, seed, name)


def allocate(model: nn.Module, config: PretrainedConfig, device: torch.device) -> None:
    """Storage on ``device`` for a model built on the meta device, values undefined (``init_weights`` or a
    checkpoint fills them; the dry run, in fake tensors, needs no values)."""
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    model.to_empty(device=device)  # gives each module a parameter of its own: a tied table comes apart
    if tied:  # one table, as built (Llama 3.2 1B/3B); else the head would be drawn, and trained, on its own
        model.lm_head.weight = model.model.embed_tokens.weight
    # Rotary frequencies are a computed buffer, left as garbage by to_empty: compute them again.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config).to(device)


WRAPPER_PARTS = {"module", "_checkpoint_wrapped_module", "_orig_mod"}  # DDP, activation checkpointing, torch.compile


def canonical_name(name: str) -> str:
    """Parameter name without the wrappers' parts (DDP, activation checkpointing, torch.compile)."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_PARTS)


def param_seed(seed: int, name: str) -> int:
    """The seed of one parameter's generator: distinct names, distinct streams."""
    return seed * 1_000_003 + zlib.crc32(name.encode())


def _normal_by_name(param: torch.Tensor, sigma: float, seed: int, name: str) -> None:
    # Not DTensor's random ops: under FSDP x TP (a dimension sharded twice) torch sizes each shard's
    # slice of the shared stream wrongly, and shards of different parameters draw the same values.
    generator = torch.Generator(device=param.device).manual_seed(param_seed(seed, name))
    if not isinstance(param, DTensor):
        param.normal_(0.0, sigma, generator=generator)
        return
    full = torch.empty(param.shape, dtype=param.dtype, device=param.device)
    full.normal_(0.0, sigma, generator=generator)
    # This rank's shard, cut by DTensor's own rules; src_data_rank=None: from the local copy, no communication.
    shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
    param.to_local().copy_(shard.to_local())


IGNORE_INDEX = -100  # labels F.cross_entropy leaves out (padding)


def compute_loss(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, reduction: str = "mean",
                 chunks: int = 1) -> torch.Tensor:
    """Next-token cross-entropy of one micro-batch (fp32 logits), over its tokens.

    Under tensor parallelism the logits are vocabulary shards: call inside ``distributed.loss_parallel``,
    which gives the loss on every rank (a replicated DTensor, returned as the plain tensor).
    ``chunks`` > 1 (``train.loss_chunks``): the loss of each slice of the sequence in turn (``chunked_cross_entropy``).
    """
    logits = model(input_ids=inputs).logits
    if chunks > 1 and not isinstance(logits, DTensor):
        return chunked_cross_entropy(logits, labels, chunks, reduction)
    loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction=reduction)
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def _slice_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="sum")


def chunked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, chunks: int, reduction: str = "mean") -> torch.Tensor:
    """``F.cross_entropy`` of bf16 ``logits`` (batch, sequence, vocabulary) in ``chunks`` slices of the sequence,
    each upcast to fp32 only while its loss is computed and again in backward (activation checkpointing of the
    slice): the whole micro-batch's fp32 logits and their log-softmax (8 bytes x tokens x vocabulary) never
    exist at once, one slice's do. The same sums as the unchunked loss, in another order."""
    total = sum(torch.utils.checkpoint.checkpoint(_slice_loss, piece, target, use_reentrant=False)
                for piece, target in zip(logits.chunk(chunks, dim=1), labels.chunk(chunks, dim=1)))
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise ValueError(f"reduction {reduction!r}: chunked cross-entropy gives mean or sum")
    return total / (labels != IGNORE_INDEX).sum()


def count_parameters(config: PretrainedConfig) -> tuple[int, int]:
    """(all parameters, parameters outside the embedding tables), as the planner counts them."""
    arch = architecture_of(config)
    total = arch.parameters(config.vocab_size)
    return total, total - (1 if arch.tied_embeddings else 2) * config.vocab_size * config.hidden_size


def flops_per_token(config: PretrainedConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 x matmul parameters + causal attention (PaLM appendix B)."""
    return architecture_of(config).flops_per_token(config.vocab_size, seq_len)
