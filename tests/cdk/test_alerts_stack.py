"""The alerts stack: rules in Amazon Managed Service for Prometheus, alerts through an encrypted SNS topic to
each alerts.email address, the head node's policy for its agent, and how the cluster stack wires them."""

from __future__ import annotations

import json
import shutil
import subprocess

import aws_cdk as cdk
import pytest
import yaml
from aws_cdk.assertions import Match, Template

from cluster_config.monitoring import RULES_DIR, RuleFilesError, load_rule_files
from cluster_config.settings import load_settings
from stacks.alerts_stack import AlertsStack
from stacks.app import build_app
from tests.settings_files import write_env

TOPIC_ARN = "arn:aws:sns:ap-southeast-3:222222222222:llm-prod-alerts"  # stands in for the topic's Ref
TWO_RULES = {"a": "groups:\n  - name: a\n    rules: []\n", "b": "groups:\n  - name: b\n    rules: []\n"}


def alerts_template(emails: list[str]) -> Template:
    settings = load_settings("prod")
    settings = settings.model_copy(update={"alerts": settings.alerts.model_copy(update={"email": emails})})
    stack = AlertsStack(cdk.App(), "alerts", settings=settings, rule_files=TWO_RULES,
                        env=cdk.Environment(account=settings.account, region=settings.region))
    return Template.from_stack(stack)


def only(template: Template, kind: str) -> tuple[str, dict]:
    (found,) = template.find_resources(kind).items()
    return found


def definition(prod) -> dict:
    """The workspace's alert manager definition with the topic's Ref as TOPIC_ARN, parsed."""
    topic_id, _ = only(prod.templates["alerts"], "AWS::SNS::Topic")
    _, workspace = only(prod.templates["alerts"], "AWS::APS::Workspace")
    separator, parts = workspace["Properties"]["AlertManagerDefinition"]["Fn::Join"]
    assert [p for p in parts if not isinstance(p, str)] == [{"Ref": topic_id}]
    text = separator.join(p if isinstance(p, str) else TOPIC_ARN for p in parts)
    document = yaml.safe_load(text)
    return {"templates": document["template_files"]["llm.tmpl"], "config": yaml.safe_load(document["alertmanager_config"])}


def test_the_topic_is_encrypted_with_a_rotating_customer_key_that_amp_may_use(prod):
    template = prod.templates["alerts"]
    key_id, key = only(template, "AWS::KMS::Key")
    _, topic = only(template, "AWS::SNS::Topic")
    assert topic["Properties"]["KmsMasterKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    assert key["Properties"]["EnableKeyRotation"] is True
    amp = [s for s in key["Properties"]["KeyPolicy"]["Statement"] if s.get("Principal") == {"Service": "aps.amazonaws.com"}]
    assert [(s["Effect"], sorted(s["Action"])) for s in amp] == [("Allow", ["kms:Decrypt", "kms:GenerateDataKey*"])]


@pytest.mark.parametrize("emails", [[], ["ml-oncall@example.com", "lead@example.com"]])
def test_each_address_in_alerts_email_gets_one_email_subscription(emails):
    template = alerts_template(emails)
    topic_id, _ = only(template, "AWS::SNS::Topic")  # the topic exists with no address too
    subscriptions = template.find_resources("AWS::SNS::Subscription").values()
    assert sorted(s["Properties"]["Endpoint"] for s in subscriptions) == sorted(emails)
    for subscription in subscriptions:
        assert subscription["Properties"]["Protocol"] == "email"
        assert subscription["Properties"]["TopicArn"] == {"Ref": topic_id}


def test_prod_subscribes_its_oncall_address(prod):
    prod.templates["alerts"].has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ml-oncall@example.com"})


def test_the_topic_refuses_plain_http_and_only_this_workspace_in_this_account_may_publish(prod):
    template = prod.templates["alerts"]
    topic_id, _ = only(template, "AWS::SNS::Topic")
    _, policy = only(template, "AWS::SNS::TopicPolicy")
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    (deny,) = [s for s in statements if s["Effect"] == "Deny"]
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} and deny["Principal"] == "*"
    (amp,) = [s for s in statements if s["Effect"] == "Allow"]
    assert amp["Principal"] == {"Service": "aps.amazonaws.com"}
    assert "sns:Publish" in amp["Action"] and amp["Resource"] == {"Ref": topic_id}
    assert amp["Condition"] == {
        "ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": ["Workspace", "Arn"]}},
        "StringEquals": {"aws:SourceAccount": prod.settings.account},
    }


