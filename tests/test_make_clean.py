"""`make clean` removes build outputs only: in a scratch clone of this checkout (the working tree's files,
committed there), it deletes no tracked file, keeps installs and benchmark results, and removes cdk.out/ and
the Python caches."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"]


def scratch_clone(dest: Path) -> None:
    """The files git would commit from this working tree (tracked and new, not ignored), committed in ``dest``."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    for name in files:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    subprocess.run([*GIT, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "scratch"], cwd=dest, check=True)


def test_make_clean_deletes_no_tracked_file(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    scratch_clone(repo)
    tracked = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True).stdout.split()
    assert any(p.startswith("benchmarks/results/") for p in tracked), "the committed GPU reports are part of the check"
    outputs = ["cdk.out/dev/manifest.json", ".pytest_cache/v/x", "cluster_config/__pycache__/x.pyc",
               "__pycache__/app.pyc"]
    kept = [".venv/bin/marker", ".venv-pcluster/lib/__pycache__/x.pyc", "node_modules/.installed",
            ".build/pcluster/.installed", "benchmarks/results/training.json", ".local_cluster/fsx/logs/x"]
    for name in outputs + kept:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("x")

    proc = subprocess.run(["make", "clean"], cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True,
                            text=True, check=True).stdout
    assert status == "", f"make clean changed or deleted tracked files:\n{status}"
    assert [name for name in outputs if (repo / name).exists()] == [], "make clean left build outputs"
    assert [name for name in kept if not (repo / name).exists()] == [], "make clean removed what is not a build output"
