"""checkov over every environment's synthesized templates: each failure is accepted in stacks/checkov.py
with a reason, or the test fails. The data bucket's missing versioning was such a failure."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from stacks import checkov

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def checkov_venv():
    subprocess.run([str(checkov.REPO_ROOT / "scripts" / "install_tool_venv.sh"), ".venv-checkov", "requirements-checkov.txt"],
                   check=True, capture_output=True)


@pytest.fixture(scope="session")
def findings(checkov_venv, synthesize):
    """env -> checkov findings on that environment's templates."""
    from cluster_config.settings import available_environments

    return {env: checkov.run(synthesize(env).outdir) for env in available_environments()}


def test_every_checkov_failure_is_accepted_with_a_reason(findings):
    for env, (found, summary) in findings.items():
        print(f"{env}: checkov {summary['passed']} passed, {summary['failed']} failed, all accepted")
        assert summary["passed"] > 100
        assert [f for f in found if not f.reason] == [], env


def test_every_accepted_check_still_fails_somewhere(findings):
    """An acceptance nothing needs any more is stale: remove it from stacks/checkov.py."""
    found = [f for env_findings, _ in findings.values() for f in env_findings]
    for check_id, (prefixes, _) in checkov.ACCEPTED.items():
        for prefix in prefixes:
            assert any(f.check_id == check_id and f.logical_id.startswith(prefix) for f in found), (check_id, prefix)


def test_an_unversioned_data_bucket_fails(checkov_venv, prod, tmp_path):
    storage = prod.stacks["storage"]
    template = prod.template_json("storage")
    data_bucket = storage.get_logical_id(storage.data_bucket.node.default_child)
    del template["Resources"][data_bucket]["Properties"]["VersioningConfiguration"]
    (tmp_path / "storage.template.json").write_text(json.dumps(template))
    found, _ = checkov.run(tmp_path)
    assert [(f.check_id, f.reason) for f in found if f.logical_id == data_bucket] == [("CKV_AWS_21", None)]


def test_create_cluster_adds_no_unaccepted_finding(checkov_venv, tmp_path):
    from stacks.app import build_app
    from tests.settings_files import write_env

    config_dir = write_env(tmp_path / "settings", "dev", create_cluster=True).parent
    outdir = tmp_path / "cdk"
    build_app("dev", config_dir=config_dir, outdir=str(outdir)).app.synth()
    for path in outdir.iterdir():  # only the templates: checkov would also read the staged assets
        if path.is_dir():
            shutil.rmtree(path)
    found, _ = checkov.run(outdir)
    assert [f for f in found if not f.reason] == []
