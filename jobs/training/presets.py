"""Named model shapes (Llama-style presets) and what follows from a shape alone: parameters and FLOPs.

Torch-free on purpose: the cluster planner (``python -m cluster_config plan``, run at every synth)
sizes the production models from this table without importing PyTorch. ``models.py`` builds the
real ``LlamaForCausalLM`` from the same table; a test checks both count the same parameters.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    layers: int
    hidden: int
    heads: int
    kv_heads: int = 0  # 0: as many as heads (no grouped-query attention)
    ffn: int = 0  # 0: 8/3 x hidden rounded up to a multiple of 256 (Llama's SwiGLU sizing)

    @property
    def ffn_size(self) -> int:
        return self.ffn or -(-(8 * self.hidden // 3) // 256) * 256

    @property
    def kv_size(self) -> int:
        """Width of the key (and of the value) projection: kv_heads x head_dim."""
        return (self.kv_heads or self.heads) * (self.hidden // self.heads)

    @property
    def layer_parameters(self) -> int:
        """One decoder layer: q, k, v, o projections, the SwiGLU MLP and two RMSNorm weights."""
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_size
        return attention + 3 * self.hidden * self.ffn_size + 2 * self.hidden

    def parameters(self, vocab_size: int) -> int:
        """Every parameter: layers, final norm, input embedding and (untied) output projection."""
        return self.layers * self.layer_parameters + self.hidden + 2 * vocab_size * self.hidden

    def flops_per_token(self, vocab_size: int, seq_len: int) -> float:
        """Training FLOPs per token: 6 x matmul parameters + causal attention (PaLM appendix B)."""
        matmul = self.layers * self.layer_parameters + vocab_size * self.hidden  # the output projection
        return 6 * matmul + 12 * self.layers * self.hidden * seq_len


PRESETS: dict[str, Preset] = {
    # For CPU runs, tests and the local cluster.
    "tiny": Preset(layers=2, hidden=64, heads=4, ffn=192),
    # A multi-layer model still quick on CPU: checks the dry run's memory estimate against a real run.
    "small": Preset(layers=8, hidden=512, heads=8, ffn=1408),
    # The seed's scaling table (named by its nominal size).
    "1.7b": Preset(24, 2304, 24),
    "3.6b": Preset(30, 3072, 32),
    "7.5b": Preset(32, 4096, 32),
    "18.4b": Preset(40, 6144, 48),
    "39.1b": Preset(48, 8192, 64),
    "76.1b": Preset(60, 10240, 80),
    "145.6b": Preset(80, 12288, 96),
    "310.1b": Preset(96, 16384, 128),
    # Llama-2 shapes; 70B uses grouped-query attention with 8 key/value heads.
    "llama2-7b": Preset(32, 4096, 32, ffn=11008),
    "llama2-13b": Preset(40, 5120, 40, ffn=13824),
    "llama2-70b": Preset(80, 8192, 64, kv_heads=8, ffn=28672),
}
