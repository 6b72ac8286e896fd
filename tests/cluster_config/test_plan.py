"""The multi-model plan: settings refuse plans that do not fit; the report adds up."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from cluster_config.hardware import gpu_of
from cluster_config.model_configs import model_config
from cluster_config.plan import PlanError, build_plan, check_plan, format_plan, read_measured
from training.models.presets import ARCHITECTURES, PRESETS, resolve
from training.sizing.throughput import estimate_mfu
from cluster_config.settings import CONFIG_DIR, Settings, SettingsError, load_settings
from stacks.app import settings_for

H200_REPORT = CONFIG_DIR.parent / "benchmarks/results/gpu_check_H200/report.json"  # one H200's proof, committed


def prod_raw() -> dict:
    return yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())


def test_prod_plan_is_seven_models_on_80_nodes_at_2768_per_hour():
    plan = build_plan(load_settings("prod"))
    assert [row.nodes for row in plan.rows] == [4, 4, 7, 7, 12, 12, 34]
    assert (plan.nodes, plan.gpus) == (80, 640)
    assert plan.cost_per_hour_usd == pytest.approx(2768.0)
    assert plan.reserved == 80


def test_prod_as_shipped_has_enough_data_throughput():
    plan = build_plan(load_settings("prod"))
    assert plan.data_demand_mb_s == pytest.approx(640 * 2)
    assert not plan.storage_under_provisioned
    assert "WARNING" not in format_plan(plan)


def test_a_read_heavy_plan_warns_that_the_data_file_system_is_under_provisioned(write_env, tmp_path):
    raw = prod_raw()
    raw["storage"]["data_read_mb_s_per_gpu"] = 20
    plan = build_plan(load_settings("prod", write_env(tmp_path, "prod", storage=raw["storage"])))
    # 640 GPUs x 20 MB/s = 12,800 MB/s against 7.03 TiB x 1,000 MB/s/TiB = 7,031 MB/s.
    assert plan.data_demand_mb_s == pytest.approx(12800)
    assert plan.data_throughput_mb_s == pytest.approx(7031.25)
    assert plan.storage_under_provisioned
    assert "WARNING: the data file system is under-provisioned" in format_plan(plan)


def test_enough_throughput_gives_no_warning(write_env, tmp_path):
    raw = prod_raw()
    raw["storage"]["data_read_mb_s_per_gpu"] = 20
    raw["storage"]["data"]["storage_capacity_gib"] = 14400  # 14,062 MB/s at 1,000 MB/s/TiB
    settings = load_settings("prod", write_env(tmp_path, "prod", storage=raw["storage"]))
    text = format_plan(build_plan(settings))
    assert "WARNING" not in text
    assert "14,062 MB/s: 1.10x" in text


def test_plan_above_max_count_fails_naming_the_fix(write_env, tmp_path):
    raw = prod_raw()
    raw["models"][6]["nodes"] = 35  # 81 nodes on a queue of 80
    with pytest.raises(SettingsError, match="the plan needs 81 nodes but gpu_queue.max_count is 80"):
        load_settings("prod", write_env(tmp_path, "prod", models=raw["models"]))


def test_plan_above_the_capacity_reservations_fails(write_env, tmp_path):
    raw = prod_raw()
    raw["gpu_queue"]["capacity_reservations"][1]["instance_count"] = 32
    with pytest.raises(SettingsError, match=r"max_count 80 differs from the Capacity Blocks' total instance_count 72 \(40 \+ 32\)"):
        load_settings("prod", write_env(tmp_path, "prod", gpu_queue=raw["gpu_queue"]))


def test_plan_names_the_reservations(write_env, tmp_path):
    assert ", reserved 80 in 2 Capacity Blocks (40 + 40);" in format_plan(build_plan(load_settings("prod")))
    assert ", no reservation;" in format_plan(build_plan(load_settings("dev")))
    raw = prod_raw()
    raw["gpu_queue"].update(min_count=0, capacity_reservations=[{"id": "cr-0a1b2c3d4e5f60718", "instance_count": 80}])
    odcr = load_settings("prod", write_env(tmp_path, "prod", gpu_queue=raw["gpu_queue"]))
    assert ", reserved 80 in 1 ODCR;" in format_plan(build_plan(odcr))


def test_cli_plan_prints_the_table():
    out = subprocess.run(
        [sys.executable, "-m", "cluster_config", "plan", "--env", "prod"], capture_output=True, text=True, check=True
    ).stdout
    assert "Plan for prod: 80 x p5e.48xlarge (H200, 140 GiB) of max 80, reserved 80 in 2 Capacity Blocks (40 + 40)" in out
    assert "MFU estimated per model from 40% with communication hidden, deadline 14 days" in out
    assert out.splitlines()[8].split()[:4] == ["model7", "llama2-70b", "34", "272"]
    assert "ERROR" not in out and "WARNING" not in out


def test_cli_fsx_expected_prints_provisioned_throughput_per_mount():
    out = subprocess.run([sys.executable, "-m", "cluster_config", "fsx-expected", "--env", "prod"],
                         capture_output=True, text=True, check=True).stdout
    # 7,200 GiB x 1,000 MB/s/TiB and 4,800 GiB x 500 MB/s/TiB
    assert out.strip() == "/fsx/data=7031.2,/fsx/checkpoints=7031.2,/fsx/logs=2343.8"


# --- time, cost, memory and checkpoints (the analytic sizing: jobs/training/sizing/memory.py) -------------

def prod_with(tmp_path, write_env, model: str, overrides: dict | None = None, **entry) -> Settings:
    """prod's settings with one model's entry changed: its keys, and training-config ``overrides``."""
    models = prod_raw()["models"]
    for raw in models:
        if raw["name"] == model:
            raw.update(entry)
            raw["overrides"] = {**raw.get("overrides", {}), **(overrides or {})}
    return load_settings("prod", write_env(tmp_path, "prod", models=models))


def test_resized_prod_plan_fits_memory_checkpoints_and_the_deadline():
    settings = load_settings("prod")
    plan = check_plan(settings)
    assert plan.errors == () and plan.warnings == ()
    assert settings.plan.deadline_days == 14
    for row in plan.rows:
        assert row.days <= 14, row.name
        assert row.memory["total"] <= plan.usable_gib, row.name
    assert plan.checkpoint_need_bytes < plan.checkpoint_capacity_bytes
    # The 70B model cannot be trained compute-optimally in two weeks on this cluster: said plainly.
    assert "NOTE: model7 trains 3 tokens per parameter" in format_plan(plan)


def test_flops_agree_with_6nd_for_the_issue_example(tmp_path, write_env):
    """The old model7 (100,000 steps x 1,120 x 4,096 tokens, 14 nodes): ~1.9e23 FLOPs, ~50 days at 40 % MFU,
    longer at the MFU its tensor-parallel layout reaches."""
    raw = prod_raw()
    models = [{**{k: v for k, v in raw["models"][6].items() if k != "min_nodes"}, "nodes": 14, "steps": 100000,
               "global_batch_size": 1120}]
    row = build_plan(load_settings("prod", write_env(tmp_path, "prod", models=models))).rows[0]
    assert row.tokens == 100000 * 1120 * 4096
    six_nd = 6 * row.parameters * row.tokens  # the rule of thumb, without attention
    assert six_nd == pytest.approx(1.9e23, rel=0.02)
    assert 1.0 < row.flops / six_nd < 1.1  # attention at 4,096 tokens adds a few percent
    at_40_percent = row.flops / (row.gpus * 989e12 * 0.40) / 86400
    assert 48 < at_40_percent < 56
    assert row.mfu < 0.40 and row.days == pytest.approx(at_40_percent * 0.40 / row.mfu)
    assert row.cost_to_finish_usd == pytest.approx(row.days * 24 * 14 * raw["gpu_queue"]["price_per_instance_hour_usd"])


def test_halving_mfu_doubles_days_and_cost_where_communication_is_hidden(tmp_path, write_env):
    base = build_plan(load_settings("prod"))
    slow = build_plan(load_settings("prod", write_env(tmp_path, "prod", plan={"mfu": 0.2, "deadline_days": 40})))
    for a, b in zip(base.rows, slow.rows):
        if a.name == "model7":  # its tensor-parallel communication does not slow down with the compute
            assert 1.5 * a.days < b.days < 2 * a.days
            continue
        assert a.mfu == pytest.approx(0.40) and b.mfu == pytest.approx(0.20)
        assert b.days == pytest.approx(2 * a.days)
        assert b.cost_to_finish_usd == pytest.approx(2 * a.cost_to_finish_usd)


def _model7_step(**train):
    settings = load_settings("prod")
    model = next(m for m in settings.models if m.name == "model7")
    cfg = model_config(settings, model).train.model_copy(update=train)
    gpu = gpu_of(settings)
    return estimate_mfu(PRESETS["llama2-70b"], cfg, vocab=32000, seq_len=4096, gpus=272, gpus_per_node=8,
                        peak_tflops=gpu.peak_tflops, node_link_gb_s=gpu.node_link_gb_s,
                        network_gb_s=gpu.network_gb_s, compute_mfu=0.40)


def test_model7_mfu_is_estimated_from_its_recomputation_and_tensor_parallel_traffic():
    step = _model7_step()
    # 6 x 69B parameters... per token, 1,088 x 4,096 tokens over 272 GPUs, at 40 % of 989 TFLOP/s,
    # plus the forward of 20 recomputed layers of 80 (8 % more compute).
    useful = 1088 * 4096 / 272 * PRESETS["llama2-70b"].flops_per_token(32000, 4096)
    assert step.compute_s == pytest.approx(useful / (989e12 * 0.40) * 1.08, rel=0.01)
    # TP traffic inside the node at 80 % of NVLink's 450 GB/s, not overlapped; FSDP's hidden behind compute.
    assert 0.1 < step.tensor_parallel_s / step.compute_s < 0.3
    assert step.exposed_data_parallel_s == 0
    assert step.mfu == pytest.approx(useful / (step.step_s * 989e12))
    assert 0.28 < step.mfu < 0.34
    # Recomputing every layer at micro-batch 8 (the layout before sequence parallelism freed memory) is slower.
    assert _model7_step(micro_batch_size=8, activation_checkpointing_every=1).mfu < step.mfu - 0.03


def test_data_parallel_traffic_beyond_the_compute_is_exposed():
    """Micro-batch 2 without checkpointing: FSDP gathers each layer twice per micro-batch over EFA, longer than its compute."""
    step = _model7_step(micro_batch_size=2, activation_checkpointing=False)
    assert step.data_parallel_s > step.compute_s
    assert step.step_s == pytest.approx(step.compute_s + step.tensor_parallel_s + step.data_parallel_s - step.compute_s)


def test_a_model_that_does_not_fit_in_gpu_memory_fails_with_the_fix(tmp_path, write_env):
    settings = prod_with(tmp_path, write_env, "model7", {"train.activation_checkpointing": False,
                                                         "train.micro_batch_size": 8})
    with pytest.raises(PlanError) as caught:
        check_plan(settings)
    message = str(caught.value)
    assert "model7: needs" in message and "GiB usable on a H200" in message
    assert "in cluster_config/prod.yaml models: model7, overrides: set train.activation_checkpointing: true" in message
    assert "lower train.micro_batch_size (now 8)" in message


def test_synth_stops_on_a_plan_that_cannot_fit(tmp_path, write_env):
    """A GPU with too little memory for the 7B models: loading the environment for synth fails."""
    write_env(tmp_path, "prod", plan={"gpu_memory_gib": 40})
    with pytest.raises(PlanError, match=r"model1: needs 67 GiB per GPU, more than the 36 GiB usable"):
        settings_for("prod", tmp_path)


def test_checkpoints_that_overflow_their_file_system_fail_with_the_size_to_use(tmp_path, write_env):
    raw = prod_raw()
    raw["storage"]["checkpoints"]["storage_capacity_gib"] = 4800
    with pytest.raises(PlanError, match=r"checkpoints overflow /fsx/checkpoints: .* needs 5.60 TiB, the file "
                                        r"system has 4.69 TiB; raise storage.checkpoints.storage_capacity_gib to 7200"):
        check_plan(load_settings("prod", write_env(tmp_path, "prod", storage=raw["storage"])))


def test_checkpoints_without_room_for_one_failed_save_warn(tmp_path, write_env):
    # 6.35 TiB of 7.03: less than one more 0.83 TB checkpoint free
    plan = check_plan(prod_with(tmp_path, write_env, "model7", {"checkpoint.keep": 3}))
    assert any("less than one more checkpoint of the largest model (828 GB)" in w for w in plan.warnings)


def test_a_late_model_is_flagged_with_steps_or_nodes_that_would_make_it(tmp_path, write_env):
    plan = build_plan(load_settings("prod", write_env(tmp_path, "prod", plan={"deadline_days": 10})))
    late = [w for w in plan.warnings if "after plan.deadline_days 10" in w]
    assert len(late) == 7
    assert plan.errors == ()
    model7 = next(w for w in late if w.startswith("model7"))
    assert "lower steps to 36," in model7 and "in cluster_config/prod.yaml models: model7" in model7
    # 13.66 days at 31 % MFU without failures, 13.69 with the 1.8 expected (18 min each, on 32 nodes until the
    # replacement): 34 x 13.69 / 10 -> 47 nodes
    assert "13.68 days (13.66 without failures) at 31% MFU (estimated)" in model7 and "or give it 47 nodes" in model7


def test_a_global_batch_that_does_not_divide_stops_synth_naming_the_entry(tmp_path, write_env):
    with pytest.raises(SettingsError, match=r"cluster_config/prod.yaml models: model1: train.global_batch_size 1000 is "
                                            r"not a multiple of train.micro_batch_size x data-parallel ranks = 2 x 32; "
                                            r"use a multiple of 64"):
        check_plan(prod_with(tmp_path, write_env, "model1", global_batch_size=1000))


def test_tensor_parallel_and_hsdp_layouts_are_sized(tmp_path, write_env):
    """Tensor parallel splits each block's matrices and activations; HSDP shards over its group only."""
    def total(name, **overrides):
        settings = prod_with(tmp_path / f"{name}-{len(overrides)}", write_env, name, overrides)
        return next(row for row in build_plan(settings).rows if row.name == name).memory["total"]
    # Micro-batches of 4: 1,088 sequences divide over 34 tensor-parallel groups and over 272 ranks alike.
    micro4 = {"train.micro_batch_size": 4}
    assert total("model7", **micro4) < total("model7", **micro4, **{"train.tensor_parallel": 1})
    assert total("model1") > total("model1", **{"train.parallelism": "fsdp"})  # shards of 8 GPUs, not 32


