"""Every benchmark runs small in `make test` (`make bench` runs them full), so none rots unnoticed.

Each runs as `make bench` runs it, `python -m benchmarks.<name>`, with its own options for a small run
and its JSON written to tmp_path. The tests check the JSON's fields, that its figures are finite and
positive and that its ratios are those of its own figures: never a timing target, which a small run
on a busy machine may miss. communication, node_bootstrap and export have theirs beside their other tests
(tests/training/test_communication.py, tests/node_scripts/test_bootstrap_benchmark.py,
tests/training/test_export_hf.py).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# How a test runs a benchmark's entry point: `-m benchmarks.<name>` in a subprocess, or its __main__ imported.
RUNS_A_BENCHMARK = re.compile(r'"-m",\s*"benchmarks\.(\w+)"|benchmarks\.(\w+)\.__main__')


def run(command: list[str], out: Path, timeout: float) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([*command, "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc, json.loads(out.read_text())


def positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


def test_every_benchmark_has_a_smoke_test():
    benchmarks = {path.parent.name for path in (REPO / "benchmarks").glob("*/__main__.py")}
    assert {"data_pipeline", "communication", "training", "recovery", "node_bootstrap"} <= benchmarks
    smoked = {name for path in (REPO / "tests").rglob("test_*.py")
              for match in RUNS_A_BENCHMARK.finditer(path.read_text()) for name in match.groups() if name}
    assert sorted(benchmarks - smoked) == [], "benchmarks no test runs: give each a smoke test"


def test_data_pipeline_benchmark(tmp_path):
    proc, result = run([sys.executable, "-m", "benchmarks.data_pipeline", "--size-mb", "0.2", "--files", "2",
                        "--loader-seconds", "0.5"], tmp_path / "data_pipeline.json", timeout=300)
    # Exit 1 says a target was missed: figures, not failures, at this size.
    assert proc.returncode == (0 if all(result["targets_met"].values()) else 1), proc.stderr[-4000:]
    assert result["corpus"] == {"bytes": 200_000, "files": 2, "vocab_size": 4096, "seq_len": 1024}
    tokenize, loader, memory = result["tokenize"], result["loader"], result["memory"]
    for name in ("seed", "ours"):
        assert positive(*tokenize[name].values()), tokenize
        assert positive(loader[name]["batches"], loader[name]["tokens_per_s"]), loader
        assert 0 <= loader[name]["padding_fraction"] < 1, loader
    assert loader["ours"]["padding_fraction"] == 0  # packed sequences: by construction, not a timing
    assert abs(tokenize["ours"]["tokens"] - tokenize["seed"]["tokens"]) < 0.05 * tokenize["seed"]["tokens"]
    assert positive(memory["1x"]["peak_rss_mb"], memory["4x"]["peak_rss_mb"])
    assert memory["4x"]["batches_per_epoch"] >= 4 * memory["1x"]["batches_per_epoch"]
    assert result["uint32"]["dtype"] == "uint32" and positive(result["uint32"]["bytes_per_token"])
    verify = result["verify"]  # the shard checksums against an epoch read without them, same run
    assert positive(verify["shards"], verify["bytes"], verify["verify_s"], verify["epoch_read_s"], verify["batches_per_epoch"])
    assert verify["verify_over_epoch_ratio"] == pytest.approx(verify["verify_s"] / verify["epoch_read_s"], rel=0.01, abs=1e-3)
    assert "shard SHA-256 check / epoch read" in proc.stdout
    # Each ratio is ours over the seed's of this run.
    ratios = result["ratios"]
    assert ratios["tokenize_throughput"] == pytest.approx(
        tokenize["ours"]["tokens_per_s"] / tokenize["seed"]["tokens_per_s"], abs=0.01)
    assert ratios["loader_tokens_per_s"] == pytest.approx(
        loader["ours"]["tokens_per_s"] / loader["seed"]["tokens_per_s"], abs=0.1)
    assert ratios["bytes_per_token"] == pytest.approx(
        tokenize["ours"]["bytes_per_token"] / tokenize["seed"]["bytes_per_token"], abs=1e-4)
    assert memory["ratio_4x_to_1x"] == pytest.approx(memory["4x"]["peak_rss_mb"] / memory["1x"]["peak_rss_mb"],
                                                     abs=1e-3)
    assert len(result["targets_met"]) == 6 and all(isinstance(v, bool) for v in result["targets_met"].values())
    assert f"wrote {tmp_path / 'data_pipeline.json'}" in proc.stdout


@pytest.mark.slurm
@pytest.mark.any_cluster
def test_training_benchmark(slurm_cluster, tmp_path):
    """Its data-wait figure comes from a two-node job on the local cluster, as in `make bench`."""
    proc, result = run([sys.executable, "-m", "benchmarks.training", "--saves", "1", "--hidden", "128",
                        "--layers", "2", "--steps", "20"], tmp_path / "training.json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ckpt, tput = result["checkpoint"], result["throughput"]
    assert ckpt["saves"] == 1 and len(ckpt["sync_blocking_s"]) == len(ckpt["async_blocking_s"]) == 1
    assert positive(ckpt["state_bytes"], ckpt["parameters"], ckpt["sync_blocking_median_s"],
                    ckpt["async_blocking_median_s"], ckpt["step_time_s_without_save"], *ckpt["async_background_write_s"])
    assert ckpt["state_bytes"] == ckpt["parameters"] * 4 * 3  # fp32 parameters and AdamW's two moments
    during = ckpt["step_time_s_during_background_write"]
    assert during is None or positive(during)  # None: the write ended before a step did
    # The async save against the synchronous baseline of this run.
    assert ckpt["async_over_sync_ratio"] == pytest.approx(
        ckpt["async_blocking_median_s"] / ckpt["sync_blocking_median_s"], rel=0.02, abs=1e-3)
    assert ckpt["meets_target"] == (ckpt["async_over_sync_ratio"] <= ckpt["target_ratio"])

    assert tput["setup"].startswith("local Slurm cluster, sbatch jobs/train_model1.sh, 2 nodes"), tput["setup"]
    assert tput["intervals"] == 1  # 20 steps logged every 10, the first interval (start-up) left out
    assert positive(tput["tokens_per_s_total"], tput["tokens_per_s_per_device"], tput["step_time_s"])
    assert tput["tokens_per_s_per_device"] == pytest.approx(tput["tokens_per_s_total"] / 2, rel=0.1)
    assert 0 <= tput["data_wait_pct_median"] <= tput["data_wait_pct_max"] <= 100
    assert tput["meets_target"] == (tput["data_wait_pct_median"] <= tput["target_data_wait_pct"])
    assert math.isfinite(tput["first_loss"]) and tput["last_loss"] < tput["first_loss"]
    assert "data wait" in proc.stdout


@pytest.mark.slurm
@pytest.mark.any_cluster
def test_recovery_benchmark(slurm_cluster, tmp_path):
    """The baseline fault alone (the time limit): the reference run, the fault, the requeue, the resumed run."""
    proc, result = run([sys.executable, "-m", "benchmarks.recovery", "--faults", "time-limit"],
                       tmp_path / "recovery.json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert result["setup"].startswith("local Slurm cluster, 3 CPU nodes")
    [row] = result["faults"]
    assert row["fault"] == "time limit (SIGUSR1), baseline"
    assert row["end"] == "COMPLETED exit 0" and row["restarts"] >= 1 and row["human_needed"] is False
    assert positive(row["seconds_to_requeue"], row["seconds_to_next_step"])
    assert row["seconds_to_requeue"] <= row["seconds_to_next_step"]
    assert 0 <= row["steps_repeated"] <= 6  # at most one checkpoint interval
    assert row["losses_identical"] is True
    assert "| time limit (SIGUSR1), baseline |" in proc.stdout


def test_replica_check_benchmark(tmp_path):
    """The sentinel's cost, on this CPU at a small size: each replicated prod model gets its figure."""
    proc, result = run([sys.executable, "-m", "benchmarks.replica_check", "--gib", "0.02"],
                       tmp_path / "replica_check.json", timeout=300)
    assert proc.returncode == (0 if all(r["fraction_of_step"] < 0.005 for r in result["models"]) else 1), proc.stderr
    assert positive(result["check_s"], result["baseline_s"], result["check_gb_per_s"])
    replicated = {r["model"]: r["layout"] for r in result["models"]}
    assert replicated == {f"model{i}": "hsdp shards of 8" for i in range(1, 7)}  # model7 is FSDP x TP: no copies
    for row in result["models"]:
        assert row["check_s"] == pytest.approx(row["rank_bytes"] / (result["check_gb_per_s"] * 1e9))


