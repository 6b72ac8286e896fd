"""The production dry run (training.dry_run): every production model fits, and the estimate is right.

The dry run joins PyTorch's fake process group in this process (collectives are no-ops) and runs
under FakeTensorMode; each call creates and destroys its own group.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch._inductor.config
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from cluster_config.model_jobs import bundled_cluster
from training.parallel import distributed
from training.dry_run import (DEFAULT_VOCAB, HEADROOM, analytic_activation_bytes, dry_run, fake_dist, load_model_config, main, measure_cpu,
                              production_setup)
from training.dry_run import vocabulary as dry_run_vocabulary
from training.models.llama import RESIDUAL_OUTPUTS, canonical_name, count_parameters, init_weights, hf_config
from training.train import build

CONFIGS = Path(__file__).resolve().parents[2] / "jobs/training/configs"  # the recipes
PRODUCTION = [f"model{i}" for i in range(1, 8)]
SMALL = ["model.preset=small", "data.seq_len=512", "train.micro_batch_size=4", "train.global_batch_size=8"]


@pytest.fixture(scope="module")
def production_reports() -> dict:
    """One dry run per distinct job (model1/2, 3/4 and 5/6 are the same job on other data)."""
    done, reports = {}, {}
    for model in PRODUCTION:
        raw, world_size, gpu_gib = production_setup(model, bundled_cluster("prod"))
        cfg = load_model_config(raw)
        key = (cfg.model.model_dump_json(), cfg.train.model_dump_json(), cfg.data.seq_len, world_size, gpu_gib)
        if key not in done:
            done[key] = dry_run(cfg, world_size, gpu_memory_gib=gpu_gib)
        reports[model] = done[key]
    return reports


@pytest.mark.slow
def test_every_production_model_fits_a_h200_with_headroom(production_reports):
    for model, report in production_reports.items():
        assert report.gpu_memory_gib == pytest.approx(140.4, abs=0.05)  # H200: 143,771 MiB (cluster_config/plan.py)
        assert report.fits and report.fraction <= 1 - HEADROOM, report.summary()
        assert report.categories["activations"] > 0 and report.categories["optimizer"] > 0, report.summary()
    model7 = production_reports["model7"]
    assert model7.world_size == 272 and model7.layout == "FSDP 34 x TP 8"  # the TP layout at production size
    assert production_reports["model1"].layout.startswith("HSDP 32")


@pytest.mark.slow
def test_production_estimates_agree_with_the_analytic_model(production_reports):
    """States are bytes x parameters / shards; activations (no checkpointing) counted by hand."""
    for model in ("model1", "model3", "model5"):
        report = production_reports[model]
        cfg = load_model_config(production_setup(model, bundled_cluster("prod"))[0])
        model_config = hf_config(cfg.model.preset, DEFAULT_VOCAB, cfg.data.seq_len)
        params, _ = count_parameters(model_config)
        shards = cfg.train.hsdp_shard_size
        assert report.categories["optimizer"] == pytest.approx(8 * params / shards, rel=0.02), model
        assert report.categories["gradients"] == pytest.approx(4 * params / shards, rel=0.02), model
        analytic = analytic_activation_bytes(model_config, cfg.train.micro_batch_size, cfg.data.seq_len)
        assert report.categories["activations"] == pytest.approx(analytic, rel=0.15), model


@pytest.mark.parametrize("overrides", [
    ["train.parallelism=fsdp", "train.micro_batch_size=8"],  # tiny: 4 micro-batches
    ["train.parallelism=ddp", "train.micro_batch_size=8"],
    ["train.parallelism=fsdp", *SMALL],
    pytest.param(["train.parallelism=fsdp", "train.activation_checkpointing=true", *SMALL],
                 marks=pytest.mark.drill),  # 2 minutes: make test-drills
], ids=["tiny", "tiny-ddp", "small", "small-activation-checkpointing"])
def test_cpu_estimate_is_within_15_percent_of_measured_memory(overrides):
    """The same config run for real on one CPU process (fp32), its allocator traced by the profiler."""
    vocab = 512 if "model.preset=small" not in overrides else DEFAULT_VOCAB
    measured = measure_cpu(CONFIGS / "tiny.yaml", overrides, vocab_size=vocab)
    estimated = dry_run(load_model_config(CONFIGS / "tiny.yaml", overrides), 1, vocab_size=vocab, gpu=False)
    assert abs(estimated.peak_bytes / measured - 1) <= 0.15, (estimated.summary(), measured / 2**20)


@pytest.mark.parametrize("parallelism", ["fsdp", "ddp"])
def test_the_peak_only_tracker_gives_torchs_peak_to_the_byte(parallelism, monkeypatch):
    """The dry run keeps the device's peak only (training.dry_run._peak_only); torch's own trackers,
    which also keep each module's, must give the same bytes in every category."""
    import training.dry_run as module

    cfg = load_model_config(CONFIGS / "tiny.yaml", [f"train.parallelism={parallelism}", "train.micro_batch_size=8"])
    fast = dry_run(cfg, 2, vocab_size=512)
    monkeypatch.setattr(module, "_peak_only", lambda tracker: tracker)
    torchs = dry_run(cfg, 2, vocab_size=512)
    assert fast.categories == torchs.categories and fast.peak_bytes == torchs.peak_bytes > 0