def test_deferred_gradient_reduction_points_to_the_dry_run(tmp_path, write_env):
    plan = build_plan(prod_with(tmp_path, write_env, "model1", {"train.grad_reduce": "last_micro_batch"}))
    assert any(w.startswith("model1: the analytic memory model assumes gradients reduced every micro-batch")
               and "python -m training.dry_run model1 --env prod" in w for w in plan.warnings)


# --- a model's architecture: a shorthand, a shipped config.json or a path, read as the trainer reads it -----

def test_a_llama31_model_counts_its_128256_token_vocabulary(tmp_path, write_env):
    """The architecture's config.json fixes the vocabulary: the plan counts its embeddings, not plan.vocab_size's."""
    settings = prod_with(tmp_path, write_env, "model1", preset="llama3.1-8b")
    plan = check_plan(settings)  # the llama3.1-8b recipe fits a H200 by the analytic sizing too
    row = next(row for row in plan.rows if row.name == "model1")
    assert settings.plan.vocab_size == 32000 and model_config(settings, settings.models[0]).model.vocab_size == 0
    assert row.parameters == resolve("llama3.1-8b").parameters(128256) == 8_030_261_248
    assert row.parameters != resolve("llama3.1-8b").parameters(32000) == 7_241_732_096
    assert row.checkpoint_bytes == 12 * 8_030_261_248  # fp32 weights + Adam's two moments
    assert row.memory["total"] <= plan.usable_gib


