"""What alert delivery costs a month (cluster_config/monitoring_cost.py), and that what is paid for is used:
the agent's keep list is exactly what the rules and the dashboard name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from cluster_config.monitoring import DCGM_FIELDS, KEPT_METRICS, load_rule_files
from cluster_config.monitoring_cost import (
    EXPORTER_SERIES_PER_CLUSTER,
    EXPORTER_SERIES_PER_MODEL,
    CostError,
    ingestion_usd,
    monitoring_cost,
    rule_evaluations_per_month,
    series_by_source,
)
from cluster_config.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
RULES = {"a": "groups:\n  - name: a\n    rules: [{alert: A, expr: up == 0}, {alert: B, expr: up == 0}]\n",
         "b": "groups:\n  - name: b\n    interval: 30s\n    rules: [{alert: C, expr: up == 0}]\n"}


def with_settings(env: str, **queue):
    settings = load_settings(env)
    return settings.model_copy(update={"gpu_queue": settings.gpu_queue.model_copy(update=queue)})


def test_ingestion_is_priced_per_tier():
    assert ingestion_usd(0) == 0
    assert ingestion_usd(2e9) == pytest.approx(180.0)  # first 2 billion at $0.90 per 10 million
    assert ingestion_usd(3e9) == pytest.approx(180.0 + 35.0)  # the next billion at $0.35
    assert ingestion_usd(262e9) == pytest.approx(180.0 + 8750.0 + 10e9 * 0.16 / 1e7)


def test_prod_series_come_from_its_nodes_gpus_efa_devices_and_models():
    series = series_by_source(load_settings("prod"))
    assert series["dcgm"] == 80 * (8 * len(DCGM_FIELDS) + 1)  # each field per GPU, and the target's up
    assert series["compute nodes"] == 80 * (3 * 32 + 1) + 8 * 1  # p5e: 3 EFA metrics x 32 devices; c7i: up only
    assert series["head node"] == 1
    assert series["exporter"] == 7 * EXPORTER_SERIES_PER_MODEL + EXPORTER_SERIES_PER_CLUSTER


def test_prod_costs_about_a_hundred_dollars_a_month_mostly_ingestion():
    cost = monitoring_cost(load_settings("prod"), rule_files=RULES)
    assert cost.samples_per_month == pytest.approx(sum(cost.series.values()) * 730 * 3600 / 30)
    assert 50 < cost.monthly_usd < 150
    assert cost.ingestion_usd > 0.9 * cost.monthly_usd
    assert cost.kms_usd == 1.0 and cost.sns_usd < 0.05
    assert cost.summary().startswith(f"alert delivery (Amazon Managed Service for Prometheus, SNS): ~${cost.monthly_usd:,.0f}/month")


def test_a_shorter_scrape_interval_sends_proportionally_more():
    settings = load_settings("prod")
    every_30 = monitoring_cost(settings, rule_files=RULES)
    every_15 = monitoring_cost(settings, rule_files=RULES, scrape_interval_s=15)
    assert every_15.samples_per_month == pytest.approx(2 * every_30.samples_per_month)
    assert every_15.ingestion_usd > 1.5 * every_30.ingestion_usd


def test_without_addresses_nothing_is_e_mailed_but_the_key_is_paid():
    settings = load_settings("dev")
    assert settings.alerts.email == []
    cost = monitoring_cost(settings, rule_files=RULES)
    assert (cost.sns_usd, cost.kms_usd) == (0, 1.0)
    assert cost.monthly_usd < 5


def test_rules_are_evaluated_at_their_groups_interval():
    assert rule_evaluations_per_month(RULES) == pytest.approx(2 * 730 * 60 + 730 * 120)


def test_an_efa_instance_type_the_estimate_does_not_know_is_named():
    with pytest.raises(CostError, match="p6-b200.48xlarge: its number of EFA interfaces is unknown; add it to"):
        series_by_source(with_settings("prod", instance_type="p6-b200.48xlarge"))


def test_the_docs_state_prods_figure():
    cost = monitoring_cost(load_settings("prod"))
    assert f"~${cost.monthly_usd:,.0f} a month" in (REPO / "docs" / "monitoring.md").read_text()


# What is sent is what is used ------------------------------------------------------------------------

def _metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (quoted strings, which hold label values and text, removed)."""
    words = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", re.sub(r'"(?:[^"\\]|\\.)*"', "", expr))
    return {w for w in words if w == "up" or w.startswith(("llm_", "node_", "DCGM_"))}


def _used() -> set[str]:
    used = set()
    for text in load_rule_files().values():
        for group in yaml.safe_load(text)["groups"]:
            used |= {name for rule in group["rules"] for name in _metric_names(rule["expr"])}

    def walk(value):
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "expr" and isinstance(item, str):
                    used.update(_metric_names(item))
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(json.loads((REPO / "monitoring" / "dashboards" / "cluster.json").read_text()))
    return used


def test_the_keep_list_sends_exactly_what_the_rules_and_the_dashboard_use():
    used = _used()
    kept = set(KEPT_METRICS) - {"llm_.*"}
    assert {name for name in used if not name.startswith("llm_")} == kept
    assert any(name.startswith("llm_") for name in used)  # all of the exporter's series are sent
