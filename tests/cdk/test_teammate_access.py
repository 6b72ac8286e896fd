"""A teammate enters as their model (stacks/teammate_access.py): one Session Manager role per model, tagged with
the model's Unix user for Run As, allowed to start sessions on this cluster's head node only and with the shell
document only, unable to change its tag. The app synthesizes with cdk-nag (the fixture fails on a finding)."""

from __future__ import annotations

import json
from pathlib import Path

from stacks.teammate_access import CLUSTER_NAME_TAG, NODE_TYPE_TAG, RUN_AS_TAG, SHELL_DOCUMENT

REPO = Path(__file__).resolve().parents[2]


def _role(prod, model: str) -> dict:
    stack = prod.stacks["cluster"]
    logical_id = stack.get_logical_id(stack.teammate_access.roles[model].node.default_child)
    return prod.template_json("cluster")["Resources"][logical_id]["Properties"]


def _statements(prod) -> dict[str, dict]:
    stack = prod.stacks["cluster"]
    logical_id = stack.get_logical_id(stack.teammate_access.policy.node.default_child)
    document = prod.template_json("cluster")["Resources"][logical_id]["Properties"]["PolicyDocument"]
    return {s["Sid"]: s for s in document["Statement"]}


def _text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        return "".join(_text(part) for part in value["Fn::Join"][1])
    return "<" + next(iter(value.values())) + ">" if isinstance(value, dict) and "Ref" in value else json.dumps(value)


def test_each_models_role_runs_as_its_own_user_and_no_other(prod):
    models = [model.name for model in prod.settings.models]
    assert len(models) >= 2 and sorted(prod.stacks["cluster"].teammate_access.roles) == sorted(models)
    run_as = {}
    for model in models:
        role = _role(prod, model)
        tags = {tag["Key"]: tag["Value"] for tag in role["Tags"]}
        run_as[model] = tags[RUN_AS_TAG]
        assert role["RoleName"] == f"{prod.settings.cluster_name}-{model}-session"
        assert role["MaxSessionDuration"] == 3600
        # Assumed with sts:AssumeRole alone: no sts:TagSession, so no session tag can name another user.
        (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
        assert trust["Action"] == "sts:AssumeRole"
    assert run_as == {model: model for model in models}  # a second model's role cannot run as the first's
    outputs = prod.template_json("cluster")["Outputs"]
    for model in models:  # the ARN an administrator grants sts:AssumeRole on
        assert any(key.startswith(f"TeammateAccess{model}SessionRoleArn") for key in outputs), model
    assert len(set(run_as.values())) == len(models)


def test_sessions_start_only_on_the_head_node_with_the_shell_document(prod):
    statements = _statements(prod)
    starts = [s for s in statements.values() if "ssm:StartSession" in s["Action"]]
    assert {s["Sid"] for s in starts} == {"StartSessionOnHeadNode", "StartSessionShellOnly"}
    on_node = statements["StartSessionOnHeadNode"]
    assert _text(on_node["Resource"]).endswith(":instance/*")
    assert on_node["Condition"]["StringEquals"] == {f"ssm:resourceTag/{CLUSTER_NAME_TAG}": prod.settings.cluster_name,
                                                    f"ssm:resourceTag/{NODE_TYPE_TAG}": "HeadNode"}
    document = statements["StartSessionShellOnly"]
    assert _text(document["Resource"]).endswith(f":document/{SHELL_DOCUMENT}")
    for statement in starts:  # the document is always checked against the policy
        assert statement["Condition"]["BoolIfExists"] == {"ssm:SessionDocumentAccessCheck": "true"}
    actions = {a for s in statements.values() for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    # Nothing that changes a role or its tags, runs commands, or opens other documents' sessions.
    assert not [a for a in actions if a.startswith(("iam:", "sts:")) or a in ("ssm:SendCommand", "ssm:*")]
    assert all(s["Effect"] == "Allow" for s in statements.values())
    assert _text(statements["OwnSessions"]["Resource"]).endswith(":session/${aws:userid}-*")


def test_the_preferences_docs_deploy_md_installs_turn_run_as_on_and_keep_ssm_user_for_everyone_else():
    preferences = json.loads((REPO / "stacks/session_manager_preferences.json").read_text())
    assert preferences["sessionType"] == "Standard_Stream" and preferences["schemaVersion"] == "1.0"
    assert preferences["inputs"]["runAsEnabled"] is True and preferences["inputs"]["runAsDefaultUser"] == "ssm-user"
    deploy = (REPO / "docs/deploy.md").read_text()
    assert f"--name {SHELL_DOCUMENT} --document-type Session --content file://stacks/session_manager_preferences.json" in deploy