def test_the_llama31_70b_recipe_fits_a_h200_in_the_plan(tmp_path, write_env):
    """model7's nodes, batch and steps on the Llama 3.1 70B recipe: FSDP x TP 8, micro-batch 4, 1 layer in 4
    recomputed; the plan's analytic sizing (what synth checks) with the 128,256-token vocabulary."""
    plan = build_plan(prod_with(tmp_path, write_env, "model7", preset="llama3.1-70b"))
    row = next(row for row in plan.rows if row.name == "model7")
    assert plan.errors == () and row.memory["total"] <= plan.usable_gib
    assert row.parameters == resolve("llama3.1-70b").parameters(128256) == 70_553_706_496


def write_config(tmp_path, name: str, **changes) -> str:
    """A shipped config.json with ``changes``, written to tmp_path/<name>/config.json: its path."""
    raw = {**json.loads((ARCHITECTURES / name / "config.json").read_text()), **changes}
    (tmp_path / name).mkdir(parents=True)
    (tmp_path / name / "config.json").write_text(json.dumps(raw))
    return str(tmp_path / name / "config.json")


@pytest.mark.parametrize("preset, message", [
    ("llama3.1-8", r"unknown preset 'llama3.1-8'; choose a shorthand .* llama3.1-8b, .* — set preset: to one "
                   r"of those, or ship the config.json as jobs/training/architectures/<name>/config.json"),
    ("/fsx/data/weights/llama3.1-8b", r"the plan sizes the model from its config.json at synth, on this machine, where "
                                      r"/fsx/data/weights/llama3.1-8b is not: ship the config.json as "
                                      r"jobs/training/architectures/<name>/config.json and set preset: <name>"),
    ({"model_type": "gpt2"}, r"model_type 'gpt2' is not supported; supported: llama, mistral, qwen2"),
    ({"sliding_window": 4096}, r"sliding_window 4096 is not supported: attention here is full causal"),
])
def test_an_architecture_the_trainer_cannot_build_stops_synth_naming_the_entry_and_the_reason(
        tmp_path, write_env, preset, message):
    if isinstance(preset, dict):  # an absolute path to a config.json the trainer would refuse
        preset = write_config(tmp_path / "arch", "mistral-7b-v0.3", **preset)
    settings = prod_with(tmp_path, write_env, "model1", preset=preset)
    with pytest.raises(SettingsError, match=r"cluster_config/prod.yaml models: model1: preset: .*" + message):
        check_plan(settings)


