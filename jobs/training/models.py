"""Llama-style causal language models, sized by named presets.

The model is transformers' ``LlamaForCausalLM``; this module only chooses its shape, builds it
without allocating the full weights (meta device, so a 70B model never exists whole on one rank)
and initializes whatever part a rank holds after sharding.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from .presets import PRESETS, Preset  # noqa: F401 (the table lives in presets.py, torch-free for the planner)


def llama_config(preset: str, vocab_size: int, seq_len: int) -> LlamaConfig:
    p = PRESETS[preset]
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=p.hidden,
        intermediate_size=p.ffn_size,
        num_hidden_layers=p.layers,
        num_attention_heads=p.heads,
        num_key_value_heads=p.kv_heads or p.heads,
        max_position_embeddings=seq_len,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
        use_cache=False,
    )


def build_model(config: LlamaConfig) -> LlamaForCausalLM:
    """The model on the meta device: shapes only, no memory. Shard it, then ``init_weights``."""
    with torch.device("meta"):
        return LlamaForCausalLM(config)


@torch.no_grad()
def init_weights(model: nn.Module, config: LlamaConfig, device: torch.device, seed: int) -> None:
    """Allocate on ``device`` and initialize (normal(0, 0.02) weights, unit norms), seeded."""
    model.to_empty(device=device)
    torch.manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=config.initializer_range)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, LlamaRMSNorm):
            nn.init.ones_(module.weight)
    # Rotary frequencies are a computed buffer, left as garbage by to_empty: compute them again.
    model.model.rotary_emb = LlamaRotaryEmbedding(config).to(device)


def count_parameters(config: LlamaConfig) -> tuple[int, int]:
    """(all parameters, parameters outside the embedding tables)."""
    p = config
    kv = p.num_key_value_heads * (p.hidden_size // p.num_attention_heads)
    attn = 2 * p.hidden_size * p.hidden_size + 2 * p.hidden_size * kv
    mlp = 3 * p.hidden_size * p.intermediate_size
    per_layer = attn + mlp + 2 * p.hidden_size
    body = p.num_hidden_layers * per_layer + p.hidden_size
    embeddings = 2 * p.vocab_size * p.hidden_size
    return body + embeddings, body


def flops_per_token(config: LlamaConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 x matmul parameters + causal attention (PaLM appendix B)."""
    _, body = count_parameters(config)
    matmul_params = body + config.vocab_size * config.hidden_size  # the output projection
    return 6 * matmul_params + 12 * config.num_hidden_layers * config.hidden_size * seq_len
