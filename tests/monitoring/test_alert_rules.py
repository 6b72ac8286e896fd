"""The alert rules (monitoring/rules/*.yml, written from monitoring/alerts.yml): promtool's syntax check
and unit tests, one case per file, and what promtool does not check: every alert has its labels and
annotations, fires in a unit test and stays silent in a near miss, and reads only metrics of the
contract in docs/monitoring.md (or node_*, DCGM_*, up). What else follows each alert's definition:
test_alert_definitions.py.

The helpers (promtool, metric_names, contract_metrics, allowed_metric) serve test_dashboard.py too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "monitoring" / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.yml"))
TEST_FILES = sorted((RULES_DIR / "tests").glob("*.yml"))
DOC = REPO / "docs" / "monitoring.md"
SEVERITIES = {"critical", "warning"}
ANNOTATIONS = ("summary", "first_command", "runbook")
# Metrics that come with their own exporters rather than the contract's tables.
FOREIGN = re.compile(r"^(node_\w+|DCGM_\w+|up)$")


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.skip("promtool is not installed (Debian package prometheus: scripts/install_system_packages.sh)")
    return path


def run_promtool(*args: str) -> None:
    result = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"


# Clauses whose parentheses hold label names, not series.
LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
            "offset", "Inf", "NaN", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a lexical scan, enough for these rules)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"' r"|'(?:[^'\\]|\\.)*'", '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = LABEL_LISTS.sub(" ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.:])[a-zA-Z_:][\w:]*", expr):
        name = match.group()
        if name in KEYWORDS or expr[match.end():].lstrip().startswith("("):  # a function or aggregation
            continue
        names.add(name)
    return names


def contract_metrics() -> set[str]:
    """The metric names of the tables under docs/monitoring.md's "## Metrics"."""
    text = DOC.read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(llm_\w+)", section, re.MULTILINE))


def allowed_metric(name: str, contract: set[str]) -> bool:
    return name in contract or bool(FOREIGN.match(name))


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def alerts() -> list[dict]:
    return [rule for path in RULE_FILES for group in load(path)["groups"] for rule in group["rules"]
            if "alert" in rule]


def alert_cases() -> list[tuple[str, dict]]:
    """(alert name, alert_rule_test) of every test file."""
    return [(case["alertname"], case) for path in TEST_FILES for test in load(path)["tests"]
            for case in test.get("alert_rule_test", [])]


ALERTS = alerts()
ALERT_NAMES = [rule["alert"] for rule in ALERTS]


def test_rule_and_test_files_exist():
    assert RULE_FILES and TEST_FILES and ALERTS


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path):
    run_promtool("check", "rules", str(path))


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules(path):
    run_promtool("test", "rules", str(path))


def test_every_rule_file_is_unit_tested():
    tested = {(path.parent / name).resolve() for path in TEST_FILES for name in load(path)["rule_files"]}
    assert {path.resolve() for path in RULE_FILES} <= tested


def test_alert_names_unique():
    assert len(ALERT_NAMES) == len(set(ALERT_NAMES))


@pytest.mark.parametrize("rule", ALERTS, ids=lambda r: r["alert"])
def test_alert_has_severity_and_annotations(rule):
    assert rule.get("labels", {}).get("severity") in SEVERITIES
    annotations = rule.get("annotations", {})
    for key in ANNOTATIONS:
        assert str(annotations.get(key, "")).strip(), f"{rule['alert']}: no {key}"
    assert annotations["runbook"] == f"docs/monitoring.md#{rule['alert'].lower()}"


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_alert_fires_and_near_misses_in_unit_tests(name):
    cases = [case for alertname, case in alert_cases() if alertname == name]
    firing = [case for case in cases if case.get("exp_alerts")]
    assert firing, f"{name}: no unit test where it fires"
    assert any(not case.get("exp_alerts") for case in cases), f"{name}: no unit test where it stays silent"
    for case in firing:
        for alert in case["exp_alerts"]:
            assert alert.get("exp_labels", {}).get("severity"), f"{name} at {case['eval_time']}: labels not checked"
            assert alert.get("exp_annotations", {}).get("summary"), f"{name} at {case['eval_time']}: summary not checked"


def test_unit_tests_name_only_known_alerts():
    assert {name for name, _ in alert_cases()} <= set(ALERT_NAMES)


def test_metric_names_scan():
    expr = ('max by (model) (rate(llm_a_total{x="y"}[5m])) > on(model) group_left(reason) 1e3 * llm_b '
            'or label_replace(absent(up{job="head_node"}), "problem", "a b", "", "") and NaN != llm_c')
    assert metric_names(expr) == {"llm_a_total", "llm_b", "up", "llm_c"}


@pytest.mark.parametrize("rule", ALERTS, ids=lambda r: r["alert"])
def test_alert_reads_only_contract_metrics(rule):
    contract = contract_metrics()
    # The annotations' own queries too, e.g. {{ with query "max(llm_slurm_spare_nodes)" }}.
    queries = re.findall(r'query\s+"((?:[^"\\]|\\.)*)"', " ".join(map(str, rule["annotations"].values())))
    names = set().union(*map(metric_names, [rule["expr"], *queries]))
    assert names
    unknown = sorted(name for name in names if not allowed_metric(name, contract))
    assert not unknown, f"{rule['alert']} reads metrics docs/monitoring.md does not list: {unknown}"
