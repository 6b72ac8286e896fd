"""The Grafana dashboard (monitoring/dashboards/cluster.json): valid JSON, its variables, a layout that
fits 24 columns without overlaps, a title and data source on every panel, and PromQL that promtool
parses (written as recording rules, with Grafana's variables replaced by values) and that reads only
metrics of docs/monitoring.md's contract (or node_*, DCGM_*, up)."""

from __future__ import annotations

import json
import re
from itertools import combinations
from pathlib import Path

import pytest
import yaml
from test_alert_rules import allowed_metric, contract_metrics, metric_names, run_promtool

DASHBOARD = Path(__file__).resolve().parents[2] / "monitoring" / "dashboards" / "cluster.json"
# Values a Grafana variable could take, so the expression is plain PromQL.
VARIABLES = {"model": "model1", "__rate_interval": "1m", "__interval": "1m", "__range": "6h", "datasource": "prometheus"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside collapsed rows too."""
    return [p for top in dashboard["panels"] for p in (top, *top.get("panels", []))]


def expressions(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title / refId, expr) of every query."""
    return [(f"{p['title']} / {t['refId']}", t["expr"]) for p in all_panels(dashboard) for t in p.get("targets", [])
            if "expr" in t]


def substitute(expr: str) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        assert name in VARIABLES, f"unknown Grafana variable ${name} in {expr}"
        return VARIABLES[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", value, expr)


def test_dashboard_header(dashboard):
    assert dashboard["title"] and dashboard["uid"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert model["type"] == "query"
    assert model["query"]["query"] == "label_values(llm_training_step, model)"
    assert model["datasource"]["uid"] == "${datasource}"


def test_panel_ids_unique(dashboard):
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids))


def test_every_panel_has_title_and_datasource(dashboard):
    for panel in all_panels(dashboard):
        assert panel.get("title"), panel["id"]
        assert panel.get("datasource", {}).get("uid") == "${datasource}", panel["title"]
        for target in panel.get("targets", []):
            assert target.get("datasource", {}).get("uid") == "${datasource}", panel["title"]


def test_layout_fits_and_does_not_overlap(dashboard):
    boxes = []
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["y"] >= 0 and g["w"] > 0 and g["h"] > 0, panel["title"]
        assert g["x"] + g["w"] <= 24, f"{panel['title']}: wider than 24 columns"
        boxes.append((panel["title"], g))
    for (a, p), (b, q) in combinations(boxes, 2):
        apart = (p["x"] + p["w"] <= q["x"] or q["x"] + q["w"] <= p["x"]
                 or p["y"] + p["h"] <= q["y"] or q["y"] + q["h"] <= p["y"])
        assert apart, f"panels overlap: {a!r} and {b!r}"


def test_dashboard_shows_what_on_call_needs(dashboard):
    types = {p["type"] for p in all_panels(dashboard)}
    assert {"row", "timeseries", "table", "alertlist"} <= types
    used = set().union(*(metric_names(substitute(expr)) for _, expr in expressions(dashboard)))
    for metric in ("llm_training_loss", "llm_training_val_loss", "llm_training_tokens_per_second",
                   "llm_training_mfu_ratio", "llm_training_step", "llm_training_total_steps",
                   "llm_training_eta_timestamp_seconds", "llm_training_deadline_timestamp_seconds",
                   "llm_training_last_progress_timestamp_seconds", "llm_training_recoveries_total",
                   "llm_training_last_checkpoint_timestamp_seconds", "llm_slurm_nodes", "llm_slurm_node_unavailable",
                   "llm_slurm_jobs", "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL",
                   "llm_fsx_free_bytes", "llm_fsx_size_bytes"):
        assert metric in used, f"no panel shows {metric}"
    assert any(name.startswith("node_infiniband_") for name in used)


def test_queries_use_only_contract_metrics(dashboard):
    contract = contract_metrics()
    unknown = {f"{where}: {name}" for where, expr in expressions(dashboard)
               for name in metric_names(substitute(expr)) if not allowed_metric(name, contract)}
    assert not unknown, f"metrics docs/monitoring.md does not list: {sorted(unknown)}"


def test_queries_are_valid_promql(dashboard, tmp_path):
    queries = expressions(dashboard)
    rules = [{"record": f"dashboard:query_{i}", "expr": substitute(expr)} for i, (_, expr) in enumerate(queries)]
    assert rules
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    try:
        run_promtool("check", "rules", str(path))
    except AssertionError as exc:  # promtool names the rule; say which panel it came from
        legend = "\n".join(f"dashboard:query_{i} = {where}" for i, (where, _) in enumerate(queries))
        raise AssertionError(f"{exc}\n{legend}") from None