def test_the_alert_manager_routes_every_alert_to_the_topic_grouped_by_alert_model_and_node(prod):
    config = definition(prod)["config"]
    route = config["route"]
    assert route["group_by"] == ["alertname", "model", "node"] and "routes" not in route
    (receiver,) = config["receivers"]
    assert receiver["name"] == route["receiver"]
    (sns,) = receiver["sns_configs"]
    assert sns["topic_arn"] == TOPIC_ARN
    assert sns["sigv4"] == {"region": prod.settings.region}
    assert sns["send_resolved"] is True
    assert (sns["subject"], sns["message"]) == ('{{ template "llm.subject" . }}', '{{ template "llm.message" . }}')


ALERT = {
    "status": "firing", "receiver": "sns", "externalURL": "", "commonLabels": {}, "commonAnnotations": {},
    "groupLabels": {"alertname": "TrainingStalled", "model": "model7"},
    "alerts": [{
        "status": "firing", "fingerprint": "1", "generatorURL": "",
        "labels": {"alertname": "TrainingStalled", "model": "model7", "severity": "critical", "cluster": "llm-prod"},
        "annotations": {"summary": "model7 has made no step for 14m 10s while its job runs",
                        "first_command": "python -m training.status model7",
                        "runbook": "docs/monitoring.md#trainingstalled"},
        "startsAt": "2026-11-24T09:42:13Z", "endsAt": "0001-01-01T00:00:00Z",
    }],
}


def render(prod, tmp_path, name: str, data: dict) -> str:
    """The template ``name`` as the alert manager renders it (Alertmanager's amtool, the same Go templates)."""
    (tmp_path / "llm.tmpl").write_text(definition(prod)["templates"])
    (tmp_path / "data.json").write_text(json.dumps(data))
    proc = subprocess.run(["amtool", "template", "render", f"--template.glob={tmp_path / 'llm.tmpl'}",
                           f"--template.data={tmp_path / 'data.json'}", f"--template.text={{{{ template \"{name}\" . }}}}"],
                          capture_output=True, text=True, check=True)
    return proc.stdout


needs_amtool = pytest.mark.skipif(not shutil.which("amtool"), reason="needs Alertmanager's amtool (make deps)")


