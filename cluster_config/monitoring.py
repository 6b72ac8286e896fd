"""What the cluster's metric agents send and where (docs/monitoring.md, "Delivery on AWS").

The head node's Prometheus agent (node_scripts/monitoring_agents.sh) scrapes every node and remote-writes
to the environment's Amazon Managed Service for Prometheus workspace (stacks/alerts_stack.py), which
evaluates ``monitoring/rules/*.yml``. This module is the one place that says

- which metrics leave the cluster: the agent's keep list (``KEPT_METRICS``), what the rules and the
  dashboard use and nothing else, since AMP charges per sample ingested (monitoring_cost.py);
- which GPU fields the DCGM exporter collects at all (``DCGM_FIELDS``);
- the agent's settings file the cluster stack ships next to the model list (``monitoring_file``);
- the head node's IAM policy for it (``head_node_policy``);
- how the rule files are read (``load_rule_files``), by the alerts stack and the cost estimate alike.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from cluster_config.settings import CONFIG_PREFIX, Settings

RULES_DIR = Path(__file__).resolve().parent.parent / "monitoring" / "rules"

# Every target every 30 s: the shortest stall that alerts is 10 minutes in prod, and halving the
# interval doubles the ingestion bill (monitoring_cost.py).
SCRAPE_INTERVAL_S = 30
# How long the workspace keeps samples (AMP's default, stated so the cost estimate counts what is kept).
RETENTION_DAYS = 150

# The GPU fields of docs/monitoring.md, as (field, Prometheus type) for the DCGM exporter's counters file:
# one series per GPU each, so the exporter collects nothing the keep list would drop.
DCGM_FIELDS = (
    # Each GPU's Xids by code over the exporter's window (5 min): every one, where DCGM_FI_DEV_XID_ERRORS held only
    # the last. One series per GPU (without `xid`, 0) when there is none, so it costs what that field did.
    ("DCGM_EXP_XID_ERRORS_COUNT", "gauge"),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
    ("DCGM_FI_DEV_FB_USED", "gauge"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter"),
)

# Node exporter metrics sent: (its collector, what one series is per; monitoring_cost.py counts them so).
# The node exporter runs only these collectors (and, on the head node, the textfile collector).
NODE_METRICS = {
    "node_infiniband_port_data_received_bytes_total": ("infiniband", "efa device"),
    "node_infiniband_port_data_transmitted_bytes_total": ("infiniband", "efa device"),
    "node_infiniband_port_errors_received_total": ("infiniband", "efa device"),
}

# What monitoring/rules/*.yml and monitoring/dashboards/cluster.json use (a test holds the list to both):
# `up` of every target, all of the head node's exporter (llm_*), the GPU fields and EFA traffic.
KEPT_METRICS = ("up", "llm_.*", *NODE_METRICS, *(field for field, _ in DCGM_FIELDS))


def keep_regex() -> str:
    """The agent's write_relabel_configs keep regex (anchored by Prometheus) for ``__name__``."""
    return "|".join(KEPT_METRICS)


def monitoring_key(settings: Settings) -> str:
    """The agents' settings lie next to the model list (render.models_key): the head node's OnNodeConfigured
    arguments may never change on a running cluster, so the node script finds the file by the list's name."""
    return f"{CONFIG_PREFIX}{settings.cluster_name}.monitoring"


def monitoring_file(settings: Settings, *, remote_write_url: str, region: str) -> str:
    """KEY=value lines for node_scripts/monitoring_agents.sh (the URL is a deploy-time token in the stack)."""
    values = {
        "CLUSTER_NAME": settings.cluster_name,
        "REGION": region,
        "REMOTE_WRITE_URL": remote_write_url,
        "GPU_QUEUE": settings.gpu_queue.name,
        "SCRAPE_INTERVAL": f"{SCRAPE_INTERVAL_S}s",
        "KEEP_METRICS": keep_regex(),
        "NODE_COLLECTORS": " ".join(sorted({collector for collector, _ in NODE_METRICS.values()})),
        "DCGM_FIELDS": " ".join(f"{field}:{kind}" for field, kind in DCGM_FIELDS),
    }
    return "# Written by the cluster stack (cluster_config/monitoring.py); read by monitoring_agents.sh.\n" + "".join(
        f"{key}={value}\n" for key, value in values.items()
    )


def head_node_policy(workspace_arn: str) -> dict[str, Any]:
    """The head node's agent: remote write into this workspace only, and EC2 service discovery of the
    compute nodes (DescribeInstances has no resource-level permissions: its resource must be *)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "RemoteWrite", "Effect": "Allow", "Action": "aps:RemoteWrite", "Resource": workspace_arn},
            {"Sid": "DiscoverComputeNodes", "Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},
        ],
    }


class RuleFilesError(ValueError):
    """The rule files cannot be deployed; the message names the file and the fix."""


def load_rule_files(rules_dir: Path = RULES_DIR) -> dict[str, str]:
    """Each ``*.yml`` of ``rules_dir`` by its stem (an AMP rule groups namespace name), as text.

    Checked: at least one file, each valid YAML with a list of ``groups`` each naming its ``rules``."""
    files = sorted(rules_dir.glob("*.yml")) if rules_dir.is_dir() else []
    if not files:
        raise RuleFilesError(
            f"{rules_dir} has no rule files (*.yml): the alerts stack deploys each as a rule groups namespace "
            "of the environment's Prometheus workspace; add the alert rules there (docs/monitoring.md)"
        )
    loaded = {}
    for path in files:
        if not re.fullmatch(r"[0-9A-Za-z][-.0-9A-Z_a-z]{0,63}", path.stem):
            raise RuleFilesError(f"{path}: its name becomes the rule groups namespace's name, which allows letters, "
                                 "digits, '-', '.' and '_' (at most 64, starting with a letter or digit); rename it")
        text = path.read_text()
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise RuleFilesError(f"{path}: not valid YAML ({exc}); check it with `promtool check rules {path}`") from None
        groups = document.get("groups") if isinstance(document, dict) else None
        if not isinstance(groups, list) or not groups or not all(
            isinstance(group, dict) and isinstance(group.get("rules"), list) for group in groups
        ):
            raise RuleFilesError(
                f"{path}: not a Prometheus rule file: expected a top-level 'groups' list, each group with its "
                "'rules' (https://prometheus.io/docs/prometheus/latest/configuration/recording_rules/)"
            )
        loaded[path.stem] = text
    return loaded
