"""Builds the whole CDK app for one environment: used by ``app.py`` and by the tests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import aws_cdk as cdk

from cluster_config.capacity_end import check_capacity_end
from cluster_config.monitoring import RULES_DIR, load_rule_files
from cluster_config.plan import check_plan
from cluster_config.settings import CONFIG_DIR, Settings, SettingsError, available_environments, load_settings
from cluster_config.slurm_timeouts import usr1_lead_seconds
from stacks import nag
from stacks.alerts_stack import AlertsStack
from stacks.cluster_stack import ClusterStack
from stacks.database_stack import DatabaseStack
from stacks.network_stack import NetworkStack
from stacks.storage_stack import StorageStack

CDK_JSON = Path(__file__).resolve().parent.parent / "cdk.json"


@dataclass(frozen=True)
class CdkApp:
    app: cdk.App
    settings: Settings
    stacks: dict[str, cdk.Stack]  # "network", "storage", "database", "alerts", "cluster"


def new_app(outdir: Optional[str] = None) -> cdk.App:
    """An App with the feature flags of ``cdk.json``, so tests synthesize what the CLI does."""
    context = json.loads(CDK_JSON.read_text())["context"]
    return cdk.App(outdir=outdir, context=context)


def settings_for(env_name: Optional[str], config_dir: Path = CONFIG_DIR) -> Settings:
    if not env_name:
        available = ", ".join(available_environments(config_dir)) or "none"
        raise SettingsError(f"no environment chosen: pass -c env=NAME (available: {available})")
    settings = load_settings(env_name, config_dir)
    check_plan(settings)  # a model that cannot fit in GPU memory, or overflowing checkpoints, stop synth
    check_capacity_end(settings)  # a Capacity Block end that a model's last save could run past
    usr1_lead_seconds(settings)  # checkpoint storage too slow for every model's last saves at once
    return settings


def add_stacks(app: cdk.App, settings: Settings, rules_dir: Path = RULES_DIR) -> dict[str, cdk.Stack]:
    """Add the environment's stacks to ``app``, checked by cdk-nag. Stack names: llm-<env>-<part>.

    Raises RuleFilesError when ``rules_dir`` holds no valid Prometheus rule file."""
    prefix = f"llm-{settings.name}"
    env = cdk.Environment(account=settings.account, region=settings.region)
    tags = {**settings.tags, "environment": settings.name}

    network = NetworkStack(app, f"{prefix}-network", settings=settings, env=env, tags=tags)
    storage = StorageStack(app, f"{prefix}-storage", settings=settings, network=network, env=env, tags=tags)
    database = DatabaseStack(app, f"{prefix}-database", settings=settings, network=network, env=env, tags=tags)
    alerts = AlertsStack(
        app, f"{prefix}-alerts", settings=settings, rule_files=load_rule_files(rules_dir), env=env, tags=tags
    )
    cluster = ClusterStack(
        app, f"{prefix}-cluster", settings=settings, network=network, storage=storage, database=database,
        alerts=alerts, env=env, tags=tags,
    )

    nag.add_checks(app)
    nag.acknowledge_network(network)
    nag.acknowledge_bucket_deployment(cluster)
    nag.acknowledge_database(database)
    return {"network": network, "storage": storage, "database": database, "alerts": alerts, "cluster": cluster}


def build_app(
    env_name: str, *, config_dir: Path = CONFIG_DIR, outdir: Optional[str] = None, rules_dir: Path = RULES_DIR
) -> CdkApp:
    """Load ``env_name``'s settings and build its app (not yet synthesized)."""
    settings = settings_for(env_name, config_dir)
    app = new_app(outdir)
    return CdkApp(app=app, settings=settings, stacks=add_stacks(app, settings, rules_dir))
