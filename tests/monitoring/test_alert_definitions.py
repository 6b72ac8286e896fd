"""monitoring/alerts.yml defines every alert once (cluster_config/alerts.py); everything else about an alert
follows it or fails here, naming what to add:

- the rule files and docs/monitoring.md's alert table and delivery cost are what ``python -m cluster_config
  alerts`` writes, and the rule files read back as defined;
- every alert has its drill on the local cluster (a test of tests/local_cluster/test_alerts.py that names it,
  and a row with its `for` in docs/local_cluster.md's table), or a written reason why it has none;
- every alert has its runbook section in docs/monitoring.md;
- the docs' alert counts and the delivery cost they quote are the current ones.

That every alert has promtool cases, firing and near miss: tests/monitoring/test_alert_rules.py.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster_config.alerts import (ALERTS_FILE, AlertDefinitionError, generate, load_definitions,
                                   stale_rule_files)
from cluster_config.monitoring import RULES_DIR, load_rule_files
from cluster_config.monitoring_cost import monitoring_cost
from cluster_config.settings import available_environments, load_settings

REPO = Path(__file__).resolve().parents[2]
DEFINITIONS = load_definitions()
ALERTS = DEFINITIONS.alerts
DRILLED = [alert for alert in ALERTS if alert.drill]
DRILL_FILE = "tests/local_cluster/test_alerts.py"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COST_LINE = "alert delivery (Amazon Managed Service for Prometheus, SNS):"


def by_name(alert) -> str:
    return alert.name


def section(path: Path, heading: str) -> str:
    """The text under ``## heading`` of a document, up to the next ``## ``."""
    return path.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


# --- what is written from the definitions ------------------------------------------------------------
def test_committed_files_equal_a_fresh_generation():
    stale = [str(path.relative_to(REPO)) for path, text in generate(DEFINITIONS).items() if path.read_text() != text]
    stale += [f"{path.relative_to(REPO)} (no such rule file in monitoring/alerts.yml)"
              for path in stale_rule_files(DEFINITIONS)]
    assert not stale, f"not as monitoring/alerts.yml says: {stale}; run .venv/bin/python -m cluster_config alerts"


def test_the_rule_files_read_back_as_defined():
    rules = {rule["alert"]: (group["name"], rule) for text in load_rule_files().values()
             for group in yaml.safe_load(text)["groups"] for rule in group["rules"]}
    assert sorted(rules) == sorted(alert.name for alert in ALERTS)
    for alert in ALERTS:
        group, rule = rules[alert.name]
        assert (group, rule["expr"].strip(), rule.get("for", "")) == (alert.group, alert.expr, alert.for_)
        assert rule["labels"] == {"severity": alert.severity}
        assert rule["annotations"] == {"summary": alert.summary, "first_command": alert.first_command,
                                       "runbook": alert.runbook}


