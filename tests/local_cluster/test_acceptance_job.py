"""`sbatch jobs/acceptance.sh` on the local Slurm cluster: the day-one run, rehearsed on CPUs, typed by the
cluster's user in the bundle as docs/acceptance.md has it (run as root, its storage check once passed where
the cluster's user could not write its work files).

Two nodes of the gpu partition and one of the cpu partition (all three local nodes), gloo, the
production recipes at the tiny widths. Every check either runs or says "not measured: no GPU"; none
is missing, and the verdict is go. What only the real cluster can pass is listed in docs/acceptance.md.
"""

from __future__ import annotations

import json

import pytest

from local_cluster.client import CLUSTER_USER, as_user, submitted

pytestmark = [pytest.mark.slurm, pytest.mark.drill]

# The HSDP recipes differ only in widths, which the rehearsal replaces: one stands for them.
RECIPES = "jobs/training/configs/llama2-7b.yaml jobs/training/configs/llama2-70b.yaml"
ENV = {"ACCEPTANCE_RECIPES": RECIPES, "ACCEPTANCE_PRESET": "tiny", "ACCEPTANCE_STEPS": "8", "NPROC_PER_NODE": "2",
       # Small FSx measurements: two CPUs per node, a shared disk.
       "FSX_PERF_XFER": "1m", "FSX_PERF_BLOCK": "8m", "FSX_PERF_FILES_PER_TASK": "200", "FSX_PERF_SECONDS": "10",
       "FSX_EXPECTED_MB_S": "/fsx/data=1,/fsx/checkpoints=1,/fsx/logs=1"}
OPTIONS = "--ntasks-per-node=1 --exclusive=user"


def health_conf(cluster) -> dict:
    """The node health check as the local prolog runs it (local_cluster/cluster.sh writes the file)."""
    return {"HEALTH_CONF": str(cluster.repo / ".local_cluster/opt/slurm/etc/llm/health.conf")}


def test_acceptance_runs_every_check_and_says_go_on_cpus(slurm_cluster):
    env = " ".join(f"{name}='{value}'" for name, value in {**ENV, **health_conf(slurm_cluster)}.items())
    job = submitted(as_user(CLUSTER_USER, f"{env} sbatch {OPTIONS} jobs/acceptance.sh"))
    state, code = slurm_cluster.wait(job, timeout=900)
    results = slurm_cluster.fsx / "logs" / "acceptance" / job
    output = (slurm_cluster.fsx / "logs" / "acceptance" / f"acceptance_{job}.out").read_text()
    assert (state, code) == ("COMPLETED", 0), output[-6000:]
    assert results.owner() == CLUSTER_USER

    report = json.loads((results / "report.json").read_text())
    assert report["verdict"] == "go" and report["gpu"] is False and report["job"] == job
    checks = {c["name"]: c for c in report["checks"]}
    for name, check in checks.items():  # ran and passed, or could not run without a GPU: said so
        assert check["status"] == "pass" or (check["status"] == "not measured" and check["needs_gpu"]), (name, check)
    ran = {name for name, c in checks.items() if c["status"] == "pass"}
    for layout in ("llama2-7b", "llama2-70b"):
        for what in ("run completes", "init std per parameter", "no two parameters/shards equal",
                     "loss finite and decreasing", "grad norm finite"):
            assert f"layout {layout}: {what}" in ran
    assert {"nodes: every queue boots", "nodes: the jobs venv runs on every node type",
            "drill: killed rank recovers, losses bit-identical", "drill: stalled rank detected"} <= ran
    assert any(name.startswith("storage: /fsx/data") for name in ran)
    nodes = {json.loads(p.read_text())["queue"] for p in (results / "nodes").glob("*.json")}
    assert nodes == {"gpu", "cpu"}
    drill = json.loads((results / "drill" / "drill.json").read_text())
    # Killed after its step 5, before its step 40: resumed from a checkpoint (every 4 steps) in between.
    assert drill["resumed_from_step"] in range(4, 40, 4) and drill["resumed_losses"]
    assert (results / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (results / "report.txt").read_text().startswith("acceptance: GO")
