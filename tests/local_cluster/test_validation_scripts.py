"""Shell payloads of the cluster validation: lint, and behaviour on a machine without GPUs or EFA."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ["jobs/env.sh", "jobs/test_2nodes.sh", "jobs/collectives.sh", "jobs/nccl_tests.sh",
           "jobs/validate_gpu_efa.sh", "jobs/export.sh", "local_cluster/cluster.sh", "local_cluster/node_boot.sh",
           "local_cluster/health_check.sh", "local_cluster/stand_ins/aws", "local_cluster/stand_ins/dnf", "local_cluster/demo.sh"]
SHELLCHECK = Path(sys.executable).parent / "shellcheck"
HAS_GPU_TOOLS = bool(shutil.which("nvidia-smi") or shutil.which("fi_info")
                     or Path("/opt/amazon/efa/bin/fi_info").exists())


@pytest.mark.parametrize("script", SCRIPTS)
def test_shellcheck_clean(script):
    result = subprocess.run([str(SHELLCHECK), "-x", "-S", "warning", script], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_comment_inside_a_continued_command(script):
    # A comment line after "\" ends the command there; the following options become a new command.
    text = (REPO / script).read_text()
    assert not re.search(r"\\\n\s*#", text), f"{script}: comment after a line continuation"


def run_payload(script: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(["bash", script], cwd=REPO, env={**env, "JOBS_DIR": str(REPO / "jobs")},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(HAS_GPU_TOOLS, reason="this machine has NVIDIA/EFA tools")
def test_validate_gpu_efa_fails_clearly_without_gpu_and_efa_tools():
    result = run_payload("jobs/validate_gpu_efa.sh")
    assert result.returncode == 1
    assert "FAIL gpus: nvidia-smi not found" in result.stdout
    assert "FAIL efa: fi_info not found" in result.stdout
    assert "FAIL nvlink: nvidia-smi not found" in result.stdout
    assert "check(s) FAILED" in result.stdout


@pytest.mark.skipif(HAS_GPU_TOOLS, reason="this machine has NVIDIA/EFA tools")
def test_nccl_tests_refuses_to_run_without_gpus():
    result = run_payload("jobs/nccl_tests.sh")
    assert result.returncode == 1
    assert "no NVIDIA GPU" in result.stderr and "nvidia-smi not found" in result.stderr


def test_cluster_script_rejects_unknown_commands():
    result = subprocess.run([str(REPO / "local_cluster" / "cluster.sh"), "restart"], capture_output=True, text=True)
    assert result.returncode == 2 and "error: unknown command 'restart' — usage:" in result.stderr