def test_a_config_json_by_absolute_path_is_planned_with_the_recipe_named_like_its_folder(tmp_path, write_env):
    preset = write_config(tmp_path, "llama3.1-8b")
    row = build_plan(prod_with(tmp_path, write_env, "model1", preset=preset)).rows[0]
    assert row.parameters == 8_030_261_248


def test_bad_plan_settings_are_refused(tmp_path, write_env):
    with pytest.raises(SettingsError, match=r"plan.mfu: Input should be less than or equal to 1"):
        load_settings("prod", write_env(tmp_path, "prod", plan={"mfu": 40}))


def acceptance_report(tmp_path, mfu_ratio: float, memory_ratio: float):
    """The two checks of one shrunk layout that the plan reads, as the acceptance report writes them."""
    from cluster_checks.layout_checks import mfu, peak_memory
    from cluster_checks.verdict import Report

    expected = 0.312  # the plan's estimate for the shrunk layout (training.sizing.throughput)
    checks = [mfu("llama2-70b", mfu_ratio * expected * 989e12 / 4.4e11, 4.4e11, 989e12, expected),
              peak_memory("llama2-70b", 50.0 * memory_ratio, 50.0)]
    path = tmp_path / "report.json"
    path.write_text(Report(gpu=True, checks=checks, context={"job": "4242"}).to_json())
    return path


