"""The jobs bundle is self-sufficient: what the head node runs from it needs nothing of the repository.

The bundle is put together from prod's synthesized assets exactly as the cluster stack's JobsBundle
deployment ships it (jobs/ less the excludes, the generated files, requirements-jobs.txt), in a
folder of its own; its commands run there with only that folder on PYTHONPATH. A static check keeps
every module under jobs/ from importing the repository's other packages, which the bundle lacks.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_config.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
# The repository's packages beside jobs/: the infrastructure, the local cluster, benchmarks, tests.
NOT_IN_THE_BUNDLE = ("cluster_config", "stacks", "local_cluster", "benchmarks", "tests", "app")


def shipped_bundle(synth, dest: Path) -> Path:
    """The JobsBundle deployment's sources, as staged at synth, unpacked in order into ``dest``."""
    found = synth.resources("cluster", "Custom::CDKBucketDeployment").values()
    [jobs] = [d["Properties"] for d in found if d["Properties"]["DestinationBucketKeyPrefix"] == "jobs/"]
    for key in jobs["SourceObjectKeys"]:
        shutil.copytree(synth.outdir / f"asset.{key.removesuffix('.zip')}", dest, dirs_exist_ok=True)
    return dest


def imported_packages(path: Path) -> set[str]:
    """Top-level names ``path`` imports anywhere (in functions too); relative imports stay in the bundle."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_module_of_the_bundle_imports_the_repositorys_other_packages():
    for name in NOT_IN_THE_BUNDLE:
        assert (REPO / name).is_dir() or (REPO / f"{name}.py").is_file(), name  # the list names real packages
    found = [f"{path.relative_to(REPO)} imports {name}"
             for path in sorted((REPO / "jobs").rglob("*.py"))
             for name in sorted(imported_packages(path) & set(NOT_IN_THE_BUNDLE))]
    assert not found, "the jobs bundle ships without these packages:\n" + "\n".join(found)


@pytest.mark.slow
def test_the_shipped_bundle_runs_the_dry_run_and_the_status_without_the_repository(prod_synth, tmp_path):
    jobs = shipped_bundle(prod_synth, tmp_path / "bundle" / "jobs")
    assert json.loads((jobs / "models" / "cluster.json").read_text())["environment"] == "prod"
    # squeue may reach a local test cluster here: the status of a cluster with no jobs queued.
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    (stand_ins / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (stand_ins / "squeue").chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key not in ("JOBS_DIR", "PYTHONPATH", "PYTHONHOME")}
    env |= {"PYTHONPATH": str(jobs), "PATH": f"{stand_ins}:{env['PATH']}", "OMP_NUM_THREADS": "1",
            "FSX_LOGS": str(tmp_path / "logs"), "FSX_CHECKPOINTS": str(tmp_path / "checkpoints")}

    def run(*args: str) -> subprocess.CompletedProcess:
        # cwd: the folder holding the bundle, as python -m puts it on the path; not the repository.
        return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)

    for package in ("cluster_config", "stacks"):
        probe = run("-c", f"import {package}")
        assert probe.returncode == 1 and f"No module named '{package}'" in probe.stderr, probe.stderr

    dry = run("-m", "training.dry_run", "model1", "--env", "prod", "--json")
    assert dry.returncode == 0, dry.stderr[-3000:]
    report = json.loads(dry.stdout.splitlines()[-1])
    assert (report["model"], report["world_size"], report["layout"]) == ("model1", 32, "HSDP 32 (shards of 8)")
    assert report["fits"] and round(report["gpu_memory_gib"]) == 140

    prod = load_settings("prod")
    for args in (("--env", "prod"), ()):  # the file named, and the bundle's own by default
        status = run("-m", "training.status", "--json", *args)
        assert status.returncode == 0, status.stderr[-3000:]
        rows = json.loads(status.stdout)
        assert [row["name"] for row in rows] == [model.name for model in prod.models]
        assert [row["total_steps"] for row in rows] == [model.steps for model in prod.models]  # from models/<model>.yaml
        assert all(row["dollars"] == 0 for row in rows)  # priced: nothing trained yet
