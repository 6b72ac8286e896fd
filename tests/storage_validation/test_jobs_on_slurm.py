"""Both storage jobs on the local Slurm cluster, with the tools this machine has (fio, CPU), submitted as the
cluster's user from the bundle, as docs/storage_validation.md has it: their reports and work files go where
the node setup lets that user write."""

import json
import shutil

import pytest

from local_cluster.client import CLUSTER_USER, as_user, submitted
from local_cluster.demo_data import build as build_demo_data

pytestmark = pytest.mark.slurm

# The scripts ask for whole nodes; here the user's other jobs may share them, and the assertions do not
# depend on the figures being undisturbed.
SHARE_NODES = "--exclusive=user"


def job_output(cluster, name: str, job: str) -> str:
    return (cluster.fsx / "logs" / "validation" / f"{name}_{job}.out").read_text()


def test_fsx_perf_job_measures_every_mount_with_fio_and_flags_the_slow_one(slurm_cluster):
    env = ("FSX_PERF_XFER=1m FSX_PERF_BLOCK=16m FSX_PERF_FILES_PER_TASK=500 FSX_PERF_SECONDS=30"
           # data and checkpoints easily beat 1 MB/s; nothing here reaches 1 TB/s, so logs is flagged.
           " FSX_EXPECTED_MB_S=/fsx/data=1,/fsx/checkpoints=1,/fsx/logs=1000000")
    # Two CPUs per local node: two tasks per node instead of the script's eight.
    job = submitted(as_user(CLUSTER_USER, f"{env} sbatch --ntasks-per-node=2 {SHARE_NODES} jobs/fsx_perf.sh"))
    state, code = slurm_cluster.wait(job, timeout=600)
    output = job_output(slurm_cluster, "fsx-perf", job)
    assert (state, code) == ("FAILED", 1), output  # 1: a mount below its threshold (docs/cli.md)

    report_dir = slurm_cluster.fsx / "logs" / "fsx_perf" / job  # the default, /fsx/logs/fsx_perf/<job>
    assert report_dir.owner() == CLUSTER_USER
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
    for mount in ("data", "checkpoints", "logs"):
        assert not list((slurm_cluster.fsx / mount).glob(f".fsx_perf/{job}")), f"work files left behind in /fsx/{mount}"
    shutil.rmtree(report_dir)


def test_input_diagnosis_job_gives_a_verdict_with_its_numbers(slurm_cluster):
    build_demo_data(slurm_cluster.fsx / "data" / "tokenized/sample")  # what tiny.yaml trains on
    job = submitted(as_user(CLUSTER_USER, f"sbatch {SHARE_NODES} jobs/input_diagnosis.sh --steps 6 --batches 50"))
    state, code = slurm_cluster.wait(job, timeout=600)
    output = job_output(slurm_cluster, "input-diagnosis", job)
    assert (state, code) == ("COMPLETED", 0), output

    report_dir = slurm_cluster.fsx / "logs" / "input_diagnosis" / job  # the default, /fsx/logs/input_diagnosis/<job>
    assert report_dir.owner() == CLUSTER_USER
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