def test_plan_measured_scales_the_measured_recipe_and_flags_a_late_model(tmp_path):
    """The acceptance run measured the 70B layout's compute at 85 % of the estimate's speed and 5 % more memory."""
    report = acceptance_report(tmp_path, mfu_ratio=0.85, memory_ratio=1.05)
    base = build_plan(load_settings("prod"))
    measured = build_plan(load_settings("prod"), read_measured(report))
    for a, b in zip(base.rows, measured.rows):
        if a.name == "model7":
            assert b.step.compute_s == pytest.approx(a.step.compute_s / 0.85)
            assert b.step.tensor_parallel_s == a.step.tensor_parallel_s  # its own model, not scaled
            assert b.step_s == pytest.approx(a.step.compute_s / 0.85 + a.step.tensor_parallel_s)  # FSDP still hidden
            assert b.memory["total"] == pytest.approx(1.05 * a.memory["total"])
        else:  # another recipe: estimates kept
            assert (b.mfu, b.days, b.memory) == (a.mfu, a.days, a.memory)
    late = [re.match(r"model7: finishes in ([\d.]+) days \(15\.70 without failures\) at 27% MFU \(measured\), "
                     r"after plan.deadline_days 14; lower steps to ([\d,]+) or fewer", w) for w in measured.warnings]
    days, fit = next(m.groups() for m in late if m)
    assert int(fit.replace(",", "")) == pytest.approx(50_000 * 14 / float(days), rel=5e-4)  # days printed rounded
    out = subprocess.run([sys.executable, "-m", "cluster_config", "plan", "--env", "prod", "--measured", str(report)],
                         capture_output=True, text=True, check=True).stdout
    assert "MEASURED by" in out and "job 4242" in out and "llama2-70b: MFU x 0.85" in out and "WARNING: model7" in out


