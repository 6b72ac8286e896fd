"""The app as a whole: stack names and environments, cdk-nag, cfn-lint, errors at synth (``make synth``: tests/test_make.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3

from cluster_config.settings import available_environments
from stacks import nag

ROOT = Path(__file__).resolve().parents[2]


def test_stacks_are_named_per_environment_and_pinned_to_its_account_and_region(each_env):
    settings = each_env.settings
    manifest = json.loads((each_env.outdir / "manifest.json").read_text())
    for part in ("network", "storage"):
        artifact = manifest["artifacts"][f"llm-{settings.name}-{part}"]
        assert artifact["environment"] == f"aws://{settings.account}/{settings.region}"


def test_every_stack_passes_cdk_nag_with_reasons_for_what_it_accepts(each_env):
    # The fixture's synth already raised on any unacknowledged finding; the report shows the rest.
    report = json.loads((each_env.outdir / "validation-report.json").read_text())
    plugins = {p["pluginName"]: p for p in report["pluginReports"]}
    assert plugins, "no validation plugin ran"
    for plugin in plugins.values():
        assert plugin["conclusion"] == "success"
        assert plugin["violations"] == []
        for accepted in plugin.get("suppressedViolations", []):
            assert len(accepted["reason"].split()) >= 5, accepted


def test_cdk_nag_fails_synth_on_a_finding(tmp_path):
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "careless")
    s3.Bucket(stack, "PlainBucket")
    nag.add_checks(app)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    (plugin,) = report["pluginReports"]
    assert plugin["conclusion"] == "failure"
    # No access logs, no TLS enforcement.
    assert {v["ruleName"] for v in plugin["violations"]} == {"AwsSolutions-S1", "AwsSolutions-S10"}


def test_acknowledgements_need_a_reason():
    stack = cdk.Stack(cdk.App(), "s")
    with pytest.raises(ValueError, match="needs a reason"):
        nag.acknowledge(stack, "AwsSolutions-S1", "ok")


def test_cfn_lint_finds_nothing_in_any_template(each_env):
    templates = sorted(each_env.outdir.glob("*.template.json"))
    assert len(templates) >= 2
    result = subprocess.run(
        [Path(sys.executable).with_name("cfn-lint"), "--regions", each_env.settings.region, "--", *templates],
        cwd=ROOT,  # reads .cfnlintrc.yaml
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def run_app(**context) -> subprocess.CompletedProcess:
    """Run app.py the way the CDK CLI does: context in CDK_CONTEXT_JSON."""
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(context), "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    return subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_unknown_environment_fails_synth_listing_the_environments():
    result = run_app(env="missing")
    assert result.returncode == 2  # bad input (docs/cli.md)
    assert "error: no environment 'missing'" in result.stderr
    assert f"Available: {', '.join(available_environments())}" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_environment_fails_synth_asking_for_one():
    result = run_app()
    assert result.returncode == 2
    available = ", ".join(available_environments())
    assert f"error: no environment chosen: pass -c env=NAME (available: {available})" in result.stderr
    assert "Traceback" not in result.stderr



def test_the_app_prints_the_plan_and_the_stacks_print_nothing(capfd, tmp_path):
    from stacks.app import build_app

    build_app("dev", outdir=str(tmp_path))  # every stack constructed, as each test and synth does
    assert "Plan for dev" not in "".join(capfd.readouterr())
    result = run_app(env="dev")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("Plan for dev: ") == 1


def test_synth_is_byte_identical_from_one_run_to_the_next(each_env, tmp_path):
    # A second synth in a process of its own (another hash seed, other object addresses): any text
    # that differs (an object's repr in a description, a set's order) would make every deploy
    # replace the resources that hold it.
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps({"env": each_env.settings.name}), "CDK_OUTDIR": str(tmp_path),
           "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    result = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    first, second = (sorted(p.relative_to(out) for p in out.rglob("*.template.json")) for out in (each_env.outdir, tmp_path))
    assert first == second and first
    for name in first:
        assert (each_env.outdir / name).read_bytes() == (tmp_path / name).read_bytes(), f"{name} differs between synths"
