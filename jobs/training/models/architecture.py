"""A model's architecture as data: a Hugging Face ``config.json`` of the Llama decoder family, read and
written without PyTorch, and what follows from it alone: parameters and FLOPs.

Torch-free on purpose: the cluster planner (``python -m cluster_config plan``, run at every synth)
sizes the production models from these numbers; ``models.py`` builds the real transformers model from
``to_hf_config`` of the same ``Architecture``, and a test checks both count the same parameters.

Supported: the families transformers implements with Llama's modules and names (q/k/v/o projections,
a SwiGLU MLP of gate/up/down projections, RMSNorm, rotary positions), which the tensor-parallel plan in
``distributed.py`` shards by name: Llama 2, Llama 3, 3.1 and 3.2 (``llama``), Mistral without a
sliding window (``mistral``) and Qwen2/Qwen2.5 (``qwen2``, biases on q, k and v). Anything else is
refused with the option that makes it so (``ArchitectureError``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

# model_type -> the transformers class that implements it (config.json's "architectures").
FAMILIES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# Rotary variants transformers computes at start-up from the config alone (no learned state).
ROPE_TYPES = ("default", "linear", "llama3")
WEIGHTS_INDEX = "model.safetensors.index.json"  # a sharded checkpoint's map of tensor -> file


class ArchitectureError(ValueError):
    """A config.json this project cannot build or parallelize; the message names the option and why."""


@dataclass(frozen=True)
class Architecture:
    layers: int
    hidden: int
    heads: int
    kv_heads: int = 0  # 0: as many as heads (no grouped-query attention)
    ffn: int = 0  # 0: 8/3 x hidden rounded up to a multiple of 256 (Llama's SwiGLU sizing)
    family: str = "llama"  # transformers' model_type: one of FAMILIES
    head_dim: int = 0  # 0: hidden / heads
    vocab: int = 0  # 0: not fixed by the architecture; the dataset's tokenizer (or plan.vocab_size) sizes it
    tied_embeddings: bool = False  # the output projection is the input embedding (Llama 3.2 1B/3B)
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2)
    rope_theta: float = 10000.0
    rope_scaling: tuple = ()  # sorted (key, value) pairs of the rotary scaling (Llama 3.1's "llama3"); (): none
    rms_norm_eps: float = 1e-6
    max_positions: int = 0  # config.json's max_position_embeddings; 0: the run's sequence length

    @property
    def ffn_size(self) -> int:
        return self.ffn or -(-(8 * self.hidden // 3) // 256) * 256

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_size(self) -> int:
        """Width of the query projection (and the attention output's input): heads x head_dim."""
        return self.heads * self.head_size

    @property
    def kv_size(self) -> int:
        """Width of the key (and of the value) projection: kv_heads x head_dim."""
        return (self.kv_heads or self.heads) * self.head_size

    @property
    def layer_parameters(self) -> int:
        """One decoder layer: q, k, v, o projections (with their biases), the SwiGLU MLP, two RMSNorm weights."""
        attention = 2 * self.hidden * self.q_size + 2 * self.hidden * self.kv_size
        if self.qkv_bias:
            attention += self.q_size + 2 * self.kv_size
        return attention + 3 * self.hidden * self.ffn_size + 2 * self.hidden

    def parameters(self, vocab_size: int) -> int:
        """Every parameter: layers, final norm, input embedding and the output projection unless tied."""
        tables = 1 if self.tied_embeddings else 2
        return self.layers * self.layer_parameters + self.hidden + tables * vocab_size * self.hidden

    def flops_per_token(self, vocab_size: int, seq_len: int) -> float:
        """Training FLOPs per token: 6 x matmul parameters + causal attention (PaLM appendix B).
        The output projection is a matmul whether or not its weight is tied to the embedding."""
        matmul = self.layers * self.layer_parameters + vocab_size * self.hidden
        return 6 * matmul + 12 * self.layers * self.q_size * seq_len

    def differences(self, other: Architecture) -> list[str]:
        """The fields (other than max_positions, which changes no weight) where two architectures differ."""
        return [f"{f.name}: {getattr(self, f.name)!r} vs {getattr(other, f.name)!r}" for f in fields(self)
                if f.name != "max_positions" and getattr(self, f.name) != getattr(other, f.name)]


def from_hf_config(raw: dict, where: str = "config.json") -> Architecture:
    """The architecture a Hugging Face config describes; refused, naming the option, if it is outside
    what ``models.py`` builds and ``distributed.py`` parallelizes."""
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise ArchitectureError(
            f"{where}: model_type {family!r} is not supported; supported: {', '.join(FAMILIES)} (the decoder "
            f"family whose q/k/v/o and gate/up/down projections the tensor-parallel plan shards by name)")
    refusals = {
        "hidden_act": (raw.get("hidden_act", "silu") != "silu", "the MLP here is SwiGLU (silu)"),
        "mlp_bias": (bool(raw.get("mlp_bias")), "MLP biases are not in the parallel plan or the parameter count"),
        "attention_bias": (family != "qwen2" and bool(raw.get("attention_bias")),
                           "a bias on the attention output projection is not in the parallel plan"),
        "sliding_window": (family == "mistral" and raw.get("sliding_window") is not None,
                           "attention here is full causal; set it to null (it changes nothing when data.seq_len "
                           "is at most the window)"),
        "use_sliding_window": (bool(raw.get("use_sliding_window")), "attention here is full causal; set it to false"),
        "num_experts": (bool(raw.get("num_experts")), "mixture-of-experts layers are not in the parallel plan"),
        "num_local_experts": (bool(raw.get("num_local_experts")),
                              "mixture-of-experts layers are not in the parallel plan"),
    }
    for key, (refused, why) in refusals.items():
        if refused:
            raise ArchitectureError(f"{where}: {key} {raw.get(key)!r} is not supported: {why}")
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})  # transformers 5 / 4 spelling
    rope_theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ArchitectureError(f"{where}: rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    if rope_type == "default":
        rope = {}
    try:
        heads = int(raw["num_attention_heads"])
        arch = Architecture(
            layers=int(raw["num_hidden_layers"]), hidden=int(raw["hidden_size"]), heads=heads,
            kv_heads=int(raw.get("num_key_value_heads") or heads), ffn=int(raw["intermediate_size"]), family=family,
            head_dim=int(raw.get("head_dim") or 0), vocab=int(raw["vocab_size"]),
            tied_embeddings=bool(raw.get("tie_word_embeddings", False)), qkv_bias=family == "qwen2",
            rope_theta=rope_theta, rope_scaling=tuple(sorted(rope.items())),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), max_positions=int(raw.get("max_position_embeddings", 0)))
    except KeyError as missing:
        raise ArchitectureError(f"{where}: {missing.args[0]} is missing; a {family} config.json names it") from None
    if heads % arch.kv_heads:
        raise ArchitectureError(f"{where}: num_key_value_heads {arch.kv_heads} does not divide "
                                f"num_attention_heads {heads}")
    # Defaults spelled out (head_dim = hidden / heads, as many key/value heads as heads): one architecture, one spelling.
    if arch.head_dim == arch.hidden // heads and arch.hidden % heads == 0:
        arch = replace(arch, head_dim=0)
    if arch.kv_heads == heads:
        arch = replace(arch, kv_heads=0)
    return arch


