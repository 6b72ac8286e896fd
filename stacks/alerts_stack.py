"""How an alert reaches a person on AWS: rules in Amazon Managed Service for Prometheus, e-mail through SNS.

    head node's Prometheus agent --remote write--> AMP workspace (monitoring/rules/*.yml, one rule groups
    namespace each) --its alert manager--> SNS topic (KMS) --> one e-mail subscription per alerts.email

- the topic is encrypted with a customer key whose policy lets AMP (aps.amazonaws.com) use it, refuses
  requests without TLS, and lets AMP publish only for this account and this workspace;
- the alert manager groups alerts by alert, model and node, and renders a short subject and a message
  naming the model or node, the rule's summary and the first command to run (docs/monitoring.md);
- the head node gets a managed policy: remote write into this workspace, EC2 discovery of the compute
  nodes; the cluster stack attaches it and ships the agent's settings (cluster_config/monitoring.py);
- the workspace logs alert manager and ruler errors (a refused publish, a rule that fails) to CloudWatch;
- with ``alerts.grafana``, an Amazon Managed Grafana workspace that people reach in a browser (IAM Identity
  Center sign-in), whose role may only query this Prometheus workspace; ``python -m cluster_config
  dashboard`` adds the data source and the repository's dashboard (cluster_config/dashboard.py);
- with ``alerts.budget``, an AWS Budgets cost budget at the plan's expected cost whose notifications (a
  month's actual spend above 80 % and 100 %, the forecast above 100 %) go to the same topic.
"""

from __future__ import annotations

from typing import Any, Mapping

import aws_cdk as cdk
import yaml
from aws_cdk import aws_aps as aps, aws_grafana as grafana, aws_iam as iam, aws_kms as kms, aws_logs as logs
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from cluster_config.monitoring import RETENTION_DAYS, head_node_policy
from cluster_config.plan import build_plan
from cluster_config.render import PCLUSTER_POLICY_PATH
from cluster_config.settings import Settings, SettingsError
from stacks import nag

APS_PRINCIPAL = "aps.amazonaws.com"
GRAFANA_PRINCIPAL = "grafana.amazonaws.com"
BUDGETS_PRINCIPAL = "budgets.amazonaws.com"
# A month's spend (actual, then forecast) above this share of the plan's expected cost is published.
BUDGET_THRESHOLDS = (("ACTUAL", 80), ("ACTUAL", 100), ("FORECASTED", 100))
GRAFANA_VERSION = "10.4"
# What a Grafana data source needs to read a Prometheus workspace (AmazonPrometheusQueryAccess's actions,
# here on this workspace only).
PROMETHEUS_QUERY_ACTIONS = ["aps:QueryMetrics", "aps:GetSeries", "aps:GetLabels", "aps:GetMetricMetadata"]
# One e-mail per alert, model and node; the same problem again every 4 hours while it lasts.
GROUP_BY = ("alertname", "model", "node")
GROUP_WAIT = "30s"
GROUP_INTERVAL = "5m"
REPEAT_INTERVAL = "4h"

# Go templates of the alert manager (the same as Prometheus' Alertmanager). SNS wants an ASCII subject of
# at most 100 characters on one line; AMP cuts a longer one.
ALERT_TEMPLATES = """\
{{ define "llm.subject" -}}
[@cluster@] {{ .Status | toUpper }}{{ if gt (len .Alerts.Firing) 1 }} x{{ len .Alerts.Firing }}{{ end }}: \
{{ .GroupLabels.alertname }}{{ with .GroupLabels.model }} model={{ . }}{{ end }}\
{{ with .GroupLabels.node }} node={{ . }}{{ end }}
{{- end }}

{{ define "llm.message" -}}
{{ .Status | toUpper }}: {{ .GroupLabels.alertname }} on @cluster@
{{ range .Alerts }}
{{ .Labels.alertname }}{{ with .Labels.model }} model={{ . }}{{ end }}{{ with .Labels.node }} node={{ . }}{{ end }}\
{{ with .Labels.severity }} severity={{ . }}{{ end }} ({{ .Status }})
  Summary:       {{ .Annotations.summary }}
  First command: {{ .Annotations.first_command }}
  Runbook:       {{ or .Annotations.runbook "docs/monitoring.md" }}
  Since:         {{ .StartsAt.UTC.Format "2006-01-02 15:04 UTC" }}\
{{ if eq .Status "resolved" }}, resolved {{ .EndsAt.UTC.Format "2006-01-02 15:04 UTC" }}{{ end }}
{{ end }}
Silences: the alert manager API of Prometheus workspace @cluster@ (docs/monitoring.md, Delivery on AWS).
{{- end }}
"""


class AlertsStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        rule_files: Mapping[str, str],
        env: cdk.Environment,
        **kwargs,
    ) -> None:
        """``rule_files``: each rule file's text by namespace name (cluster_config.monitoring.load_rule_files)."""
        super().__init__(scope, construct_id, env=env, **kwargs)
        name = settings.cluster_name

        # Messages are encrypted at rest only until SNS delivers them: nothing outlives the topic.
        self.key = kms.Key(
            self, "AlertsKey", description=f"Encrypts the {name} alert topic", enable_key_rotation=True,
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        # AMP documents no confused-deputy condition keys for its KMS calls (only for sns:Publish, below):
        # a condition here could drop every alert. The key encrypts this topic only.
        self.key.add_to_resource_policy(iam.PolicyStatement(
            sid="AmpPublishesToTheEncryptedTopic",
            principals=[iam.ServicePrincipal(APS_PRINCIPAL)],
            actions=["kms:GenerateDataKey*", "kms:Decrypt"],
            resources=["*"],
        ))
        self.topic = sns.Topic(
            self, "AlertsTopic", topic_name=f"{name}-alerts", display_name=f"{name} alerts",
            master_key=self.key, enforce_ssl=True,
        )
        for address in settings.alerts.email:
            self.topic.add_subscription(subscriptions.EmailSubscription(address))

        log_group = logs.LogGroup(
            self, "WorkspaceLogGroup", log_group_name=f"/aws/vendedlogs/prometheus/{name}",
            retention=logs.RetentionDays.ONE_MONTH, removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        self.workspace = aps.CfnWorkspace(
            self, "Workspace", alias=name,
            alert_manager_definition=alert_manager_definition(
                topic_arn=self.topic.topic_arn, region=self.region, cluster=name),
            logging_configuration=aps.CfnWorkspace.LoggingConfigurationProperty(log_group_arn=log_group.log_group_arn),
            workspace_configuration=aps.CfnWorkspace.WorkspaceConfigurationProperty(retention_period_in_days=RETENTION_DAYS),
        )
        # Only this workspace, in this account, may publish (AMP user guide, "Giving Amazon Managed Service
        # for Prometheus permission to send alert messages to your Amazon SNS topic").
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            sid="AmpPublishesAlerts",
            principals=[iam.ServicePrincipal(APS_PRINCIPAL)],
            actions=["sns:Publish", "sns:GetTopicAttributes"],
            resources=[self.topic.topic_arn],
            conditions={
                "ArnEquals": {"aws:SourceArn": self.workspace.attr_arn},
                "StringEquals": {"aws:SourceAccount": self.account},
            },
        ))

        self.rule_namespaces = {
            namespace: aps.CfnRuleGroupsNamespace(
                self, f"Rules-{namespace}", name=namespace, data=text, workspace=self.workspace.attr_arn,
            )
            for namespace, text in sorted(rule_files.items())
        }

        self.remote_write_url = (
            f"https://aps-workspaces.{self.region}.{cdk.Aws.URL_SUFFIX}/workspaces/"
            f"{self.workspace.attr_workspace_id}/api/v1/remote_write"
        )
        self.head_node_policy = iam.ManagedPolicy(
            self, "HeadNodeMonitoring",
            description="The cluster's head node writes metrics to its Prometheus workspace and discovers compute nodes",
            path=PCLUSTER_POLICY_PATH,
            document=iam.PolicyDocument.from_json(head_node_policy(self.workspace.attr_arn)),
        )
        nag.acknowledge_monitoring_policy(self.head_node_policy)

        self.grafana = self._grafana_workspace(name) if settings.alerts.grafana else None
        self.budget = self._budget(name, build_plan(settings).cost_to_finish_usd) if settings.alerts.budget else None

        cdk.CfnOutput(self, "AlertTopicArn", value=self.topic.topic_arn, description="Alerts are published here")
        cdk.CfnOutput(self, "WorkspaceId", value=self.workspace.attr_workspace_id)
        cdk.CfnOutput(self, "RemoteWriteUrl", value=self.remote_write_url)


    def _budget(self, name: str, expected_usd: float) -> budgets.CfnBudget:
        """alerts.budget: a monthly cost budget at the plan's expected cost, notifying the alert topic.

        A month above the whole run's expected cost is wrong whatever the cause (a second block bought, nodes
        left running after the run, an on-demand queue that never scales down). Budgets publishes to an
        encrypted topic only with the key's grant (AWS Cost Management user guide, "Creating an Amazon SNS
        topic for budget notifications")."""
        if round(expected_usd) < 1:  # Budgets takes no limit of $0
            raise SettingsError(
                f"alerts.budget: the plan's expected cost is ${expected_usd:.2f} (`python -m cluster_config plan` "
                "shows each model's $ to finish), below a budget's smallest limit of $1; set alerts.budget: false")
        self.key.add_to_resource_policy(iam.PolicyStatement(
            sid="BudgetsPublishesToTheEncryptedTopic",
            principals=[iam.ServicePrincipal(BUDGETS_PRINCIPAL)],
            actions=["kms:GenerateDataKey*", "kms:Decrypt"],
            resources=["*"],
            conditions={"StringEquals": {"aws:SourceAccount": self.account}},
        ))
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            sid="BudgetsPublishesSpend",
            principals=[iam.ServicePrincipal(BUDGETS_PRINCIPAL)],
            actions=["sns:Publish"],
            resources=[self.topic.topic_arn],
            conditions={"StringEquals": {"aws:SourceAccount": self.account},
                        "ArnLike": {"aws:SourceArn": f"arn:{self.partition}:budgets::{self.account}:*"}},
        ))
        budget = budgets.CfnBudget(
            self, "SpendBudget",
            budget=budgets.CfnBudget.BudgetDataProperty(
                budget_name=f"{name}-expected-cost", budget_type="COST", time_unit="MONTHLY",
                budget_limit=budgets.CfnBudget.SpendProperty(amount=round(expected_usd), unit="USD"),
            ),
            notifications_with_subscribers=[
                budgets.CfnBudget.NotificationWithSubscribersProperty(
                    notification=budgets.CfnBudget.NotificationProperty(
                        notification_type=kind, comparison_operator="GREATER_THAN", threshold=percent,
                        threshold_type="PERCENTAGE"),
                    subscribers=[budgets.CfnBudget.SubscriberProperty(subscription_type="SNS",
                                                                      address=self.topic.topic_arn)],
                ) for kind, percent in BUDGET_THRESHOLDS
            ],
        )
        cdk.CfnOutput(self, "BudgetUsd", value=str(round(expected_usd)),
                      description="AWS Budgets: a month's spend above this (the plan's expected cost) is alerted")
        return budget

    def _grafana_workspace(self, name: str) -> grafana.CfnWorkspace:
        """A Grafana in the browser, signed in through IAM Identity Center; it reads this Prometheus workspace only."""
        role = iam.Role(
            self, "GrafanaRole", description=f"Amazon Managed Grafana of {name} reads its Prometheus workspace",
            # The service's own confused-deputy guard (Amazon Managed Grafana user guide, "Amazon Managed Grafana
            # permissions and policies for AWS data sources"): this account's workspaces only.
            assumed_by=iam.ServicePrincipal(GRAFANA_PRINCIPAL, conditions={
                "StringEquals": {"aws:SourceAccount": self.account},
                "StringLike": {"aws:SourceArn": f"arn:{cdk.Aws.PARTITION}:grafana:{self.region}:{self.account}:/workspaces/*"},
            }),
        )
        role.add_to_policy(iam.PolicyStatement(actions=PROMETHEUS_QUERY_ACTIONS, resources=[self.workspace.attr_arn]))
        workspace = grafana.CfnWorkspace(
            self, "Grafana", name=name, description=f"Dashboards of {name} (docs/monitoring.md)",
            account_access_type="CURRENT_ACCOUNT", authentication_providers=["AWS_SSO"],
            permission_type="CUSTOMER_MANAGED", role_arn=role.role_arn, data_sources=["PROMETHEUS"],
            grafana_version=GRAFANA_VERSION,
        )
        cdk.CfnOutput(self, "GrafanaUrl", value=f"https://{workspace.attr_endpoint}",
                      description="Grafana (IAM Identity Center sign-in); python -m cluster_config dashboard adds the dashboard")
        cdk.CfnOutput(self, "GrafanaWorkspaceId", value=workspace.attr_id)
        return workspace