def test_corruption_checks_benchmark(tmp_path):
    """The at-rest digest's and the replay's share of a step, on this CPU at a small size, then each prod model's."""
    proc, result = run([sys.executable, "-m", "benchmarks.replica_check.checks", "--hidden", "64", "--layers", "1",
                        "--rounds", "2", "--read-gb-s", "677"], tmp_path / "checks.json", timeout=300)
    met = all(r["digest_fraction"] < result["target_fraction"] and r["replay_fraction"] < result["target_fraction"]
              for r in result["prod"])
    assert proc.returncode == (0 if met else 1), proc.stderr[-4000:]
    assert positive(result["step_s"], result["digest_s"], result["forward_backward_s"])
    assert result["replays_differing"] == 0  # bit-exact on the CPU: the replay's premise
    assert result["prod_read_gb_s"] == pytest.approx(677)  # prod's digests at the stated read rate
    assert [r["model"] for r in result["prod"]] == [f"model{i}" for i in range(1, 8)]


def test_snapshot_benchmark(tmp_path):
    """A snapshot's cost, measured here on a small model, then each prod model's from the plan's figures."""
    proc, result = run([sys.executable, "-m", "benchmarks.snapshot", "--hidden", "128", "--layers", "1", "--snapshots", "2"],
                       tmp_path / "snapshot.json", timeout=300)
    assert proc.returncode == (0 if result["meets_target"] else 1), proc.stderr[-4000:]
    here = result["measured"]
    assert positive(here["step_s"], here["blocked_median_s"], here["background_median_s"], here["copy_gb_per_s"],
                    here["write_gb_per_s"])
    assert here["write_gb_per_s"] == pytest.approx(here["state_bytes"] / here["background_median_s"] / 1e9, rel=0.01)
    assert [m["model"] for m in result["models"]] == [f"model{i}" for i in range(1, 8)]
    for row in result["models"]:
        assert row["snapshot_every"] > 0  # the plan gives every prod model snapshots
        assert row["fraction_of_interval"] == pytest.approx(row["blocked_s"] / row["interval_s"], rel=0.01)
    assert "| model7 |" in proc.stdout


