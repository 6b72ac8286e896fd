"""Deploy-true fixtures: ParallelCluster's own venv, and each environment synthesized and checked once per session.

``synthesized(env)`` -> (settings, stacks, templates, outdir) of one synth; ``report(env)`` -> the
``cluster_config.emulated.check.Report`` of that environment's emulated deploy; ``pcluster_validated(env,
edit_config)`` -> the Report of one with its rendered config edited.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from cluster_config.emulated.check import REPO_ROOT

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


@pytest.fixture(scope="session")
def pcluster_venv():
    """ParallelCluster 3.16.1 in .venv-pcluster (scripts/install_tool_venv.sh is idempotent)."""
    subprocess.run([str(REPO_ROOT / "scripts" / "install_tool_venv.sh"), ".venv-pcluster", "requirements-pcluster.txt"],
                   check=True, capture_output=True)


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory):
    """``synthesized(env)`` -> (settings, stacks, templates), one synth per environment per session."""
    from stacks.app import build_app  # imports aws_cdk (jsii start) only when needed

    built = {}

    def get(env: str):
        if env not in built:
            outdir = tmp_path_factory.mktemp(f"cdk-{env}")
            app = build_app(env, outdir=str(outdir))
            app.app.synth()
            templates = {part: json.loads((outdir / f"{stack.artifact_id}.template.json").read_text())
                         for part, stack in app.stacks.items()}
            built[env] = (app.settings, app.stacks, templates, outdir)
        return built[env]

    return get


@pytest.fixture(scope="session")
def report(pcluster_venv, synthesized):
    """``report(env)``: the deploy-true check of a shipped environment, run once per session."""
    from cluster_config.emulated.check import check_environment, format_report

    reports = {}

    def get(env: str):
        if env not in reports:
            settings, stacks, templates, _ = synthesized(env)
            reports[env] = check_environment(settings, stacks, templates, with_iam=True)
            print(format_report(reports[env]))
        return reports[env]

    return get


@pytest.fixture(scope="session")
def pcluster_validated(pcluster_venv, synthesized):
    """``pcluster_validated(env, edit_config=...)``: a shipped environment's emulated deploy with its rendered
    config edited first (a mistake the settings now refuse, re-created), no update checks."""
    from cluster_config.emulated.check import check_environment

    def get(env: str, edit_config):
        settings, stacks, templates, _ = synthesized(env)
        return check_environment(settings, stacks, templates, with_updates=False, edit_config=edit_config)

    return get