@needs_amtool
def test_the_alert_manager_config_passes_amtool(prod, tmp_path):
    parsed = definition(prod)
    (tmp_path / "llm.tmpl").write_text(parsed["templates"])
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump({**parsed["config"], "templates": [str(tmp_path / "llm.tmpl")]}))
    proc = subprocess.run(["amtool", "check-config", str(tmp_path / "alertmanager.yml")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_amtool
def test_an_alert_email_names_the_alert_the_model_its_summary_and_the_first_command(prod, tmp_path):
    subject = render(prod, tmp_path, "llm.subject", ALERT)
    assert subject == "[llm-prod] FIRING: TrainingStalled model=model7"
    assert subject.isascii() and len(subject) <= 100 and "\n" not in subject  # what SNS accepts as a subject
    message = render(prod, tmp_path, "llm.message", ALERT)
    assert message.splitlines()[:7] == [
        "FIRING: TrainingStalled on llm-prod",
        "",
        "TrainingStalled model=model7 severity=critical (firing)",
        "  Summary:       model7 has made no step for 14m 10s while its job runs",
        "  First command: python -m training.status model7",
        "  Runbook:       docs/monitoring.md#trainingstalled",
        "  Since:         2026-11-24 09:42 UTC",
    ]
    node = {**ALERT, "groupLabels": {"alertname": "NodeDrained", "node": "gpu-st-p5e-48xlarge-12"},
            "alerts": [{**ALERT["alerts"][0], "labels": {"alertname": "NodeDrained", "node": "gpu-st-p5e-48xlarge-12"}}] * 2}
    assert render(prod, tmp_path, "llm.subject", node) == "[llm-prod] FIRING x2: NodeDrained node=gpu-st-p5e-48xlarge-12"
    resolved = {**ALERT, "status": "resolved",
                "alerts": [{**ALERT["alerts"][0], "status": "resolved", "endsAt": "2026-11-24T10:02:00Z"}]}
    assert render(prod, tmp_path, "llm.subject", resolved) == "[llm-prod] RESOLVED: TrainingStalled model=model7"
    assert "  Since:         2026-11-24 09:42 UTC, resolved 2026-11-24 10:02 UTC" in render(prod, tmp_path, "llm.message", resolved)


def test_each_rule_file_is_a_rule_groups_namespace_of_the_workspace_with_its_content(prod):
    namespaces = prod.templates["alerts"].find_resources("AWS::APS::RuleGroupsNamespace").values()
    assert {n["Properties"]["Name"]: n["Properties"]["Data"] for n in namespaces} == load_rule_files(RULES_DIR)
    assert {json.dumps(n["Properties"]["Workspace"]) for n in namespaces} == {json.dumps({"Fn::GetAtt": ["Workspace", "Arn"]})}


@pytest.mark.parametrize("files, message", [
    ({}, "has no rule files (*.yml)"),
    ({"broken.yml": "groups: [\n"}, "broken.yml: not valid YAML"),
    ({"alerts.yml": "rules:\n  - alert: X\n"}, "alerts.yml: not a Prometheus rule file: expected a top-level 'groups' list"),
    ({"my rules.yml": "groups: []\n"}, "its name becomes the rule groups namespace's name"),
])
def test_rule_files_that_cannot_be_deployed_stop_synth_naming_the_file(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(RuleFilesError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        build_app("dev", rules_dir=tmp_path)


def test_the_head_node_may_write_to_this_workspace_only_and_discover_instances(prod):
    _, policy = only(prod.templates["alerts"], "AWS::IAM::ManagedPolicy")
    assert policy["Properties"]["Path"] == "/parallelcluster/"  # attachable through ParallelCluster
    statements = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert set(statements) == {"RemoteWrite", "DiscoverComputeNodes"}
    assert (statements["RemoteWrite"]["Action"], statements["RemoteWrite"]["Resource"]) == (
        "aps:RemoteWrite", {"Fn::GetAtt": ["Workspace", "Arn"]})
    assert (statements["DiscoverComputeNodes"]["Action"], statements["DiscoverComputeNodes"]["Resource"]) == (
        "ec2:DescribeInstances", "*")
    report = json.loads((prod.outdir / "validation-report.json").read_text())
    accepted = [v for p in report["pluginReports"] for v in p.get("suppressedViolations", [])
                if any("llm-prod-alerts" in c["constructPath"] for c in v["violatingConstructs"])]
    assert [v["ruleName"] for v in accepted] == ["AwsSolutions-IAM5[Resource::*]"]
    assert "ec2:DescribeInstances" in accepted[0]["reason"]


def _staged(prod, key_suffix: str) -> tuple[str, dict]:
    """(text, markers) of the object the cluster stack's config deployment ships under cluster/*<key_suffix>."""
    (deployment,) = [d["Properties"] for d in prod.templates["cluster"].find_resources("Custom::CDKBucketDeployment").values()
                     if d["Properties"]["DestinationBucketKeyPrefix"] == "cluster/"]
    for key, markers in zip(deployment["SourceObjectKeys"], deployment["SourceMarkers"]):
        staged = prod.outdir / f"asset.{key.removesuffix('.zip')}"
        (path,) = staged.iterdir()
        if path.name.endswith(key_suffix):
            return path.read_text(), markers
    raise AssertionError(f"the config deployment ships no *{key_suffix}")


def _exported_by(prod, value: dict) -> str | None:
    """What the alerts stack exports under the import in ``value`` (as JSON), None for any other value."""
    parts = value["Fn::Join"][1] if "Fn::Join" in value else [value]  # yaml_data quotes its values
    imports = [p["Fn::ImportValue"] for p in parts if isinstance(p, dict) and "Fn::ImportValue" in p]
    outputs = prod.templates["alerts"].to_json()["Outputs"].values()
    found = [o["Value"] for o in outputs if imports and o.get("Export", {}).get("Name") == imports[0]]
    return json.dumps(found[0]) if found else None


def test_the_deployed_cluster_config_attaches_the_policy_to_the_head_node(prod):
    text, markers = _staged(prod, "llm-prod.yaml")
    policies = yaml.safe_load(text)["HeadNode"]["Iam"]["AdditionalIamPolicies"]
    policy_id, _ = only(prod.templates["alerts"], "AWS::IAM::ManagedPolicy")
    attached = [_exported_by(prod, markers[p["Policy"]]) for p in policies if p["Policy"] in markers]
    assert json.dumps({"Ref": policy_id}) in attached


def test_the_agents_settings_carry_the_workspaces_remote_write_url_and_region(prod):
    text, markers = _staged(prod, "llm-prod.monitoring")
    settings = dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))
    assert settings["REGION"] == "ap-southeast-3" and settings["CLUSTER_NAME"] == "llm-prod"
    url = settings["REMOTE_WRITE_URL"]
    for marker, value in markers.items():
        url = url.replace(marker, _exported_by(prod, value) or "amazonaws.com")  # the other: AWS::URLSuffix
    assert url == ('https://aps-workspaces.ap-southeast-3.amazonaws.com/workspaces/'
                   '{"Fn::GetAtt": ["Workspace", "WorkspaceId"]}/api/v1/remote_write')


def test_the_head_node_reaches_every_compute_nodes_exporters(prod):
    # Node exporter 9100 and DCGM exporter 9400: covered by the compute group's rule for the head node.
    network = prod.stacks["network"]
    compute, head = (network.get_logical_id(g.node.default_child) for g in (network.compute_sg, network.head_node_sg))
    rules = prod.templates["network"].find_resources("AWS::EC2::SecurityGroupIngress", {"Properties": {
        "GroupId": {"Fn::GetAtt": [compute, "GroupId"]}, "SourceSecurityGroupId": {"Fn::GetAtt": [head, "GroupId"]}}})
    assert [r["Properties"]["IpProtocol"] for r in rules.values()] == ["-1"]  # all traffic


def test_the_prod_templates_carry_the_topic_and_the_rule_delivery_path(prod):
    resources = {r["Type"] for r in prod.template_json("alerts")["Resources"].values()}
    assert {"AWS::SNS::Topic", "AWS::SNS::TopicPolicy", "AWS::SNS::Subscription", "AWS::KMS::Key",
            "AWS::APS::Workspace", "AWS::APS::RuleGroupsNamespace", "AWS::IAM::ManagedPolicy"} <= resources
    prod.templates["alerts"].has_resource_properties("AWS::APS::Workspace", {
        "Alias": "llm-prod", "AlertManagerDefinition": Match.any_value(),
        "LoggingConfiguration": {"LogGroupArn": Match.any_value()}})


def grafana_template(on: bool) -> Template:
    settings = load_settings("dev")  # a region with Amazon Managed Grafana (prod's has none: tests/test_settings.py)
    settings = settings.model_copy(update={"alerts": settings.alerts.model_copy(update={"grafana": on})})
    stack = AlertsStack(cdk.App(), "alerts", settings=settings, rule_files=TWO_RULES,
                        env=cdk.Environment(account=settings.account, region=settings.region))
    return Template.from_stack(stack)


def test_no_grafana_unless_asked():
    template = grafana_template(False)
    template.resource_count_is("AWS::Grafana::Workspace", 0)
    assert "GrafanaUrl" not in template.to_json().get("Outputs", {})


def test_grafana_signs_in_through_identity_center_and_its_role_only_queries_this_prometheus_workspace():
    template = grafana_template(True)
    _, workspace = only(template, "AWS::Grafana::Workspace")
    amp_id, _ = only(template, "AWS::APS::Workspace")
    props = workspace["Properties"]
    assert (props["AccountAccessType"], props["AuthenticationProviders"], props["PermissionType"],
            props["DataSources"]) == ("CURRENT_ACCOUNT", ["AWS_SSO"], "CUSTOMER_MANAGED", ["PROMETHEUS"])
    role_id = props["RoleArn"]["Fn::GetAtt"][0]
    role = template.to_json()["Resources"][role_id]
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "grafana.amazonaws.com"}
    assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": "111111111111"}  # dev's account
    assert trust["Condition"]["StringLike"]["aws:SourceArn"]["Fn::Join"][1][-1] == \
        ":grafana:us-east-1:111111111111:/workspaces/*"
    policies = [p for p in template.find_resources("AWS::IAM::Policy").values()
                if p["Properties"]["Roles"] == [{"Ref": role_id}]]
    (policy,) = policies
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert sorted(statement["Action"]) == sorted(["aps:QueryMetrics", "aps:GetSeries", "aps:GetLabels", "aps:GetMetricMetadata"])
    assert statement["Resource"] == {"Fn::GetAtt": [amp_id, "Arn"]}
    outputs = template.to_json()["Outputs"]
    assert {"GrafanaUrl", "GrafanaWorkspaceId"} <= set(outputs)


def test_an_environment_with_grafana_synthesizes_through_cdk_nag_and_cloudformations_region_check(tmp_path):
    write_env(tmp_path / "config", "dev", alerts__grafana=True)  # us-east-1 has Amazon Managed Grafana
    cdk_app = build_app("dev", config_dir=tmp_path / "config", outdir=str(tmp_path / "out"))
    cdk_app.app.synth()  # raises on any unacknowledged cdk-nag finding
    report = json.loads((tmp_path / "out" / "validation-report.json").read_text())
    assert all(plugin["violations"] == [] for plugin in report["pluginReports"])
    assert Template.from_stack(cdk_app.stacks["alerts"]).find_resources("AWS::Grafana::Workspace")