def alert_manager_definition(*, topic_arn: str, region: str, cluster: str) -> str:
    """AMP's alert manager definition (YAML): the message templates and the Alertmanager configuration."""
    templates = ALERT_TEMPLATES.replace("@cluster@", cluster)
    config = alertmanager_config(topic_arn=topic_arn, region=region, cluster=cluster)
    return _yaml({"template_files": {"llm.tmpl": templates}, "alertmanager_config": _yaml(config)})


def alertmanager_config(*, topic_arn: str, region: str, cluster: str) -> dict[str, Any]:
    """Every alert to the topic, grouped by alert, model and node; resolved alerts are sent too."""
    return {
        "route": {
            "receiver": "sns",
            "group_by": list(GROUP_BY),
            "group_wait": GROUP_WAIT,
            "group_interval": GROUP_INTERVAL,
            "repeat_interval": REPEAT_INTERVAL,
        },
        "receivers": [{
            "name": "sns",
            "sns_configs": [{
                "topic_arn": topic_arn,
                "sigv4": {"region": region},  # AMP requires the region (no api_url, no http_config)
                "send_resolved": True,
                "subject": '{{ template "llm.subject" . }}',
                "message": '{{ template "llm.message" . }}',
                "attributes": {"cluster": cluster},
            }],
        }],
    }


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the definition reads as written in the AMP console."""


_LiteralDumper.add_representer(
    str, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)
)


def _yaml(value: Any) -> str:
    # Wide lines: a CloudFormation token inside a string must not be folded.
    return yaml.dump(value, Dumper=_LiteralDumper, sort_keys=False, width=1_000_000)