def test_plan_measured_scales_compute_only_and_says_fsdp_is_no_longer_hidden():
    """The H200 proof measured the 70B recipe's compute (one GPU: no communication) at 1.51 x the estimate's speed.
    Only the compute gets faster: model7's 3.67 s of tensor-parallel traffic stays, and its 13.4 s of FSDP
    traffic, hidden under 19.9 s of estimated compute, outlasts the measured 13.2 s."""
    base = build_plan(load_settings("prod"))
    measured = build_plan(load_settings("prod"), read_measured(H200_REPORT))
    a, b = (next(r for r in plan.rows if r.name == "model7") for plan in (base, measured))
    assert b.step.compute_s == pytest.approx(a.step.compute_s / 1.5093, rel=1e-3)
    assert b.step.tensor_parallel_s == pytest.approx(3.67, abs=0.01) == a.step.tensor_parallel_s
    assert b.step.data_parallel_s == a.step.data_parallel_s > b.step.compute_s
    assert b.step_s == pytest.approx(b.step.tensor_parallel_s + b.step.data_parallel_s)
    assert b.mfu == pytest.approx(0.43, abs=0.005) and b.days == pytest.approx(9.87, abs=0.01)  # not 47 %, 9.05 days
    text = format_plan(measured)
    assert "  model7     13.21  measured x 1.51   3.67  13.38   -0.2  17.05" in text
    assert "  model1     12.15  measured x 1.26   0.00   2.21    yes  12.15" in text
    warning = next(w for w in measured.warnings if "data-parallel traffic" in w)
    assert warning.startswith("model7: data-parallel traffic 13.4 s per step exceeds its compute 13.2 s")
    assert "train.reduce_dtype: bfloat16" in warning and "train.grad_reduce: last_micro_batch" in warning
    assert "larger train.tensor_parallel" not in warning  # already 8, the GPUs of a node
    assert not any("data-parallel traffic" in w for w in base.warnings)  # the estimate's slower compute hides it


def test_plan_measured_refuses_a_proof_whose_recipes_ran_with_other_settings(tmp_path):
    """A lever run (--set train.float8=tensorwise) measures a config the models do not train with: no gain from it."""
    report = json.loads(H200_REPORT.read_text())
    path = tmp_path / "report.json"
    path.write_text(json.dumps({**report, "set": ["train.float8=tensorwise"]}))
    with pytest.raises(SettingsError, match=r"its recipes ran with --set train.float8=tensorwise, not as the models train"):
        read_measured(path)


def test_float8_on_gpus_without_fp8_stops_synth_naming_the_entry(tmp_path, write_env):
    """dev's g5.12xlarge has A10Gs (compute capability 8.6); prod's H200s take float8, and the plan counts no gain."""
    models = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())["models"]
    models[0]["overrides"] = {**models[0].get("overrides", {}), "train.parallelism": "fsdp", "train.float8": "tensorwise"}
    with pytest.raises(PlanError) as caught:
        check_plan(load_settings("dev", write_env(tmp_path, "dev", models=models)))
    assert (f"{models[0]['name']}: train.float8 tensorwise needs fp8 tensor cores (compute capability 8.9+: H100, H200), "
            "and g5.12xlarge's A10G has none; set train.float8: off in the overrides of cluster_config/dev.yaml models: "
            f"{models[0]['name']}") in str(caught.value)
    on_h200 = build_plan(prod_with(tmp_path / "prod", write_env, "model7", {"train.float8": "rowwise"}))
    assert not on_h200.errors
    assert [r.mfu for r in on_h200.rows] == [r.mfu for r in build_plan(load_settings("prod")).rows]


def test_bf16_gradient_reduction_halves_the_reduce_scatter_bytes_the_plan_counts():
    fp32, bf16 = _model7_step(), _model7_step(reduce_dtype="bfloat16")
    assert bf16.compute_s == fp32.compute_s and bf16.tensor_parallel_s == fp32.tensor_parallel_s
    # Per layer and micro-batch: 2 all-gathers of 2-byte weights and 1 reduce-scatter of 4-byte gradients,
    # then of 2-byte ones: 8 bytes per parameter become 6.
    assert bf16.data_parallel_s == pytest.approx(fp32.data_parallel_s * 6 / 8, rel=0.02)


