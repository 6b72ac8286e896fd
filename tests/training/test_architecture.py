"""Architectures from Hugging Face configs (training/models/architecture.py): what is read, what is refused and why.

Torch-free like the module itself: the planner runs these numbers at every synth.
"""

from __future__ import annotations

import json

import pytest

from training.models.architecture import Architecture, ArchitectureError, from_hf_config, read_hf_config, to_hf_config
from training.models.presets import ARCHITECTURES, PRESETS, resolve, shipped

# Published parameter counts of the shipped configs (the model cards' totals).
PUBLISHED = {"llama3.1-8b": 8_030_261_248, "llama3.1-70b": 70_553_706_496, "llama3.2-1b": 1_235_814_400,
             "mistral-7b-v0.3": 7_248_023_552, "qwen2.5-7b": 7_615_616_512}


def shipped_config(name: str) -> dict:
    return json.loads((ARCHITECTURES / name / "config.json").read_text())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_shipped_config_counts_its_published_parameters(name):
    arch = resolve(name)
    assert arch.vocab == shipped_config(name)["vocab_size"]
    assert arch.parameters(arch.vocab) == PUBLISHED[name]


def test_every_shipped_config_is_pinned():
    assert shipped() == sorted(PUBLISHED)


def test_llama_3_options_are_read():
    llama31, llama32 = resolve("llama3.1-8b"), resolve("llama3.2-1b")
    assert (llama31.rope_theta, dict(llama31.rope_scaling)["rope_type"], llama31.kv_heads) == (500000.0, "llama3", 8)
    assert llama32.tied_embeddings and not llama31.tied_embeddings
    assert resolve("qwen2.5-7b").qkv_bias and not llama31.qkv_bias
    # A tied table is counted once; the output projection's matmul is still done.
    untied = Architecture(**{**llama32.__dict__, "tied_embeddings": False})
    assert untied.parameters(128256) - llama32.parameters(128256) == 128256 * 2048
    assert untied.flops_per_token(128256, 4096) == llama32.flops_per_token(128256, 4096)


@pytest.mark.parametrize("name", [*sorted(PUBLISHED), "llama2-70b", "tiny"])
def test_to_hf_config_reads_back_as_the_same_architecture(name):
    arch = resolve(name)
    vocab = arch.vocab or 32000
    back = from_hf_config(to_hf_config(arch, vocab, 4096))
    assert back.differences(arch) == ([] if arch.vocab else [f"vocab: {vocab} vs 0"])


def test_the_transformers_5_spelling_of_rotary_settings_is_read():
    legacy = shipped_config("llama3.1-8b")
    current = {k: v for k, v in legacy.items() if k not in ("rope_theta", "rope_scaling")}
    current["rope_parameters"] = {**legacy["rope_scaling"], "rope_theta": legacy["rope_theta"]}
    assert from_hf_config(current) == from_hf_config(legacy)


@pytest.mark.parametrize("change, refused", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported; supported: llama, mistral, qwen2"),
    ({"model_type": "mistral", "sliding_window": 4096}, "sliding_window 4096 is not supported: attention here is "
                                                        "full causal"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window True is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported: the MLP here is SwiGLU"),
    ({"mlp_bias": True}, "mlp_bias True is not supported"),
    ({"attention_bias": True}, "attention_bias True is not supported"),
    ({"num_local_experts": 8}, "num_local_experts 8 is not supported: mixture-of-experts"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not supported"),
    ({"num_key_value_heads": 5}, "num_key_value_heads 5 does not divide num_attention_heads 32"),
])
def test_what_the_plan_cannot_build_is_refused_naming_the_option(change, refused):
    with pytest.raises(ArchitectureError, match="^x.json: " + refused.replace("(", r"\(").replace(")", r"\)")):
        from_hf_config({**shipped_config("llama3.1-8b"), **change}, where="x.json")


def test_a_missing_field_and_a_missing_file_are_named(tmp_path):
    broken = {k: v for k, v in shipped_config("llama3.1-8b").items() if k != "hidden_size"}
    with pytest.raises(ArchitectureError, match="hidden_size is missing"):
        from_hf_config(broken)
    with pytest.raises(ArchitectureError, match="no such file"):
        read_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ArchitectureError, match="not JSON"):
        read_hf_config(tmp_path)


def test_resolve_reads_an_absolute_path_and_names_every_choice_otherwise(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(shipped_config("qwen2.5-7b")))
    assert resolve(str(tmp_path)) == resolve("qwen2.5-7b")
    with pytest.raises(ArchitectureError, match="llama2-70b.*llama3.1-8b.*absolute path"):
        resolve("llama3-8b")
    assert set(PRESETS) & set(shipped()) == set()  # one name, one architecture