def test_the_command_that_writes_them_answers_help():
    result = subprocess.run([sys.executable, "-m", "cluster_config", "alerts", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "monitoring/alerts.yml" in result.stdout, result.stderr


@pytest.mark.parametrize("change, message", [
    (lambda alert: alert.pop("no_drill"), "give either drill"),
    (lambda alert: alert.update(drill=f"{DRILL_FILE}::test_x"), "give either drill"),
    (lambda alert: alert.pop("fires_when"), "missing ['fires_when']"),
    (lambda alert: alert.update(severity="page"), "severity 'page'"),
    (lambda alert: alert.update(group="storage"), "group 'storage' is in no rule file"),
    (lambda alert: alert.update(alert="TrainingStalled"), "alert TrainingStalled is defined twice"),
    (lambda alert: alert.update(runbook="x"), "unknown ['runbook']"),
], ids=["no drill nor reason", "drill and reason", "no table line", "severity", "group", "twice", "unknown field"])
def test_a_definition_missing_what_an_alert_needs_is_refused(tmp_path, change, message):
    document = yaml.safe_load(ALERTS_FILE.read_text())
    [alert] = [a for a in document["alerts"] if a["alert"] == "FileSystemFillingUp"]  # the one without a drill
    change(alert)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(document))
    with pytest.raises(AlertDefinitionError, match=re.escape(message)):
        load_definitions(tmp_path / "alerts.yml")


# --- drills on the local cluster -----------------------------------------------------------------------
def drill_module() -> ast.Module:
    return ast.parse((REPO / DRILL_FILE).read_text())


def strings_in(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


@pytest.mark.parametrize("alert", DRILLED, ids=by_name)
def test_a_drilled_alert_names_a_test_on_the_local_cluster_that_raises_it(alert):
    path, _, test = alert.drill.partition("::")
    function, _, parameter = test.rstrip("]").partition("[")
    assert path == DRILL_FILE, f"{alert.name}: its drill must be a test of {DRILL_FILE}, not {path}"
    tests = {node.name: node for node in drill_module().body if isinstance(node, ast.FunctionDef)}
    assert function in tests, f"{alert.name}: no {function} in {DRILL_FILE}: write the drill or fix the name"
    assert alert.name in strings_in(tests[function]), f"{alert.name}: {function} does not name it"
    assert parameter in ("", alert.name), f"{alert.name}: {alert.drill} is another alert's case"


def test_the_drills_run_exactly_the_drilled_alerts():
    """test_alerts.py's ALERTS: the alerts its drills raise, one result each."""
    [names] = [node.value for node in drill_module().body if isinstance(node, ast.Assign)
               and [getattr(target, "id", "") for target in node.targets] == ["ALERTS"]]
    assert sorted(ast.literal_eval(names)) == sorted(alert.name for alert in DRILLED)


def local_cluster_table() -> dict[str, str]:
    """Alert -> its rule's `for`, from the drills' table in docs/local_cluster.md ("| A, B (10m) | ...")."""
    rows = re.findall(r"^\| ([\w, ]+) \((\w+)\) \|", section(REPO / "docs/local_cluster.md", "Monitoring and alerts"),
                      re.MULTILINE)
    return {name: wait for names, wait in rows for name in names.split(", ")}


@pytest.mark.parametrize("alert", ALERTS, ids=by_name)
def test_the_local_cluster_docs_time_each_drill_or_say_why_there_is_none(alert):
    table = local_cluster_table()
    if alert.drill:
        assert alert.name in table, f"{alert.name}: no row (its fault and seconds) in docs/local_cluster.md's table"
        assert table[alert.name] == (alert.for_ or "0s"), f"{alert.name}: the table says `for` {table[alert.name]}"
    else:
        assert alert.name not in table, f"{alert.name} has no drill, yet a row in docs/local_cluster.md's table"
        assert alert.name in section(REPO / "docs/local_cluster.md", "Monitoring and alerts"), (
            f"{alert.name}: docs/local_cluster.md must say why it has no fault there ({alert.no_drill})")


# --- runbook, counts and costs in the docs -------------------------------------------------------------
def test_the_runbook_has_a_section_per_alert_in_their_order():
    headings = re.findall(r"^### (.+)$", section(REPO / "docs/monitoring.md", "Alerts"), re.MULTILINE)
    assert headings == [alert.name for alert in ALERTS], "docs/monitoring.md's '### <alert>' sections under '## Alerts'"


def test_the_docs_count_the_alerts():
    """"17 alerts", "16 of the 17 alerts" (those with a drill), and "17 alerts (A, B, ...)" naming each."""
    wrong = []
    for doc in DOCS:
        text = " ".join(doc.read_text().split())
        for match in re.finditer(r"\b(?:(\d+) of the )?(\d+) alerts\b", text):
            drilled, total = match.groups()
            if int(total) != len(ALERTS) or drilled and int(drilled) != len(DRILLED):
                wrong.append(f"{doc.name}: '{match.group()}'")
        for match in re.finditer(r"\b\d+ alerts \(([^)]*)\)", text):
            if sorted(match.group(1).replace(" and ", ", ").split(", ")) != sorted(a.name for a in ALERTS):
                wrong.append(f"{doc.name}: '{match.group()}' does not name each alert once")
    assert not wrong, f"monitoring/alerts.yml has {len(ALERTS)} alerts, {len(DRILLED)} with a drill: {wrong}"


def test_the_docs_quote_the_current_delivery_cost():
    """`make plan`'s line as the docs quote it, and payloads.md's rounded prod figure."""
    rule_files = load_rule_files()
    costs = {env: monitoring_cost(load_settings(env), rule_files=rule_files) for env in available_environments()}
    quotes = [(doc.name, line.strip()) for doc in DOCS for line in doc.read_text().splitlines() if COST_LINE in line]
    assert quotes
    stale = [f"{name}: {line}" for name, line in quotes if line not in {cost.summary() for cost in costs.values()}]
    assert not stale, f"not what `make plan` prints now ({costs['prod'].summary()}): {stale}"
    assert f"prod: about ${costs['prod'].monthly_usd:,.0f} a month" in (REPO / "docs/payloads.md").read_text()
