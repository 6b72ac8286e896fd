"""The GPU proof (benchmarks.gpu_check) cannot rot between GPU runs: its CPU mode takes every stage's code
path at tiny widths (gloo, the fake process group), its dry invocation prints the plan, and the H100
and H200 reports committed under benchmarks/results/ are what the planner's --measured reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
H100_REPORT = REPO / "benchmarks/results/gpu_check_H100/report.json"
H200_REPORT = REPO / "benchmarks/results/gpu_check_H200/report.json"


def gpu_check(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "report.json"
    proc = gpu_check("--cpu", "--only", "environment,resume,recipe:llama2-70b,rank0", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_cpu_mode_runs_every_stage(cpu_report):
    stages = cpu_report["stages"]
    assert sorted(stages) == ["environment", "rank0:model7", "recipe:llama2-70b", "resume"]
    assert {name: r["status"] for name, r in stages.items()} == dict.fromkeys(stages, "done")
    assert cpu_report["mode"] == "cpu" and cpu_report["versions"]["device"] == "cpu"


def test_environment_sees_the_trainers_groups_timeouts_and_recorder(cpu_report):
    env = cpu_report["stages"]["environment"]
    assert env["group_timeouts_ok"] and env["group_timeouts_s"]["after_first_step"]["mesh:dp_shard"] == 100.0
    assert env["flight_recorder_has_training_collective"]  # gloo's recorder holds the all_reduce
    assert env["attention"][0]["deterministic"]["backward_bitwise_repeatable"]
    assert env["not_measured"]["runtime_gib"].startswith("no GPU")


def test_resumed_run_repeats_the_data_order_and_losses(cpu_report):
    resume = cpu_report["stages"]["resume"]
    assert resume["steps_compared"] == [5, 6, 7, 8] and resume["run_status"] == ["complete", "complete"]
    assert resume["same_data_order"] and resume["bitwise_equal"] and resume["deterministic"]


def test_recipe_and_rank0_run_the_real_step_and_the_dry_run(cpu_report):
    recipe = cpu_report["stages"]["recipe:llama2-70b"]
    assert recipe["losses"][-1] < recipe["losses"][0] and recipe["preset"] == "tiny"
    rank0 = cpu_report["stages"]["rank0:model7"]
    assert rank0["layout"] == "FSDP 34 x TP 8" and rank0["world_size"] == 272
    assert [row["layers"] for row in rank0["rows"]] == [1, 2]
    for row in rank0["rows"]:
        assert "error" not in row, row
        assert row["steady_step_s"] > 0 and row["first_eval_s"] > 0 and row["predicted_memory_gib"] > 0
    # The dry run's prediction is this process's torch release, named beside the one the jobs pin.
    assert rank0["predicted_torch"].startswith("2.13.0") and rank0["jobs_torch"] == "2.13.0"


def test_the_gpu_plan_runs_every_lever_on_the_largest_recipe_and_float8_on_every_recipe(tmp_path):
    from benchmarks.gpu_check.__main__ import lever_stages
    from benchmarks.gpu_check.levers import LEVERS

    recipes = [{"name": f"recipe:{preset}", "model": model, "args": {"overrides": ["train.global_batch_size=32"],
                                                                      "micro_batch_size": 4, "config": "c.yaml"}}
               for preset, model in (("llama2-70b", "model7"), ("18.4b", "model5"), ("llama2-7b", "model1"))]
    stages = lever_stages(recipes, cpu=False)
    names = [s["name"] for s in stages]
    assert names[:len(LEVERS)] == [f"lever:llama2-70b:{lever.name}" for lever in LEVERS]
    assert names[len(LEVERS):] == ["lever:18.4b:bf16", "lever:18.4b:float8=tensorwise", "lever:llama2-7b:bf16",
                                   "lever:llama2-7b:float8=tensorwise"]
    float8 = next(s for s in stages if s["name"] == "lever:18.4b:float8=tensorwise")["args"]
    # one micro-batch per step after the recipe's production batch, then the lever; 50 steps for the losses
    assert float8["overrides"] == ["train.global_batch_size=32", "train.global_batch_size=4", "train.float8=tensorwise"]
    assert float8["steps"] >= 50 and float8["compile_check"] is False
    alloc = next(s for s in stages if s["name"] == "lever:llama2-70b:expandable_segments")["args"]
    assert alloc["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_float8_is_judged_by_its_losses_against_bf16_on_the_same_steps():
    from benchmarks.gpu_check.levers import LOSS_STEPS, lever_comparisons

    bf16 = [10.0 - 0.1 * i for i in range(LOSS_STEPS)]
    done = {"status": "done", "peak_memory_gib": 40.0, "peak_reserved_gib": 48.0}
    results = {"lever:x:bf16": {**done, "mfu": 0.50, "losses": bf16},
               "lever:x:float8=tensorwise": {**done, "mfu": 0.60, "peak_memory_gib": 36.0,
                                             "losses": [b * 1.01 for b in bf16]},
               "lever:x:float8=rowwise": {**done, "mfu": 0.55, "losses": [b + 0.5 for b in bf16]},
               "lever:x:fused_adamw": {**done, "mfu": 0.51}}
    rows = {row["lever"]: row for row in lever_comparisons(results)}
    assert rows["float8=tensorwise"]["losses_agree"] and rows["float8=tensorwise"]["mfu_ratio"] == pytest.approx(1.2)
    assert rows["float8=tensorwise"]["peak_memory_gib_ratio"] == pytest.approx(0.9)
    assert rows["float8=rowwise"]["losses_agree"] is False and "DIFFER" in rows["float8=rowwise"]["summary"]
    assert "losses_agree" not in rows["fused_adamw"] and rows["fused_adamw"]["mfu_ratio"] == pytest.approx(1.02)
    short = {**results, "lever:x:float8=tensorwise": {**done, "mfu": 0.6, "losses": bf16[:10]}}
    assert next(r for r in lever_comparisons(short) if r["lever"] == "float8=tensorwise")["losses_agree"] is None


def test_dry_invocation_prints_the_stages_and_their_predicted_memory():
    proc = gpu_check("--dry", "--only", "environment,recipe:llama2-7b", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("plan (a 80 GiB GPU")
    assert "environment" in lines[1] and "limit" in lines[1]
    assert "recipe:llama2-7b" in lines[2] and "dry run" in lines[2] and "GiB" in lines[2]


def test_without_a_gpu_it_says_what_to_run_instead(capsys):
    from benchmarks.gpu_check.__main__ import main  # its command line, in this process: no second torch import

    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2
    assert "no GPU here: pass --cpu" in capsys.readouterr().err


@pytest.mark.parametrize("report_path, device, ratios", [
    (H100_REPORT, "NVIDIA H100", ("llama2-70b: MFU x 1.28", "llama2-70b memory x 0.87")),
    (H200_REPORT, "NVIDIA H200", ("llama2-70b: MFU x 1.51", "llama2-70b memory x 0.94", "18.4b: MFU x 1.15",
                                  "llama2-7b: MFU x 1.26")),
], ids=["H100", "H200"])
def test_the_planner_reads_the_committed_gpu_reports(report_path, device, ratios):
    report = json.loads(report_path.read_text())
    assert report["versions"]["device"].startswith(device)
    if device == "NVIDIA H200":  # the H100's session skipped llama2-7b for lack of budget; the H200's ran every stage
        assert {stage["status"] for stage in report["stages"].values()} == {"done"}
    proc = subprocess.run([sys.executable, "-m", "cluster_config", "plan", "--env", "prod", "--measured",
                           str(report_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: the measured MFU puts a model past its deadline
    measured = next(line for line in proc.stdout.splitlines() if "MEASURED by" in line)
    assert all(ratio in measured for ratio in ratios), measured