def test_hf_import_benchmark(tmp_path):
    """Bytes per rank of a released checkpoint's import: measured on 4 gloo ranks = computed from the
    placements; prod's models in their layouts, their import time the bytes read over the throughput."""
    proc, result = run([sys.executable, "-m", "benchmarks.hf_import", "--hidden", "64"],
                       tmp_path / "hf_import.json", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    layouts = result["measured"]["layouts"]
    for row in layouts.values():
        assert row["rank_ratios"] == row["computed_rank_ratios"] and positive(row["seconds"])
        assert row["all_ranks_ratio"] == pytest.approx(sum(row["rank_ratios"]))
    assert layouts["ddp"]["rank_ratios"] == [1.0] * 4
    assert layouts["fsdp"]["all_ranks_ratio"] == pytest.approx(1.0)
    assert all(0.24 < r < 0.26 for r in layouts["fsdp"]["rank_ratios"])
    assert layouts["hsdp"]["all_ranks_ratio"] == pytest.approx(2.0)
    assert 1 < layouts["fsdp_tp"]["all_ranks_ratio"] < 1.5  # the embedding and norms: whole on both TP ranks
    models = {row["model"]: row for row in result["models"]}
    assert sorted(models) == [f"model{i}" for i in range(1, 8)]
    for row in models.values():
        assert positive(row["checkpoint_bytes"], row["import_s"], row["throughput_mb_s"])
        assert row["import_s"] == pytest.approx(row["all_ranks_ratio"] * row["checkpoint_bytes"]
                                                / (row["throughput_mb_s"] * 1e6))
    seventy = models["model7"]  # llama2-70b, FSDP 34 x TP 8
    assert seventy["preset"] == "llama2-70b" and seventy["world_size"] == 272
    assert seventy["max_rank_ratio"] < 2 / 272 and 1 <= seventy["all_ranks_ratio"] < 1.05


def test_straggler_probe_benchmark(tmp_path):
    """The probe's noise on this CPU, few samples: the shares and the expected false reports are consistent."""
    proc, result = run([sys.executable, "-m", "benchmarks.straggler_probe", "--samples", "30"],
                       tmp_path / "straggler_probe.json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert positive(result["median_ms"]) and result["max_over_median"] >= result["p99_over_median"] >= 1
    shares = [result["over_margin"][m]["share"] for m in ("0.02", "0.05", "0.1", "0.2")]
    assert shares == sorted(shares, reverse=True) and all(0 <= s < 1 for s in shares)
    assert (result["default_margin"], result["default_intervals"], result["default_window"]) == (0.1, 3, 5)


def test_false_eviction_benchmark_says_when_the_local_cluster_is_down(monkeypatch, capsys, tmp_path):
    """Its full run is the eviction test's reference (tests/training/test_slurm_eviction.py); without a cluster it
    says so, with the command, before submitting anything."""
    from benchmarks.false_eviction import __main__ as false_eviction
    from local_cluster.client import LocalCluster

    monkeypatch.setattr(LocalCluster, "is_up", lambda self: False)
    assert false_eviction.main(["--runs", "1", "--out", str(tmp_path / "out.json")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "error: the local cluster is not up — run `local_cluster/cluster.sh up` first"
    assert not (tmp_path / "out.json").exists()
