"""Both storage jobs on the local two-node Slurm cluster, with the tools this machine has (fio, CPU)."""

import json
import shutil
import uuid

import pytest

from local_cluster.demo_data import build as build_demo_data

pytestmark = pytest.mark.slurm

# The scripts ask for whole nodes; here other tests' jobs share the two nodes, and the assertions
# do not depend on the figures being undisturbed (all jobs run as the same user).
SHARE_NODES = ["--exclusive=user"]


def job_output(cluster, name: str, job: str) -> str:
    return (cluster.fsx / "logs" / "validation" / f"{name}_{job}.out").read_text()


def test_fsx_perf_job_measures_every_mount_with_fio_and_flags_the_slow_one(slurm_cluster):
    run = uuid.uuid4().hex[:8]
    env = {"FSX_PERF_XFER": "1m", "FSX_PERF_BLOCK": "16m", "FSX_PERF_FILES_PER_TASK": "500",
           "FSX_PERF_SECONDS": "30", "FSX_PERF_OUT": f"/fsx/logs/fsx_perf_test/{run}",
           # data and checkpoints easily beat 1 MB/s; nothing here reaches 1 TB/s, so logs is flagged.
           "FSX_EXPECTED_MB_S": "/fsx/data=1,/fsx/checkpoints=1,/fsx/logs=1000000"}
    # Two CPUs per local node: two tasks per node instead of the script's eight.
    job = slurm_cluster.sbatch("jobs/fsx_perf.sh", env=env, options=["--ntasks-per-node=2", *SHARE_NODES])
    state, code = slurm_cluster.wait(job, timeout=600)
    output = job_output(slurm_cluster, "fsx-perf", job)
    assert (state, code) == ("FAILED", 1), output  # 1: a mount below its threshold (docs/cli.md)

    report_dir = slurm_cluster.fsx / "logs" / "fsx_perf_test" / run
    summary = json.loads((report_dir / "summary.json").read_text())
    assert (summary["tool"], summary["nodes"], summary["tasks_per_node"]) == ("fio", 2, 2)
    mounts = {m["mount"]: m for m in summary["mounts"]}
    assert list(mounts) == ["/fsx/data", "/fsx/checkpoints", "/fsx/logs"]
    for mount in mounts.values():
        for figure in ("write_mb_s", "read_mb_s", "creates_per_s", "stats_per_s", "removes_per_s"):
            assert mount[figure] > 0, (mount["mount"], figure)
        assert mount["fs_type"] != "lustre" and "not Lustre" in mount["notes"][0]
    assert [m["status"] for m in mounts.values()] == ["ok", "ok", "BELOW"]
    assert mounts["/fsx/logs"]["read_ratio"] < 0.8

    assert "IOR/mdtest not found" in output and "measured with fio" in output
    assert "/fsx/logs: below 80% of the provisioned 1,000,000 MB/s" in output
    assert not list((slurm_cluster.fsx / "data").glob(".fsx_perf/*")), "work files left behind"
    shutil.rmtree(report_dir)


def test_input_diagnosis_job_gives_a_verdict_with_its_numbers(slurm_cluster):
    build_demo_data(slurm_cluster.fsx / "data" / "tokenized/sample")  # what tiny.yaml trains on
    run = uuid.uuid4().hex[:8]
    job = slurm_cluster.sbatch("jobs/input_diagnosis.sh", "--steps", "6", "--batches", "50",
                               env={"INPUT_DIAGNOSIS_OUT": f"/fsx/logs/input_diagnosis_test/{run}"},
                               options=SHARE_NODES)
    state, code = slurm_cluster.wait(job, timeout=600)
    output = job_output(slurm_cluster, "input-diagnosis", job)
    assert (state, code) == ("COMPLETED", 0), output

    report_dir = slurm_cluster.fsx / "logs" / "input_diagnosis_test" / run
    report = json.loads((report_dir / "diagnosis.json").read_text())
    assert [r["num_workers"] for r in report["loader"]] == [0, 2]
    assert all(r["batches_per_s"] > 0 for r in report["loader"])
    assert report["copy"] == {"measured": False, "reason": "no GPU (CUDA not available)"}
    assert report["gds"]["available"] is False
    assert 0 <= report["training"]["data_wait_share"] < 1 and report["training"]["step_time_s"] > 0
    assert report["verdict"]["kind"] in ("loader-bound", "copy-bound", "compute-bound")
    assert f"VERDICT: {report['verdict']['kind']}" in output
    assert "host-to-device copy                " in output and "not measured: no GPU" in output
    shutil.rmtree(report_dir)