def test_plan_measured_refuses_a_report_without_layout_figures(tmp_path):
    from cluster_checks.verdict import Check, Report

    report = tmp_path / "report.json"
    report.write_text(Report(gpu=False, checks=[Check.no_gpu("layout llama2-70b: MFU vs plan", ">= 80 %", "x")]).to_json())
    result = subprocess.run([sys.executable, "-m", "cluster_config", "plan", "--env", "prod", "--measured", str(report)],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "measured no layout's MFU or memory" in result.stderr and "run jobs/acceptance.sh on the GPU cluster" in result.stderr


def test_the_planner_reads_architectures_without_torch():
    """Synth needs no PyTorch: the plan and the USR1 lead read config.json through training.models.architecture."""
    code = ("import sys, cluster_config.plan, cluster_config.slurm_timeouts; "
            "from cluster_config.settings import load_settings; cluster_config.plan.build_plan(load_settings('prod')); "
            "from training.models.presets import resolve; resolve('llama3.1-70b'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_plan_counts_each_datasets_shards_and_its_raw_text_against_the_data_file_system():
    from data_pipeline.shards import token_dtype_name

    plan = build_plan(load_settings("prod"))
    # one pass of each model's tokens as uint16 (32,000 ids): steps x global batch x seq_len x 2 bytes
    passes = {"model1": 72000 * 1024, "model2": 72000 * 1024, "model3": 60000 * 1120, "model4": 60000 * 1120,
              "model5": 72000 * 1152, "model6": 72000 * 1152, "model7": 50000 * 1088}
    assert plan.data_need_bytes == sum(sequences * 4096 * 2 for sequences in passes.values())
    assert plan.data_need_bytes / 2**40 == pytest.approx(3.74, abs=0.005)
    assert plan.data_capacity_bytes == 7200 * 2**30 and plan.errors == ()
    text = format_plan(plan)
    assert "datasets, one pass of each model's tokens: 3.74 TiB of shards in 7 folders, of 7.03 TiB (53%)" in text
    assert "NOTE: the shards and all the raw text do not fit on the data file system together" in text  # +7.48 TiB
    # the shards' dtype is the tokenizer's: uint16 up to 65,536 ids, else uint32
    from cluster_config.plan import token_bytes
    for vocab in (32000, 65536, 65537, 128256):
        assert token_bytes(vocab) == {"uint16": 2, "uint32": 4}[token_dtype_name(vocab)]


def test_models_sharing_a_dataset_count_it_once_and_must_tokenize_it_alike(tmp_path, write_env):
    raw = prod_raw()
    raw["models"][1]["dataset"] = raw["models"][0]["dataset"]  # model2 trains on model1's shards
    plan = build_plan(load_settings("prod", write_env(tmp_path / "shared", "prod", models=raw["models"])))
    assert len(plan.dataset_tokens) == 6
    assert plan.data_need_bytes == build_plan(load_settings("prod")).data_need_bytes - 72000 * 1024 * 4096 * 2
    raw["models"][1]["seq_len"] = 2048
    with pytest.raises(SettingsError, match=r"models: model1 and model2 share dataset tokenized/model1 but tokenize it "
                                            r"differently \(tokenizers/llama2 at seq_len 4096, tokenizers/llama2 at "
                                            r"2048\): preprocessing one would rewrite the shards the other trains on"):
        load_settings("prod", write_env(tmp_path / "apart", "prod", models=raw["models"]))


def test_datasets_that_overflow_the_data_file_system_fail_at_synth_with_the_size_to_use(tmp_path, write_env):
    raw = prod_raw()
    raw["storage"]["data"]["storage_capacity_gib"] = 2400
    with pytest.raises(PlanError, match=r"datasets overflow /fsx/data: one pass of each model's tokens is 3.74 TiB of "
                                        r"shards \(7 datasets\), the file system has 2.34 TiB; raise "
                                        r"storage.data.storage_capacity_gib to 12000 \(the shards and the raw text"):
        check_plan(load_settings("prod", write_env(tmp_path, "prod", storage=raw["storage"])))
