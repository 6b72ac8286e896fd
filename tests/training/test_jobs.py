"""The training sbatch payloads: train.sh and each model's generated jobs/train_<model>.sh are
shellcheck-clean, thin, and share one safe block of directives (what each script says per model:
tests/cluster_config/test_model_jobs.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_config.model_jobs import write_job_files
from cluster_config.settings import available_environments, load_settings

REPO = Path(__file__).resolve().parents[2]


def directives(path: Path) -> dict[str, str]:
    found = re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", path.read_text(), flags=re.M)
    return {name: value for name, value in found}


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> list[Path]:
    """Every environment's model scripts, written as the stack ships them."""
    out = []
    for env in available_environments():
        jobs = tmp_path_factory.mktemp(env)
        out += [path for path in write_job_files(load_settings(env), jobs) if path.suffix == ".sh"]
    return out


def test_shellcheck_clean(scripts):
    shellcheck = Path(sys.executable).with_name("shellcheck")
    result = subprocess.run([str(shellcheck), "-S", "warning", "-x", "jobs/train.sh", *map(str, scripts)],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_common_directives_are_identical_and_safe(scripts):
    # the USR1 lead is the environment's: two rounds of all its models' saves (cluster_config/slurm_timeouts.py)
    per_model = ("job-name", "nodes", "account", "qos", "output", "error", "gpus-per-node", "time-min", "signal")
    common = [{k: v for k, v in directives(p).items() if k not in per_model} for p in scripts]
    assert len(scripts) == 9 and all(c == common[0] for c in common)  # prod's seven, dev's two
    c = common[0]
    assert {"exclusive", "requeue", "no-kill"} <= set(c) and c["open-mode"] == "append" and c["ntasks-per-node"] == "1"
    for path in scripts:
        lead = int(re.fullmatch(r"USR1@(\d+)", directives(path)["signal"]).group(1))  # not B:, so the workers get it
        assert lead >= 600
    for path in scripts:  # thin: directives, then hand over to train.sh with the model name
        body = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
        fewer = [line for line in body if line.startswith("export MIN_TRAIN_NODES=")]  # prod's: models.<m>.min_nodes
        assert all(re.fullmatch(r'export MIN_TRAIN_NODES="\$\{MIN_TRAIN_NODES:-\d+\}"  # .+', line) for line in fewer)
        body = [line for line in body if line not in fewer]
        assert body == ["set -euo pipefail",
                        f'export TRAIN_TIME_LIMIT="${{TRAIN_TIME_LIMIT:-{c["time"]}}}"  # --time above, for train.sh\'s requeue',
                        'export HOT_SPARES="${HOT_SPARES:-0}"  # of --nodes above, the nodes held for recovery: the others train',
                        f'exec bash "${{JOBS_DIR:-${{SLURM_SUBMIT_DIR:-$PWD}}/jobs}}/train.sh" {path.stem[6:]} "$@"']
