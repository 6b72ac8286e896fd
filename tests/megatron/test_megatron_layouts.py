"""Megatron-LM layouts: every GPT size and Llama 2 on its reference layout passes synth (the job files, the
plan) and megatron-core's own config checks; a layout Megatron would refuse is refused at synth, naming the
field and the fix."""

from __future__ import annotations

import warnings
from fnmatch import fnmatch
from pathlib import Path

import pytest
import torch

with warnings.catch_warnings():  # megatron-core warns at import that Apex/TE are absent (CPU)
    warnings.simplefilter("ignore")
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer.transformer_config import TransformerConfig

from cluster_config import megatron
from cluster_config.hardware import gpu_of
from cluster_config.model_jobs import GENERATED, job_files
from cluster_config.plan import PlanError, build_plan, check_plan
from cluster_config.settings import SettingsError, load_settings
from tests.settings_files import write_env

# megatron-core's TransformerConfig warns of its own deprecated defaults at every construction.
pytestmark = pytest.mark.filterwarnings("ignore:full scope is deprecated")

GPT_SIZES = ["1.7b", "3.6b", "7.5b", "18.4b", "39.1b", "76.1b", "145.6b", "310.1b"]
# The prod models' global batches; the GPT sizes take the common Megatron-LM example's 288.
BATCH = {"llama2-7b": 1024, "llama2-13b": 1120, "llama2-70b": 1088}


def entry(preset: str, nodes: int, layout: dict, **fields) -> dict:
    recipe = preset if preset.startswith("llama2") else "18.4b"  # the optimizer's recipe (no recipe per GPT size)
    return {"name": "model8", "nodes": nodes, "preset": preset, "recipe": recipe, "seq_len": 4096,
            "global_batch_size": BATCH.get(preset, 288), "steps": 10000, "dataset": "tokenized/model8",
            "tokenizer": "tokenizers/llama2", "megatron": layout, **fields}


def load(tmp_path, *models: dict):
    return load_settings("prod", write_env(tmp_path, "prod", models=list(models)).parent)


def as_megatron_sees_it(args: list[str], world_size: int) -> tuple[TransformerConfig, int]:
    """megatron-core's own checks on the generated arguments: its TransformerConfig (heads, query groups,
    layers per pipeline stage, sequence parallel) and its micro-batch calculator (global batch)."""
    def value(flag: str, default=None):
        return args[args.index(flag) + 1] if flag in args else default

    tp, pp = int(value("--tensor-model-parallel-size")), int(value("--pipeline-model-parallel-size"))
    config = TransformerConfig(
        num_layers=int(value("--num-layers")), hidden_size=int(value("--hidden-size")),
        num_attention_heads=int(value("--num-attention-heads")), ffn_hidden_size=int(value("--ffn-hidden-size")),
        num_query_groups=int(value("--num-query-groups", value("--num-attention-heads"))),
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, pipeline_dtype=torch.bfloat16,
        sequence_parallel="--sequence-parallel" in args, bf16="--bf16" in args, gated_linear_unit="--swiglu" in args)
    dp = world_size // (tp * pp)
    micro = ConstantNumMicroBatchesCalculator(int(value("--global-batch-size")), int(value("--micro-batch-size")),
                                              dp, None, 0)
    return config, micro.get()


