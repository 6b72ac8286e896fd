"""Every alert, defined once in monitoring/alerts.yml, and what is written from it (docs/monitoring.md#alerts).

    python -m cluster_config alerts       write what follows from monitoring/alerts.yml

Written from the definitions:
- the rule files, monitoring/rules/<file>.yml: the alerts stack deploys each as an AMP rule groups
  namespace, the local cluster's Prometheus loads them, promtool's cases test them;
- in docs/monitoring.md, between markers: the alert table, and the delivery cost's figures
  (monitoring_cost.py, with the rule files as written).

tests/monitoring/test_alert_definitions.py checks that the committed files equal a fresh ``generate()``,
and holds what cannot be written to the definitions: each alert's promtool cases, its drill on the local
cluster (or the written reason it has none), its runbook section, the counts and costs the docs quote.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import yaml

from cluster_config.monitoring import RULES_DIR
from cluster_config.monitoring_cost import EFA_INTERFACES, monitoring_cost
from cluster_config.settings import load_settings

REPO = Path(__file__).resolve().parent.parent
ALERTS_FILE = REPO / "monitoring" / "alerts.yml"
MONITORING_DOC = REPO / "docs" / "monitoring.md"
SEVERITIES = ("critical", "warning")
REQUIRED = ("alert", "group", "why", "expr", "severity", "summary", "first_command", "fires_when")
OPTIONAL = ("for", "drill", "no_drill")
WRITTEN_BY = "`python -m cluster_config alerts` from monitoring/alerts.yml"


class AlertDefinitionError(ValueError):
    """monitoring/alerts.yml (or a marker in the docs) is not as this module expects; the message says what to fix."""


@dataclass(frozen=True)
class Alert:
    name: str
    group: str
    why: str
    expr: str
    for_: str  # "" when the rule fires at its first evaluation
    severity: str
    summary: str
    first_command: str
    fires_when: str
    drill: str  # the pytest node id of its drill on the local cluster, or ""
    no_drill: str  # why it has no drill, or ""

    @property
    def runbook(self) -> str:
        """Its section of docs/monitoring.md (GitHub's anchor of the heading ``### <name>``)."""
        return f"docs/monitoring.md#{self.name.lower()}"


@dataclass(frozen=True)
class RuleFile:
    name: str  # monitoring/rules/<name>.yml; AMP's rule groups namespace
    groups: tuple[str, ...]
    comment: str


@dataclass(frozen=True)
class Definitions:
    rule_files: tuple[RuleFile, ...]
    alerts: tuple[Alert, ...]


def load_definitions(path: Path = ALERTS_FILE) -> Definitions:
    """Read and check ``path``: every field each alert needs, a known severity and group, unique names,
    exactly one of ``drill`` and ``no_drill``."""
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise AlertDefinitionError(f"{path}: not valid YAML ({exc}) — fix it where the message points") from None
    if not isinstance(document, dict) or set(document) != {"rule_files", "alerts"}:
        raise AlertDefinitionError(f"{path}: expected the keys rule_files and alerts — see the comment at its top")
    for name, spec in document["rule_files"].items():
        if not isinstance(spec, dict) or set(spec) != {"groups", "comment"}:
            raise AlertDefinitionError(f"{path}: rule file {name}: expected groups and comment — "
                                       "see the comment at its top")
    rule_files = tuple(RuleFile(name, tuple(spec["groups"]), spec["comment"].strip())
                       for name, spec in document["rule_files"].items())
    groups = [group for rule_file in rule_files for group in rule_file.groups]
    alerts, seen = [], set()
    for entry in document["alerts"]:
        name = entry.get("alert", "?")
        missing = [key for key in REQUIRED if not str(entry.get(key, "")).strip()]
        unknown = sorted(set(entry) - set(REQUIRED) - set(OPTIONAL))
        if missing or unknown:
            raise AlertDefinitionError(f"{path}: alert {name}: missing {missing}, unknown {unknown} — "
                                       f"the fields are {', '.join(REQUIRED + OPTIONAL)}")
        if entry["severity"] not in SEVERITIES:
            raise AlertDefinitionError(f"{path}: alert {name}: severity {entry['severity']!r} — "
                                       f"use one of {SEVERITIES}")
        if entry["group"] not in groups:
            raise AlertDefinitionError(f"{path}: alert {name}: group {entry['group']!r} is in no rule file — "
                                       f"use one of {groups} or add it to rule_files")
        if bool(entry.get("drill")) == bool(entry.get("no_drill")):
            raise AlertDefinitionError(f"{path}: alert {name}: give either drill (the test of "
                                       "tests/local_cluster/test_alerts.py that raises it) or no_drill (why none can)")
        if name in seen:
            raise AlertDefinitionError(f"{path}: alert {name} is defined twice — rename or remove one")
        seen.add(name)
        alerts.append(Alert(
            name=name, group=entry["group"], why=entry["why"].strip(), expr=entry["expr"].strip(),
            for_=str(entry.get("for", "")), severity=entry["severity"], summary=entry["summary"],
            first_command=entry["first_command"], fires_when=entry["fires_when"].strip(),
            drill=entry.get("drill", ""), no_drill=" ".join(entry.get("no_drill", "").split()),
        ))
    return Definitions(rule_files, tuple(alerts))


# --- the rule files ----------------------------------------------------------------------------------
def rule_file_text(definitions: Definitions, rule_file: RuleFile) -> str:
    """The Prometheus rule file, each rule under its ``why`` as a comment."""
    lines = [f"# Written by {WRITTEN_BY}: edit the alerts there.", *_comment(rule_file.comment, 0), "groups:"]
    for number, group in enumerate(rule_file.groups):
        if number:
            lines.append("")
        lines += [f"  - name: {group}", "    rules:"]
        for index, alert in enumerate(a for a in definitions.alerts if a.group == group):
            if index:
                lines.append("")
            lines += [*_comment(alert.why, 6), f"      - alert: {alert.name}", *_field("expr", alert.expr, 8)]
            if alert.for_:
                lines.append(f"        for: {alert.for_}")
            lines += ["        labels:", f"          severity: {alert.severity}", "        annotations:",
                      f"          summary: {json.dumps(alert.summary, ensure_ascii=False)}",
                      f"          first_command: {json.dumps(alert.first_command, ensure_ascii=False)}",
                      f"          runbook: {json.dumps(alert.runbook)}"]
    return "\n".join(lines) + "\n"


def _comment(text: str, indent: int) -> list[str]:
    return [" " * indent + f"# {line}".rstrip() for line in text.splitlines()]


def _field(key: str, value: str, indent: int) -> list[str]:
    """``key: value``: a literal block for several lines; one line plain where YAML reads it back unchanged,
    else in double quotes (JSON's escapes are YAML's)."""
    pad = " " * indent
    if "\n" in value:
        return [f"{pad}{key}: |", *(f"{pad}  {line}".rstrip() for line in value.splitlines())]
    try:
        plain = yaml.safe_load(value) == value
    except yaml.YAMLError:
        plain = False
    return [f"{pad}{key}: {value if plain else json.dumps(value, ensure_ascii=False)}"]


# --- docs/monitoring.md ------------------------------------------------------------------------------
def alert_table(definitions: Definitions) -> str:
    rows = [f"| {a.name} | {a.severity} | {a.for_ or '-'} | {a.fires_when} |" for a in definitions.alerts]
    return "\n".join(["| alert | severity | for | fires when |", "|---|---|---|---|", *rows])


def delivery_cost(rule_files: Mapping[str, str]) -> str:
    """prod's series, samples and monthly cost, and dev's total, as docs/monitoring.md ("What it costs") states them."""
    prod, dev = load_settings("prod"), load_settings("dev")
    cost, dev_cost = monitoring_cost(prod, rule_files=rule_files), monitoring_cost(dev, rule_files=rule_files)
    series, gpu = cost.series, prod.gpu_queue
    efa = f"the EFA counters of {EFA_INTERFACES[gpu.instance_type]} devices on each of " if gpu.efa.enabled else ""
    text = (
        f"For prod, {sum(series.values()):,} series ({series['compute nodes']:,} from the compute nodes' exporters, "
        f"{efa}{gpu.max_count} {gpu.instance_type} nodes; {series['dcgm']:,} GPU series; {series['exporter']:,} "
        f"of the exporter) are {cost.samples_per_month / 1e9:.2f} billion samples a month: "
        f"**~${cost.monthly_usd:,.0f} a month**, nearly all ingestion (${cost.ingestion_usd:,.0f}; storage "
        f"${cost.storage_usd:,.2f}, rule evaluation ${cost.rule_evaluation_usd:,.2f}, KMS and SNS "
        f"${cost.kms_usd + cost.sns_usd:,.0f}). Dev costs about ${dev_cost.monthly_usd:,.0f}."
    )
    return textwrap.fill(text, width=104, break_long_words=False, break_on_hyphens=False)


def replace_block(text: str, name: str, body: str, where: Path) -> str:
    """``text`` with what lies between the markers of block ``name`` replaced by ``body``."""
    start, end = f"<!-- {name}: written by {WRITTEN_BY} -->", f"<!-- end of {name} -->"
    pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise AlertDefinitionError(f"{where}: expected one {start} ... {end} block — put its markers back")
    return pattern.sub(lambda _: f"{start}\n{body}\n{end}", text)


# --- all of it ---------------------------------------------------------------------------------------
def generate(definitions: Definitions) -> dict[Path, str]:
    """Every written file's text by its path: the rule files, and docs/monitoring.md with its blocks refreshed."""
    rules = {rule_file.name: rule_file_text(definitions, rule_file) for rule_file in definitions.rule_files}
    doc = replace_block(MONITORING_DOC.read_text(), "alert table", alert_table(definitions), MONITORING_DOC)
    doc = replace_block(doc, "delivery cost", delivery_cost(rules), MONITORING_DOC)
    return {**{RULES_DIR / f"{name}.yml": text for name, text in rules.items()}, MONITORING_DOC: doc}


def stale_rule_files(definitions: Definitions) -> list[Path]:
    """Rule files in monitoring/rules/ that the definitions no longer name (every *.yml there is deployed)."""
    names = {rule_file.name for rule_file in definitions.rule_files}
    return [path for path in sorted(RULES_DIR.glob("*.yml")) if path.stem not in names]


def write(definitions: Definitions) -> list[str]:
    """Write every generated file and remove stale rule files; one line per file, saying what happened."""
    report = []
    for path, text in generate(definitions).items():
        changed = not path.exists() or path.read_text() != text
        if changed:
            path.write_text(text)
        report.append(f"{'wrote' if changed else 'unchanged'} {path.relative_to(REPO)}")
    for path in stale_rule_files(definitions):
        path.unlink()
        report.append(f"removed {path.relative_to(REPO)} (no rule file of that name in monitoring/alerts.yml)")
    return report
