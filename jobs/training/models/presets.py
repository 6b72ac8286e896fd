"""Named model architectures: the shorthands (``model.preset: llama2-7b``) and the Hugging Face configs
shipped in ``jobs/training/architectures/<name>/config.json`` (``model.preset: llama3.1-8b``).

``resolve`` turns what a config names into an ``Architecture`` (architecture.py): a shorthand from the
table below, a shipped config by its folder's name, or an absolute path to a config.json (or to the
folder of a released checkpoint) on the cluster. Torch-free, like architecture.py: the planner sizes the
production models from here at every synth.
"""

from __future__ import annotations

from pathlib import Path

from training.models.architecture import Architecture, ArchitectureError, read_hf_config

ARCHITECTURES = Path(__file__).resolve().parents[1] / "architectures"  # shipped Hugging Face configs, one folder each

# The shorthands: Llama-family shapes whose vocabulary the dataset's tokenizer (or plan.vocab_size) sizes.
PRESETS: dict[str, Architecture] = {
    # For CPU runs, tests and the local cluster.
    "tiny": Architecture(layers=2, hidden=64, heads=4, ffn=192),
    # A multi-layer model still quick on CPU: checks the dry run's memory estimate against a real run.
    "small": Architecture(layers=8, hidden=512, heads=8, ffn=1408),
    # The seed's scaling table (named by its nominal size): heads/hidden/layers of the common Megatron-LM
    # GPT sizes (docs/megatron.md).
    "1.7b": Architecture(24, 2304, 24),
    "3.6b": Architecture(30, 3072, 32),
    "7.5b": Architecture(36, 4096, 32),
    "18.4b": Architecture(40, 6144, 48),
    "39.1b": Architecture(48, 8192, 64),
    "76.1b": Architecture(60, 10240, 80),
    "145.6b": Architecture(80, 12288, 96),
    "310.1b": Architecture(96, 16384, 128),
    # Llama-2 shapes; 70B uses grouped-query attention with 8 key/value heads.
    "llama2-7b": Architecture(32, 4096, 32, ffn=11008),
    "llama2-13b": Architecture(40, 5120, 40, ffn=13824),
    "llama2-70b": Architecture(80, 8192, 64, kv_heads=8, ffn=28672),
}


def shipped() -> list[str]:
    """The names of the Hugging Face configs shipped with the jobs."""
    return sorted(p.parent.name for p in ARCHITECTURES.glob("*/config.json"))


def resolve(name: str) -> Architecture:
    """The architecture ``model.preset`` names: a shorthand, a shipped config, or a path to a config.json."""
    if name in PRESETS:
        return PRESETS[name]
    if (ARCHITECTURES / name / "config.json").is_file():
        return read_hf_config(ARCHITECTURES / name)
    if name.startswith("/"):
        return read_hf_config(name)
    raise ArchitectureError(
        f"unknown preset {name!r}; choose a shorthand ({', '.join(PRESETS)}), a shipped Hugging Face config "
        f"({', '.join(shipped())}: jobs/training/architectures/), or an absolute path to a config.json")
