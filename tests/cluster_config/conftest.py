"""Session fixtures: ParallelCluster's schema (installed apart from .venv) and synthesized apps."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster_config.pcluster_schema import DEFAULT_TARGET, REPO_ROOT, SchemaResult, check_configs
from cluster_config.render import ClusterResources, render_cluster_config, to_yaml
from cluster_config.settings import CONFIG_DIR, Settings, load_settings
from tests.settings_files import write_env as write_env_file

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


@pytest.fixture(scope="session")
def pcluster_schema() -> Path:
    """The separate ParallelCluster install (scripts/install_pcluster_schema.sh is idempotent)."""
    subprocess.run([str(REPO_ROOT / "scripts" / "install_pcluster_schema.sh")], check=True, capture_output=True)
    return DEFAULT_TARGET


@pytest.fixture(scope="session")
def check_schema(pcluster_schema):
    """``check_schema({name: config_dict}, settings)`` -> {name: SchemaResult}, one child process per call."""

    def check(configs: dict[str, dict], settings: Settings) -> dict[str, SchemaResult]:
        request = {name: (settings.cluster_name, settings.region, to_yaml(config)) for name, config in configs.items()}
        return {result.name: result for result in check_configs(request, pcluster_schema)}

    return check


@pytest.fixture(scope="session")
def env_results(check_schema) -> dict[str, SchemaResult]:
    """Every environment's placeholder render, checked by ParallelCluster's schema."""
    results = {}
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        settings = load_settings(path.stem)
        config = render_cluster_config(settings, ClusterResources.placeholders(settings))
        results.update(check_schema({path.stem: config}, settings))
    return results


def _write_env(config_dir: Path, env_name: str, **changes) -> Path:
    """A config dir holding ``env_name``'s settings with ``changes`` (see tests/settings_files.py); returns the dir."""
    return write_env_file(config_dir, env_name, **changes).parent


@pytest.fixture(scope="session")
def write_env():
    return _write_env


@dataclass
class Synth:
    settings: Settings
    outdir: Path
    templates: dict[str, dict]  # "network" | "storage" | "cluster" -> CloudFormation template

    def resources(self, part: str, type_: str) -> dict[str, dict]:
        return {k: v for k, v in self.templates[part]["Resources"].items() if v["Type"] == type_}


def _synth(env: str, outdir: Path, config_dir: Path = CONFIG_DIR) -> Synth:
    from stacks.app import build_app  # imports aws_cdk (jsii start) only when a test needs it

    built = build_app(env, config_dir=config_dir, outdir=str(outdir))
    built.app.synth()  # raises when cdk-nag finds anything unacknowledged
    templates = {
        part: json.loads((outdir / f"{stack.stack_name}.template.json").read_text())
        for part, stack in built.stacks.items()
    }
    return Synth(built.settings, outdir, templates)


@pytest.fixture(scope="session")
def prod_synth(tmp_path_factory) -> Synth:
    return _synth("prod", tmp_path_factory.mktemp("cdk-prod"))


@pytest.fixture(scope="session")
def dev_create_cluster_synth(tmp_path_factory) -> Synth:
    config_dir = _write_env(tmp_path_factory.mktemp("settings"), "dev", create_cluster=True)
    return _synth("dev", tmp_path_factory.mktemp("cdk-dev"), config_dir)
