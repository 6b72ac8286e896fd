"""The deploy-true check of one environment: emulated deploy, ParallelCluster's validators, its update checks.

    report = check_environment(settings, stacks, templates)    # stacks/templates from one synth
    report.errors / report.open_warnings / report.acknowledged / report.validators / report.updates

ParallelCluster runs in its own venv (``.venv-pcluster``, ``scripts/install_tool_venv.sh``),
started as a child process; the emulated account is a moto server on 127.0.0.1 for the duration.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable



from cluster_config.emulated import PclusterNotInstalled
from cluster_config.emulated.account import Deployed, deploy
from cluster_config.emulated.acknowledged import reason_for
from cluster_config.emulated.moto_server import FAKE_AWS_ENV, running
from cluster_config.emulated.stubs import reservation_description
from cluster_config.offerings import is_offered
from cluster_config.render import ClusterResources, render_cluster_config, to_yaml
from cluster_config.settings import Settings

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PCLUSTER_PYTHON = REPO_ROOT / ".venv-pcluster" / "bin" / "python"
INSTALL_HINT = "install it with: make deps (scripts/install_tool_venv.sh .venv-pcluster requirements-pcluster.txt)"


@dataclass
class Report:
    env: str
    config: dict[str, Any]
    failures: list[dict[str, str]]  # ParallelCluster's {level, validator, message}
    load_error: str | None  # the config did not even load (schema)
    validators: list[str]
    stubbed: list[str]
    updates: dict[str, dict[str, Any]] = field(default_factory=dict)  # scenario -> {allowed, rows}
    # node (HeadNode or a queue) -> {managed_policy_arns, statements}: the roles ParallelCluster's template makes
    iam: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def errors(self) -> list[dict[str, str]]:
        found = [f for f in self.failures if f["level"] == "ERROR"]
        return found + ([{"level": "ERROR", "validator": "ClusterSchema", "message": self.load_error}] if self.load_error else [])

    @property
    def warnings(self) -> list[dict[str, str]]:
        return [f for f in self.failures if f["level"] == "WARNING"]

    @property
    def acknowledged(self) -> list[tuple[dict[str, str], str]]:
        return [(w, reason_for(w)) for w in self.warnings if reason_for(w)]

    @property
    def open_warnings(self) -> list[dict[str, str]]:
        return [w for w in self.warnings if not reason_for(w)]


NEW_RESERVATION_ID = "cr-0f1e2d3c4b5a69788"  # a reservation bought after the cluster was created


# Settings changes a user makes while the cluster runs: name -> edit of the settings' plain dict.
def update_scenarios(settings: Settings) -> dict[str, Callable[[dict], None]]:
    models = [model.name for model in settings.models]

    def add_model(raw: dict) -> None:  # split the largest model in two (prod: model7 -> model7 + model8)
        largest = max(raw["models"], key=lambda model: model["nodes"])
        half = largest["nodes"] // 2
        if half:
            largest["nodes"] -= half
            largest.pop("min_nodes", None)  # sized for the whole model: a user halving it sets them again
            raw["models"].append({**largest, "name": f"model{len(raw['models']) + 1}", "nodes": half})

    def remove_model(raw: dict) -> None:
        raw["models"].pop()

    def resize_model(raw: dict) -> None:
        raw["models"][0]["nodes"] = max(1, raw["models"][0]["nodes"] - 1)

    def lower_gpu_max_count(raw: dict) -> None:  # with the first model one node smaller, so the plan fits
        resize_model(raw)
        queue = raw["gpu_queue"]
        queue["max_count"] -= 1
        blocks = [r for r in queue.get("capacity_reservations") or [] if r.get("kind") == "capacity_block"]
        if blocks:  # every node of a block runs: one node fewer is a block one instance smaller
            blocks[-1]["instance_count"] -= 1
        queue["min_count"] = min(queue.get("min_count", 0), queue["max_count"])

    def add_reservation(raw: dict) -> None:  # one more reservation of the same kind: 8 more nodes
        queue = raw["gpu_queue"]
        queue["capacity_reservations"].append({**queue["capacity_reservations"][-1], "id": NEW_RESERVATION_ID,
                                               "instance_count": 8})
        queue["max_count"] += 8
        if queue["capacity_reservations"][-1].get("kind") == "capacity_block":
            queue["min_count"] += 8

    def raise_head_node_bootstrap_timeout(raw: dict) -> None:
        raw["head_node"]["bootstrap_timeout_s"] += 1800

    def replace_reservation(raw: dict) -> None:  # the last reservation's slot, held by a new one (a new block)
        raw["gpu_queue"]["capacity_reservations"][-1]["id"] = NEW_RESERVATION_ID

    def raise_cpu_max_count(raw: dict) -> None:
        raw["cpu_queue"]["max_count"] *= 2

    def cpu_instance_type(raw: dict) -> None:
        family, size = raw["cpu_queue"]["instance_type"].split(".")
        other = next(s for s in ("16xlarge", "12xlarge", "4xlarge", "2xlarge")
                     if s != size and is_offered(settings.region, f"{family}.{s}"))
        raw["cpu_queue"]["instance_type"] = f"{family}.{other}"

    scenarios = {"add a model": add_model, "resize a model": resize_model, "lower gpu_queue.max_count": lower_gpu_max_count,
                 "raise cpu_queue.max_count": raise_cpu_max_count, "change cpu_queue.instance_type": cpu_instance_type,
                 "raise head_node.bootstrap_timeout_s": raise_head_node_bootstrap_timeout}
    if models:
        scenarios["remove a model"] = remove_model
    if settings.gpu_queue.capacity_reservations:
        scenarios["add a capacity reservation"] = add_reservation
        scenarios["replace a capacity reservation"] = replace_reservation
    return scenarios


def check_environment(
    settings: Settings,
    stacks: dict,
    templates: dict[str, dict],
    *,
    with_updates: bool = True,
    with_iam: bool = False,
    edit_config: Callable[[dict], None] | None = None,
    extra_updates: Callable[[Deployed], dict[str, tuple[dict, dict]]] | None = None,
) -> Report:
    """Deploy into a fresh emulated account, validate the rendered config, check the update scenarios.

    ``with_iam`` also returns the node roles ParallelCluster's template would create (``Report.iam``).
    ``edit_config`` changes the rendered config before validation and ``extra_updates`` adds
    (base, target) config pairs to check: tests use them to re-create configs the settings now refuse.
    """
    if not PCLUSTER_PYTHON.is_file():
        raise PclusterNotInstalled(f"ParallelCluster's venv is missing ({PCLUSTER_PYTHON}); {INSTALL_HINT}")
    previous = {key: os.environ.get(key) for key in FAKE_AWS_ENV}
    os.environ.update(FAKE_AWS_ENV)
    try:
        with running(settings.account) as endpoint:
            deployed = deploy(endpoint, settings, stacks, templates)
            if edit_config:
                edit_config(deployed.config)
            patches = {name: [to_yaml(base), to_yaml(target)] for name, (base, target) in (extra_updates(deployed) if extra_updates else {}).items()}
            reservations = {r["CapacityReservationId"]: r for r in reservation_description(settings.model_dump())}
            if with_updates:
                for name, edit in update_scenarios(settings).items():
                    changed = _changed_settings(settings, edit)
                    patches[name] = [to_yaml(deployed.config), to_yaml(render_cluster_config(changed, deployed.resources))]
                    for reservation in reservation_description(changed.model_dump()):  # one bought since
                        reservations.setdefault(reservation["CapacityReservationId"], reservation)
            answer = _run_child({
                "endpoint": endpoint, "region": settings.region, "cluster_name": settings.cluster_name,
                "config": to_yaml(deployed.config), "reservations": list(reservations.values()),
                "placement_groups": deployed.placement_groups, "patches": patches, "iam": with_iam,
            })
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return Report(settings.name, deployed.config, answer["failures"], answer["error"], answer["validators"],
                  answer["stubbed"], answer["patches"], answer["iam"])


def update_check(base: Settings, target: Settings) -> dict[str, Any]:
    """ParallelCluster's update check of going from ``base`` to ``target`` settings on a running cluster.

    Both are rendered with the same placeholder ids, so only the settings' difference is checked.
    Returns ``{"allowed": bool, "rows": [[path, parameter, old, new, check, reason, action, policy], ...]}``.
    """
    if not PCLUSTER_PYTHON.is_file():
        raise PclusterNotInstalled(f"ParallelCluster's venv is missing ({PCLUSTER_PYTHON}); {INSTALL_HINT}")
    resources = ClusterResources.placeholders(target)
    configs = [to_yaml(render_cluster_config(settings, resources)) for settings in (base, target)]
    with running(target.account) as endpoint:
        answer = _run_child({
            "endpoint": endpoint, "region": target.region, "cluster_name": target.cluster_name, "config": None,
            "reservations": [], "placement_groups": [], "patches": {"update": configs},
        })
    return answer["patches"]["update"]


def _changed_settings(settings: Settings, edit: Callable[[dict], None]) -> Settings:
    raw = json.loads(settings.model_dump_json())
    edit(raw)
    return Settings(**raw)


def _run_child(request: dict) -> dict:
    proc = subprocess.run(
        [str(PCLUSTER_PYTHON), "-m", "cluster_config.emulated.pcluster_child"],
        input=json.dumps(request), capture_output=True, text=True, timeout=600, cwd=REPO_ROOT,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO_ROOT), "HOME": os.environ.get("HOME", "/tmp")},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ParallelCluster's checks crashed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def format_report(report: Report) -> str:
    lines = [f"{report.env}: emulated deploy + ParallelCluster {len(report.validators)} validators: "
             f"{len(report.errors)} errors, {len(report.acknowledged)} acknowledged warnings, {len(report.open_warnings)} open warnings"]
    lines += [f"  ERROR {f['validator']}: {f['message']}" for f in report.errors]
    lines += [f"  WARNING {f['validator']}: {f['message']}" for f in report.open_warnings]
    lines += [f"  acknowledged WARNING {w['validator']}: {w['message']}\n    why: {reason}" for w, reason in report.acknowledged]
    for name, result in report.updates.items():
        verdict = "accepted" if result["allowed"] else "REFUSED"
        lines.append(f"  update on a running cluster, {name}: {verdict}")
        if not result["allowed"]:
            lines += [f"    {row[0]}/{row[1]}: {row[5]}" for row in result["rows"] if row[4] != "SUCCEEDED"]
    return "\n".join(lines)





def validate_environments(envs: list[str]) -> int:
    """`make validate`: synthesize each environment, deploy it into the emulated account, print every result.

    Returns 1 when ParallelCluster reports an ERROR or a warning that is neither fixed nor acknowledged.
    """
    import tempfile

    from cluster_config.emulated.stubs import MOTO_GAPS, PCLUSTER_STUBS, TEMPLATE_EDITS
    from stacks import checkov
    from stacks.app import build_app  # the CDK app: synth needs aws_cdk

    failed = 0
    with tempfile.TemporaryDirectory(prefix="deploy-check-") as tmp:
        for env in envs:
            outdir = Path(tmp) / env
            built = build_app(env, outdir=str(outdir))
            built.app.synth()
            templates = {part: json.loads((outdir / f"{stack.artifact_id}.template.json").read_text())
                         for part, stack in built.stacks.items()}
            report = check_environment(built.settings, built.stacks, templates)
            print(format_report(report))
            print(f"  validators that ran: {', '.join(report.validators)}")
            print(f"  stubbed calls: {', '.join(report.stubbed)}")
            findings, summary = checkov.run(outdir)
            open_findings = [f for f in findings if not f.reason]
            print(f"  checkov: {summary['passed']} passed, {summary['failed']} failed, "
                  f"{summary['failed'] - len(open_findings)} of them accepted in stacks/checkov.py")
            print("".join(f"  checkov FAILED {f.check_id} {f.resource}: {f.title}\n" for f in open_findings), end="")
            failed += bool(report.errors or report.open_warnings or open_findings)
    print("stand-ins of the emulated account (cluster_config/emulated/stubs.py):")
    for what, why in {**TEMPLATE_EDITS, **MOTO_GAPS, **PCLUSTER_STUBS}.items():
        print(f"  - {what}: {why}")
    return 1 if failed else 0
