"""Synthesize each environment's CDK app once per test session (jsii start-up and cdk-nag are slow)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk.assertions import Template  # noqa: E402  (after the environment variable above)

from cluster_config.settings import Settings, available_environments  # noqa: E402
from stacks.app import build_app  # noqa: E402


@dataclass
class SynthesizedApp:
    settings: Settings
    outdir: Path
    stacks: dict  # name -> cdk.Stack, as built by stacks.app
    templates: dict[str, Template]  # name -> its synthesized template

    def template_json(self, name: str) -> dict:
        return json.loads((self.outdir / f"{self.stacks[name].artifact_id}.template.json").read_text())


@pytest.fixture(scope="session")
def synthesize(tmp_path_factory):
    """``synthesize(env_name)``: the app of ``env_name`` synthesized (with cdk-nag), built once per session."""
    built: dict[str, SynthesizedApp] = {}

    def get(env_name: str) -> SynthesizedApp:
        if env_name not in built:
            outdir = tmp_path_factory.mktemp(f"cdk-{env_name}")
            cdk_app = build_app(env_name, outdir=str(outdir))
            cdk_app.app.synth()  # raises if cdk-nag or CloudFormation validation finds anything
            built[env_name] = SynthesizedApp(
                settings=cdk_app.settings,
                outdir=outdir,
                stacks=cdk_app.stacks,
                templates={
                    name: Template.from_json(json.loads((outdir / f"{stack.artifact_id}.template.json").read_text()))
                    for name, stack in cdk_app.stacks.items()
                },
            )
        return built[env_name]

    return get


@pytest.fixture(scope="session")
def dev(synthesize) -> SynthesizedApp:
    return synthesize("dev")


@pytest.fixture(scope="session")
def prod(synthesize) -> SynthesizedApp:
    return synthesize("prod")


@pytest.fixture(scope="session", params=available_environments())
def each_env(request, synthesize) -> SynthesizedApp:
    return synthesize(request.param)
