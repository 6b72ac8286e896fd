"""Each model's Lustre project quota on the checkpoint file system: sized from the plan (cluster_config/quotas.py),
rendered as lfs commands and run by the head node's setup (node_scripts/fsx_quotas.sh, from directory_setup.sh).
This machine has no Lustre, and its /fsx (a folder on the root ext4, mounted without prjquota) enforces no project
quota: the commands are checked as written, with a stand-in lfs that records them. What a full quota does to a
save is tested in tests/training/test_checkpoint.py (the trainer names the quota)."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from cluster_config.plan import build_plan
from cluster_config.quotas import checkpoint_quotas_gib, quotas_file
from cluster_config.settings import load_settings, model_uid

SCRIPT = Path(__file__).resolve().parents[2] / "node_scripts/fsx_quotas.sh"


@pytest.fixture(scope="module")
def prod():
    return load_settings("prod")


def quotas(tmp_path: Path, text: str, *args: str, lfs: bool = False) -> subprocess.CompletedProcess:
    (tmp_path / "quotas").write_text(text)
    env = None
    if lfs:  # Lustre's lfs is not here: a stand-in that records its arguments
        (tmp_path / "bin").mkdir(exist_ok=True)
        # `lfs project -d` answers as for a folder that carries model2's id and the inherit flag already
        (tmp_path / "bin/lfs").write_text(
            f'#!/bin/sh\nif [ "$1 $2" = "project -d" ]; then case $3 in */model2) echo " {model_uid("model2")} P $3";; '
            f'*) echo " 0 - $3";; esac; exit 0; fi\necho "lfs $*" >> {tmp_path}/lfs_calls\n')
        (tmp_path / "bin/lfs").chmod(0o755)
        env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    return subprocess.run(["bash", str(SCRIPT), *args, "--checkpoints", str(tmp_path / "checkpoints"),
                           str(tmp_path / "quotas")], capture_output=True, text=True, env=env, timeout=30)


def test_each_models_quota_is_its_plan_peak_and_one_checkpoint_more(prod):
    lines = [line.split() for line in quotas_file(prod).splitlines() if not line.startswith("#")]
    rows = {row.name: row for row in build_plan(prod).rows}
    assert [name for name, _, _ in lines] == [m.name for m in prod.models]
    for name, project, gib in lines:
        row = rows[name]  # checkpoint.keep complete + 1 in flight, + 1: a failed save left on disk, the exports
        assert int(gib) == math.ceil(row.checkpoint_bytes * (row.checkpoints_kept + 1) / 2**30)
        assert int(project) == model_uid(name)  # the model user's uid: the same on every node
    # docs/cluster.md quotes prod's: 771 GiB a checkpoint of model7's, keep 2, so 4 checkpoints
    assert {n: int(g) for n, _, g in lines} == {"model1": 377, "model2": 377, "model3": 728, "model4": 728,
                                                "model5": 1035, "model6": 1035, "model7": 3084}


def test_the_quotas_are_written_as_lfs_commands_and_run_on_lustre(prod, tmp_path):
    text = quotas_file(prod)
    for name in (m.name for m in prod.models):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    printed = quotas(tmp_path, text, "--print")
    assert printed.returncode == 0, printed.stderr
    mount = tmp_path / "checkpoints"
    gib = checkpoint_quotas_gib(prod)
    assert printed.stdout.splitlines() == [
        line for m in prod.models for line in (f"lfs project -p {model_uid(m.name)} -s -r {mount}/{m.name}",
                                               f"lfs setquota -p {model_uid(m.name)} -B {gib[m.name]}G {mount}")]
    ran = quotas(tmp_path, text, lfs=True)
    assert ran.returncode == 0, ran.stderr
    # What runs is what was printed, less the walk of the folder that carries its id already (model2's).
    walk = f"lfs project -p {model_uid('model2')} -s -r {mount}/model2\n"
    assert (tmp_path / "lfs_calls").read_text() == printed.stdout.replace(walk, "")
    assert f"fsx_quotas: model7: project {model_uid('model7')}, at most {gib['model7']} GiB on {mount}" in ran.stdout


@pytest.mark.parametrize("line, message", [
    ("model1 40862\n", "'model1 40862 ' is not '<model> <project id> <GiB>'"),
    ("model1 40862 1.5\n", "'model1 40862 1.5' is not '<model> <project id> <GiB>'"),
    ("model9 1234 5\n", "checkpoints/model9 does not exist: directory_setup.sh makes it before the quotas"),
])
def test_a_bad_quotas_file_sets_nothing(tmp_path, line, message):
    (tmp_path / "checkpoints/model1").mkdir(parents=True)
    result = quotas(tmp_path, line, lfs=True)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "lfs_calls").exists()
