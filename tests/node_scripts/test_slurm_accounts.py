"""slurm_accounts.sh refuses a bad model list before it changes anything in the database.

Its work against a real slurmdbd is tested on the local cluster (tests/local_cluster/test_accounting.py).
"""

import re
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "node_scripts" / "slurm_accounts.sh"


@pytest.mark.parametrize("listing, message", [
    ("model1\n", "model 'model1' in .* has no node count \\(want '<name> <nodes>'"),
    ("model1 0\n", "model 'model1' in .* has no node count"),
    ("Model1 2\n", "model name 'Model1' .* is not lowercase"),
    ("ops 2\n", "'ops' in .* is the account of the non-training jobs"),
    ("model1 2\nmodel1 3\n", "model 'model1' is listed twice"),
])
def test_bad_model_list_is_refused_with_the_fix(tmp_path, listing, message):
    models = tmp_path / "models"
    models.write_text(listing)
    # No Slurm here: PATH holds no sacctmgr, so reaching the database would fail differently.
    result = subprocess.run(["/bin/bash", str(SCRIPT), "--operator", "nobody", str(models)], capture_output=True, text=True,
                            env={"PATH": "/nonexistent", "HOME": str(tmp_path)})
    assert result.returncode == 1
    assert result.stderr.startswith("slurm_accounts: error: ")
    assert re.search(message, result.stderr), result.stderr


def test_usage_and_missing_file(tmp_path):
    assert subprocess.run(["bash", str(SCRIPT)], capture_output=True).returncode == 2
    missing = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "none")], capture_output=True, text=True)
    assert missing.returncode == 1 and "cannot read the model list" in missing.stderr
