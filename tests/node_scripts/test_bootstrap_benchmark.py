"""The head-node bootstrap benchmark runs (`make bench` measures it with pip; here the quick
stand-in for the packages), so it cannot rot unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.marks import needs_mount_namespace

REPO = Path(__file__).resolve().parents[2]


@needs_mount_namespace  # tmpfs mounts in a private mount namespace
def test_bootstrap_benchmark_times_every_head_node_step_against_the_timeout(tmp_path):
    out = tmp_path / "node_bootstrap.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.node_bootstrap", "--stand-in-packages", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    result = json.loads(out.read_text())
    assert set(result["steps_s"]) >= {"jobs bundle", "jobs venv", "health hooks", "jobs venv check"}, result
    assert result["head_node_bootstrap_timeout_s"] >= 2100
    assert result["timeout_over_measured"] > 1
    assert "HeadNodeBootstrapTimeout" in proc.stdout
