"""alerts.budget: an AWS Budgets cost budget at the plan's expected cost, notifying the alerts' topic (a guard on
spend); off by default, and cdk-nag clean when on. In dev's region (us-east-1): CDK's CloudFormation region
check finds no AWS::Budgets::Budget type in ap-southeast-3, prod's, and refuses the synth there (below)."""

from __future__ import annotations

import json

import pytest

from aws_cdk.assertions import Match, Template

from cluster_config.plan import build_plan
from cluster_config.settings import SettingsError, load_settings
from stacks.alerts_stack import BUDGET_THRESHOLDS
from stacks.app import build_app
from tests.settings_files import write_env


def test_without_the_switch_there_is_no_budget(synthesize):
    assert synthesize("prod").templates["alerts"].find_resources("AWS::Budgets::Budget") == {}


def test_the_budget_is_the_plans_expected_cost_and_notifies_the_alert_topic_through_cdk_nag(tmp_path):
    # prod's plan, in a region whose CloudFormation has the budget type (and p5e.48xlarge)
    write_env(tmp_path / "config", "prod", alerts__budget=True, region="us-east-2", availability_zone="us-east-2a")
    cdk_app = build_app("prod", config_dir=tmp_path / "config", outdir=str(tmp_path / "out"))
    cdk_app.app.synth()  # raises on any unacknowledged cdk-nag finding
    report = json.loads((tmp_path / "out" / "validation-report.json").read_text())
    assert all(plugin["violations"] == [] for plugin in report["pluginReports"])

    template = Template.from_stack(cdk_app.stacks["alerts"])
    (topic_id,) = template.find_resources("AWS::SNS::Topic")
    settings = load_settings("prod", tmp_path / "config")
    expected = round(build_plan(settings).cost_to_finish_usd)
    assert expected > 500_000  # seven models on 80 p5e.48xlarge for about two weeks
    template.has_resource_properties("AWS::Budgets::Budget", {
        "Budget": {"BudgetType": "COST", "TimeUnit": "MONTHLY", "BudgetName": f"{settings.cluster_name}-expected-cost",
                   "BudgetLimit": {"Amount": expected, "Unit": "USD"}},
        "NotificationsWithSubscribers": [
            {"Notification": {"NotificationType": kind, "ComparisonOperator": "GREATER_THAN", "Threshold": percent,
                              "ThresholdType": "PERCENTAGE"},
             "Subscribers": [{"SubscriptionType": "SNS", "Address": {"Ref": topic_id}}]}
            for kind, percent in BUDGET_THRESHOLDS],
    })
    # Budgets may publish to the encrypted topic: the topic's policy and the key's, for this account only.
    template.has_resource_properties("AWS::SNS::TopicPolicy", {"PolicyDocument": {"Statement": Match.array_with([
        Match.object_like({"Sid": "BudgetsPublishesSpend", "Principal": {"Service": "budgets.amazonaws.com"},
                           "Action": "sns:Publish", "Resource": {"Ref": topic_id},
                           "Condition": Match.object_like({"StringEquals": {"aws:SourceAccount": settings.account}})})])}})
    template.has_resource_properties("AWS::KMS::Key", {"KeyPolicy": {"Statement": Match.array_with([
        Match.object_like({"Sid": "BudgetsPublishesToTheEncryptedTopic",
                           "Principal": {"Service": "budgets.amazonaws.com"},
                           "Action": ["kms:Decrypt", "kms:GenerateDataKey*"]})])}})


def test_in_a_region_without_the_budget_type_synth_stops_naming_it(tmp_path):
    write_env(tmp_path / "config", "prod", alerts__budget=True)
    cdk_app = build_app("prod", config_dir=tmp_path / "config", outdir=str(tmp_path / "out"))
    with pytest.raises(RuntimeError, match="Resource type 'AWS::Budgets::Budget' does not exist in 'ap-southeast-3'"):
        cdk_app.app.synth()


def test_without_an_expected_cost_the_budget_is_refused_naming_the_switch(tmp_path):
    write_env(tmp_path / "config", "dev", alerts__budget=True)  # dev's tiny models: under a cent
    with pytest.raises(SettingsError, match=r"alerts.budget: the plan's expected cost is \$0.01 .* set alerts.budget: false"):
        build_app("dev", config_dir=tmp_path / "config", outdir=str(tmp_path / "out"))