@pytest.mark.parametrize("preset", GPT_SIZES + ["llama2-7b", "llama2-13b", "llama2-70b"])
def test_reference_layout_passes_megatrons_checks_and_fits(preset, tmp_path):
    nodes, tp, pp = megatron.REFERENCE_LAYOUTS[preset]
    settings = load(tmp_path, entry(preset, nodes, {"tensor_parallel": tp, "pipeline_parallel": pp}))
    model = settings.models[0]
    args = megatron.arguments(settings, model)
    config, micro_batches = as_megatron_sees_it(args, nodes * 8)
    assert config.num_layers % pp == 0 and micro_batches * (nodes * 8 // (tp * pp)) == model.global_batch_size
    sized = megatron.sizing(settings, model, gpu_of(settings))
    gpu = gpu_of(settings)
    assert sized.memory.total / 2**30 < gpu.memory_gib * (1 - settings.plan.memory_headroom)
    assert 0 < sized.step.mfu <= settings.plan.mfu


def test_prod_models_on_megatron_pass_synth_and_the_plan(tmp_path):
    """The prod entries themselves (nodes, global batches) with Megatron layouts: settings, job files, plan."""
    prod = load_settings("prod")
    layouts = {"llama2-7b": {}, "llama2-13b": {"tensor_parallel": 2},
               "18.4b": {"tensor_parallel": 4}, "llama2-70b": {"tensor_parallel": 8, "pipeline_parallel": 2}}
    models = [{**m.model_dump(exclude_none=True, exclude_defaults=True, exclude={"min_nodes"}),
               "megatron": layouts[m.preset]} for m in prod.models]  # a Megatron job does not shrink
    settings = load(tmp_path, *models)
    files = job_files(settings)
    for model in settings.models:
        args = files[f"models/{model.name}.megatron.args"].splitlines()[1:]  # after the generated-by header
        as_megatron_sees_it(args, model.nodes * 8)
        script = files[f"train_{model.name}.sh"]
        assert "#SBATCH --ntasks-per-node=8" in script and "#SBATCH --signal=TERM@" in script
        assert f"megatron_lm/pretrain.sh\" {model.name} " in script
    plan = build_plan(settings)
    assert not plan.errors
    row = {r.name: r for r in plan.rows}["model7"]
    # The 70B on TP 8 x PP 2: 1/16 of the weights per GPU (bf16 + fp32 gradients), not the trainer's FSDP shard.
    assert row.memory["parameters"] == pytest.approx(68.98e9 / 16 * 2 / 2**30, rel=0.02)
    assert row.snapshot_every == 0  # no in-memory snapshots under Megatron-LM


@pytest.mark.parametrize(("preset", "nodes", "layout", "field", "fix"), [
    # the example: 36 layers on 8 pipeline stages
    ("7.5b", 2, {"tensor_parallel": 2, "pipeline_parallel": 8}, "megatron.pipeline_parallel: 8 does not divide "
     "the 36 layers", "use one of 1, 2, 4"),
    ("llama2-70b", 34, {"tensor_parallel": 8, "pipeline_parallel": 4}, "megatron.pipeline_parallel: tensor_parallel "
     "x pipeline_parallel = 32 does not divide the model's 272 GPUs", "use a product that divides 272"),
    ("tiny", 1, {"tensor_parallel": 8}, "megatron.tensor_parallel: 8 does not split preset tiny (heads 4",
     "use one of 1, 2, 4"),
    ("llama2-7b", 4, {"tensor_parallel": 3}, "megatron.tensor_parallel: 3 does not divide the 8 GPUs of a node",
     "use one of 1, 2, 4, 8"),
    ("llama2-7b", 3, {}, "megatron.micro_batch_size: the global batch 1024 is not a multiple of micro-batch 1 x "
     "data parallel 24", "set global_batch_size: 1032"),
    ("llama2-7b", 4, {"sequence_parallel": True}, "megatron.sequence_parallel: true with tensor_parallel 1",
     "remove it"),
])
def test_a_layout_megatron_refuses_is_refused_at_synth_naming_the_field(tmp_path, preset, nodes, layout, field, fix):
    settings = load(tmp_path, entry(preset, nodes, layout))
    with pytest.raises(SettingsError) as refused:  # the job files, written at synth
        job_files(settings)
    assert f"models: model8: {field}" in str(refused.value) and fix in str(refused.value)
    # and the plan, which stops synth on an error (stacks/app.py: check_plan)
    assert any(f"models: model8: {field}" in error and fix in error for error in refuse_plan(settings))


@pytest.mark.parametrize(("preset", "layout"), [
    ("tiny", {"tensor_parallel": 8}), ("llama2-7b", {"sequence_parallel": True}),
])
def test_megatron_core_refuses_the_same_layouts(preset, layout):
    """The rules above are Megatron's own: megatron-core's config refuses those layouts too (layers by PP and
    the world by TP x PP are Megatron-LM's validate_args', not in megatron-core)."""
    from training.models.presets import resolve
    arch = resolve(preset)
    tp, pp = layout.get("tensor_parallel", 1), layout.get("pipeline_parallel", 1)
    with pytest.raises((ValueError, AssertionError)):
        TransformerConfig(num_layers=arch.layers, hidden_size=arch.hidden, num_attention_heads=arch.heads,
                          ffn_hidden_size=arch.ffn_size, tensor_model_parallel_size=tp,
                          pipeline_model_parallel_size=pp, pipeline_dtype=torch.bfloat16,
                          sequence_parallel=layout.get("sequence_parallel", False))


@pytest.mark.parametrize(("field", "fix"), [("hot_spares", "set hot_spares: 0"), ("min_nodes", "remove min_nodes")])
def test_recovery_inside_the_job_is_refused_with_megatron(tmp_path, field, fix):
    settings = load(tmp_path, entry("llama2-7b", 4, {}, **{field: 2}))
    with pytest.raises(SettingsError, match=f"{field} 2 with megatron: .*; {fix}"):
        job_files(settings)


def refuse_plan(settings) -> list[str]:
    with pytest.raises(PlanError):
        check_plan(settings)
    return list(build_plan(settings).errors)


@pytest.mark.parametrize(("vocab", "tp", "padded"), [(32000, 1, 32000), (32000, 8, 32768), (50257, 1, 50304),
                                                      (50257, 4, 50688)])
def test_vocabulary_is_padded_as_megatron_pads_it(vocab, tp, padded):
    # Megatron-LM's vocab_utils: a multiple of make_vocab_size_divisible_by (128) x TP; GPT-2's 50257 -> 50304.
    assert megatron.padded_vocab(vocab, tp) == padded


def test_a_layout_that_does_not_fit_names_megatrons_fixes(tmp_path):
    settings = load(tmp_path, entry("llama2-70b", 34, {"tensor_parallel": 2, "recompute": "none"}))
    errors = [e for e in build_plan(settings).errors if "GiB per GPU with Megatron-LM" in e]
    assert errors and "megatron.recompute: full" in errors[0] and "megatron.pipeline_parallel" in errors[0]


def test_the_bundle_carries_the_megatron_jobs():
    """The bundle leaves out what synth generates (train_*.sh at any depth): no Megatron script is named so."""
    folder = Path(__file__).resolve().parents[2] / "jobs/megatron_lm"
    assert [path.name for path in folder.iterdir() if any(fnmatch(path.name, p.split("/")[-1]) for p in GENERATED)] == []