def test_deferred_gradient_reduction_holds_unsharded_fp32_gradients():
    """What the per-micro-batch reduce-scatter saves: 4 bytes x all parameters, whatever the world size."""
    base = ["train.parallelism=fsdp", *SMALL, "train.global_batch_size=64"]
    every = dry_run(load_model_config(CONFIGS / "tiny.yaml", base), 8)
    last = dry_run(load_model_config(CONFIGS / "tiny.yaml", [*base, "train.grad_reduce=last_micro_batch"]), 8)
    params, _ = count_parameters(hf_config("small", DEFAULT_VOCAB, 512))
    # The tracker files the unsharded gradients under temporaries (made in backward); the peaks differ by them.
    assert last.peak_bytes - every.peak_bytes >= 4 * params * 0.95
    assert last.grad_sync == "last micro-batch" and every.grad_sync == "every micro-batch"


def test_fsdp_x_tensor_parallel_builds_and_initializes_under_the_fake_process_group():
    """FSDP 8 x TP 2 built and initialized as the dry run does it: each rank's shard cut from fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = load_model_config(CONFIGS / "tiny.yaml", ["train.parallelism=fsdp", "train.tensor_parallel=2",
                                                    "model.preset=small", "train.activation_checkpointing=true",
                                                    "train.activation_checkpointing_every=3", "train.async_tp=true"])
    d = fake_dist(16)
    try:
        mesh = distributed.device_mesh(d, cfg.train)
        model_config = hf_config("small", DEFAULT_VOCAB, 128)
        model, optimizer = build(cfg, model_config, d, mesh, mixed_precision=True,
                                 allocating=FakeTensorMode(allow_non_fake_inputs=True))
        q = model.model.layers[0].self_attn.q_proj.weight
        assert q.device_mesh.mesh_dim_names == ("dp_shard", "tp") and q.to_local().shape == (512 // 16, 512)
        assert len(optimizer.param_groups) == 2
        # Sequence parallel: the norms are replicated on the tensor-parallel ranks, the output split by vocabulary.
        norm = model.model.layers[0].input_layernorm.weight
        assert norm.device_mesh.mesh_dim_names == ("dp_shard", "tp") and norm.placements[1].is_replicate()
        assert model.lm_head.weight.placements[1].is_shard(0)
        recomputed = [i for i, layer in enumerate(model.model.layers) if isinstance(layer, CheckpointWrapper)]
        assert recomputed == [0, 3, 6]  # 1 layer in 3 of the 8
        assert torch._inductor.config._micro_pipeline_tp  # async TP: the compiler's overlap pass is on
    finally:
        torch._inductor.config._micro_pipeline_tp = False
        dist.destroy_process_group()


def test_residual_projections_get_a_depth_scaled_init():
    model_config = hf_config("small", 512, 64)
    from training.models.llama import build_model

    model = build_model(model_config)
    init_weights(model, model_config, torch.device("cpu"), seed=0)
    scaled = 0.02 / math.sqrt(2 * model_config.num_hidden_layers)
    for name, param in model.named_parameters():
        name = canonical_name(name)
        if param.dim() < 2:
            assert torch.all(param == 1), name
        else:
            expected = scaled if name.endswith(RESIDUAL_OUTPUTS) else 0.02
            assert param.std().item() == pytest.approx(expected, rel=0.05), name
    assert sum(name.endswith(RESIDUAL_OUTPUTS) for name, _ in model.named_parameters()) == 2 * 8


def test_unknown_model_is_an_error_naming_the_choices(capsys):
    jobs_dir = bundled_cluster("prod").jobs_dir
    assert main(["model9", "--env", "prod", "--jobs-dir", str(jobs_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model 'model9' is not in the prod plan; choose one of model1, model2")


def test_without_the_cluster_file_or_with_another_environments_the_error_names_the_command(tmp_path, capsys):
    assert main(["model1", "--jobs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"error: no {tmp_path}/models/cluster.json — write one with python -m cluster_config jobs --env ENV" in err
    dev = bundled_cluster("dev").jobs_dir
    assert main(["model1", "--env", "prod", "--jobs-dir", str(dev)]) == 2
    err = capsys.readouterr().err
    assert f"{dev}/models/cluster.json is dev's, not prod's — write prod's with python -m cluster_config jobs --env prod" in err


def test_a_model_runs_what_its_environment_gives_it():
    """One description per model: dev's model1 is the tiny preset on 2 x 4 A10G, prod's the 7B on 32 H200."""
    raw, world_size, gpu_gib = production_setup("model1", bundled_cluster("dev"))
    assert (raw["model"]["preset"], raw["data"]["seq_len"], world_size, round(gpu_gib)) == ("tiny", 128, 8, 22)
    raw, world_size, gpu_gib = production_setup("model1", bundled_cluster("prod"))
    assert (raw["model"]["preset"], raw["data"]["seq_len"], world_size, round(gpu_gib)) == ("llama2-7b", 4096, 32, 140)


def test_a_config_file_with_overrides_and_no_model_applies_every_override(capsys):
    """`--config FILE section.key=value`: the first override is not a model's name."""
    assert main(["--config", str(CONFIGS / "tiny.yaml"), "train.parallelism=fsdp", "train.micro_batch_size=8",
                 "train.global_batch_size=8", "--world-size", "1", "--gpu-memory-gib", "80"]) == 0
    assert "(tiny): FSDP 1, micro-batch 8 x 1 accumulation" in capsys.readouterr().out


def test_the_dry_run_sizes_a_config_jsons_vocabulary():
    """Llama 3.2 1B (128,256 tokens, tied): its config.json's vocabulary, not DEFAULT_VOCAB, without --vocab-size."""
    cfg = load_model_config(CONFIGS / "tiny.yaml", ["model.preset=llama3.2-1b"])
    assert dry_run_vocabulary(cfg) == 128256 != DEFAULT_VOCAB
    assert dry_run_vocabulary(load_model_config(CONFIGS / "tiny.yaml", ["model.vocab_size=512"])) == 512
    assert dry_run_vocabulary(load_model_config(CONFIGS / "tiny.yaml")) == DEFAULT_VOCAB