def to_hf_config(arch: Architecture, vocab_size: int, seq_len: int) -> dict:
    """The config.json transformers builds this architecture from (``AutoConfig.for_model(**it)``)."""
    config = {
        "model_type": arch.family, "architectures": [FAMILIES[arch.family]],
        "vocab_size": vocab_size, "hidden_size": arch.hidden, "intermediate_size": arch.ffn_size,
        "num_hidden_layers": arch.layers, "num_attention_heads": arch.heads,
        "num_key_value_heads": arch.kv_heads or arch.heads, "head_dim": arch.head_size,
        "hidden_act": "silu", "rms_norm_eps": arch.rms_norm_eps, "tie_word_embeddings": arch.tied_embeddings,
        "rope_theta": arch.rope_theta, "rope_scaling": dict(arch.rope_scaling) or None,
        "max_position_embeddings": max(seq_len, arch.max_positions),
    }
    if arch.family == "llama":
        config.update(attention_bias=False, mlp_bias=False)
    elif arch.family == "mistral":
        config["sliding_window"] = None  # transformers' default is 4096: full attention, as planned
    elif arch.family == "qwen2":
        config.update(use_sliding_window=False, sliding_window=None)
    return config


def read_hf_config(path: str | Path) -> Architecture:
    """The architecture in a config.json, or in the config.json of a folder (a released checkpoint)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ArchitectureError(f"{file}: no such file; give a Hugging Face config.json or the folder holding one")
    try:
        raw = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ArchitectureError(f"{file}: not JSON ({exc})") from None
    return from_hf_config(raw, where=str(file))


def released_weights_problem(folder: str | Path, arch: Architecture, preset: str) -> str:
    """Why the Hugging Face checkpoint in ``folder`` cannot start a run of ``arch`` (``model.init_from``), '' if it
    can: its config.json describes that architecture (the vocabulary too, where the architecture fixes one), and
    it holds safetensors. Torch-free: the preflight asks before any node is taken, the trainer before it reads."""
    folder = Path(folder)
    try:
        theirs = read_hf_config(folder)
    except ArchitectureError as exc:  # no config.json, or one this project cannot build
        return f"model.init_from: {exc}"
    differences = [d for d in arch.differences(theirs) if arch.vocab or not d.startswith("vocab:")]
    if differences:
        return (f"model.init_from: {folder}/config.json is not model.preset {preset}: {'; '.join(differences)} "
                f"(run vs checkpoint); set model.preset to {folder} (or a shipped copy of its config.json)")
    if not (folder / WEIGHTS_INDEX).is_file() and not any(folder.glob("*.safetensors")):
        return (f"model.init_from: {folder} holds no *.safetensors; give the folder of a Hugging Face checkpoint "
                f"(config.json, model*.safetensors)")
    return ""
