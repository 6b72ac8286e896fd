"""The sbatch payloads: shellcheck-clean, one thin script per planned model, identical common block."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "jobs").glob("train_model*.sh"))
PLAN = yaml.safe_load((REPO / "cluster_config/prod.yaml").read_text())["models"]


def directives(path: Path) -> dict[str, str]:
    found = re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", path.read_text(), flags=re.M)
    return {name: value for name, value in found}


def test_shellcheck_clean():
    shellcheck = Path(sys.executable).with_name("shellcheck")
    result = subprocess.run([str(shellcheck), "-S", "warning", "-x", "jobs/train.sh", *map(str, SCRIPTS)],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_one_script_per_planned_model_with_its_nodes_and_log_paths():
    assert [p.stem.removeprefix("train_") for p in SCRIPTS] == [m["name"] for m in PLAN]
    for model in PLAN:
        d = directives(REPO / f"jobs/train_{model['name']}.sh")
        assert d["job-name"] == model["name"]
        assert d["nodes"] == str(model["nodes"])
        # Its own Slurm account and QOS (node_scripts/slurm_accounts.sh): the share Slurm enforces.
        assert d["account"] == d["qos"] == model["name"]
        # Absolute: Slurm expands no variables in --output; the folder is the model's log folder.
        assert d["output"] == f"/fsx/logs/{model['name']}/%x_%j.out"
        assert d["error"] == f"/fsx/logs/{model['name']}/%x_%j.err"
    assert sum(m["nodes"] for m in PLAN) == 80


def test_common_directives_are_identical_and_safe():
    common = [{k: v for k, v in directives(p).items() if k not in ("job-name", "nodes", "account", "qos", "output", "error")}
              for p in SCRIPTS]
    assert all(c == common[0] for c in common)
    c = common[0]
    assert {"exclusive", "requeue"} <= set(c) and c["open-mode"] == "append" and c["ntasks-per-node"] == "1"
    lead = int(re.fullmatch(r"USR1@(\d+)", c["signal"]).group(1))  # not B:, so the workers get it
    assert lead >= 300
    for path in SCRIPTS:  # thin: directives, then hand over to train.sh with the model name
        body = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
        assert body == ["set -euo pipefail",
                        f'exec bash "${{JOBS_DIR:-${{SLURM_SUBMIT_DIR:-$PWD}}/jobs}}/train.sh" {path.stem[6:]} "$@"']
