"""What alert delivery on AWS costs an environment a month (docs/monitoring.md, "Delivery on AWS").

    monitoring_cost(load_settings("prod")).monthly_usd

The path: the head node's Prometheus agent remote-writes the kept series (cluster_config/monitoring.py)
to Amazon Managed Service for Prometheus, which stores them and evaluates the rules; its alert manager
publishes to an SNS topic encrypted with a customer managed KMS key, which e-mails each address.

Prices: public list prices for us-east-1, read 2026-11-24 from
  https://aws.amazon.com/prometheus/pricing/  metric samples ingested (tiered per month), storage, query samples processed
  https://aws.amazon.com/sns/pricing/          e-mail notifications
  https://aws.amazon.com/kms/pricing/          a customer managed key
Other regions differ (ap-southeast-3, prod's, is typically 10-25 % higher: docs/cdk.md); no free tier counted.

The series are counted from the settings as the agent sends them: every node of both queues up all month
(max_count: an upper bound for dynamic nodes), the node exporter's kept metrics per EFA device, the DCGM
fields per GPU, the exporter's series per model, and `up` per target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

import yaml

from cluster_config.monitoring import DCGM_FIELDS, NODE_METRICS, RETENTION_DAYS, SCRAPE_INTERVAL_S, load_rule_files
from cluster_config.settings import Settings

HOURS_PER_MONTH = 730
# Metric samples ingested, per month: (samples in the tier, USD per sample).
INGESTION_TIERS = ((2e9, 0.90 / 1e7), (250e9, 0.35 / 1e7), (math.inf, 0.16 / 1e7))
STORAGE_USD_PER_GB_MONTH = 0.03  # GB = 2^30 bytes
QSP_USD_PER_SAMPLE = 0.10 / 1e9  # query samples processed; rule evaluations count as queries
SNS_EMAIL_USD = 2.00 / 1e5
KMS_KEY_USD_MONTH = 1.00
# "Typically 1 or 2 bytes" per stored sample (the pricing page), plus each series' labels.
BYTES_PER_SAMPLE = 2
BYTES_PER_SERIES = 1024
# A rule group's default evaluation interval in AMP, and how far back a rule is assumed to read.
RULE_INTERVAL_S = 60
RULE_LOOKBACK_S = 300
ALERT_EMAILS_PER_MONTH = 500  # per address: a bad week of node failures, with repeats every 4 hours

# EFA interfaces (each an EFA device) per instance type (EC2 User Guide, EFA supported instance types
# and their network cards).
EFA_INTERFACES = {
    "p4d.24xlarge": 4, "p4de.24xlarge": 4, "p5.48xlarge": 32, "p5e.48xlarge": 32, "p5en.48xlarge": 16,
    "g5.8xlarge": 1, "g5.12xlarge": 1, "g5.16xlarge": 1, "g5.24xlarge": 1, "g5.48xlarge": 1,
}
# docs/monitoring.md's exporter: 23 per-model metrics (llm_training_failed as its one series) and, per
# model, about 3 Slurm job rows (state, reason) and a restart count; per cluster Slurm's and the
# exporter's own 4, ~8 node states, and 3 file systems x 3.
EXPORTER_SERIES_PER_MODEL = 23 + 4
EXPORTER_SERIES_PER_CLUSTER = 4 + 8 + 9


class CostError(ValueError):
    """The settings name something the estimate cannot count; the message says what to add."""


@dataclass(frozen=True)
class MonitoringCost:
    series: Mapping[str, int]  # by source: head node, compute nodes, dcgm, exporter
    scrape_interval_s: int
    samples_per_month: float
    ingestion_usd: float
    storage_usd: float
    rule_evaluation_usd: float
    sns_usd: float
    kms_usd: float

    @property
    def monthly_usd(self) -> float:
        return self.ingestion_usd + self.storage_usd + self.rule_evaluation_usd + self.sns_usd + self.kms_usd

    def summary(self) -> str:
        total = sum(self.series.values())
        return (
            f"alert delivery (Amazon Managed Service for Prometheus, SNS): ~${self.monthly_usd:,.0f}/month for "
            f"{total:,} series every {self.scrape_interval_s} s ({self.samples_per_month / 1e9:.2f} B samples: "
            f"${self.ingestion_usd:,.0f} ingestion, ${self.storage_usd:,.2f} storage, "
            f"${self.rule_evaluation_usd:,.2f} rule evaluation, ${self.sns_usd + self.kms_usd:,.2f} SNS and KMS)"
        )


def node_series(instance_type: str, *, efa: bool) -> int:
    """The node exporter's kept series on one node (and its `up`)."""
    efa_devices = 0
    if efa:
        if instance_type not in EFA_INTERFACES:
            raise CostError(f"{instance_type}: its number of EFA interfaces is unknown; add it to "
                            "cluster_config/monitoring_cost.py EFA_INTERFACES (EC2 User Guide, EFA)")
        efa_devices = EFA_INTERFACES[instance_type]
    per = {"node": 1, "efa device": efa_devices}
    return sum(per[unit] for _, unit in NODE_METRICS.values()) + 1


def series_by_source(settings: Settings) -> dict[str, int]:
    gpu, cpu = settings.gpu_queue, settings.cpu_queue
    return {
        "head node": node_series(settings.head_node.instance_type, efa=False),
        "compute nodes": gpu.max_count * node_series(gpu.instance_type, efa=gpu.efa.enabled)
        + cpu.max_count * node_series(cpu.instance_type, efa=False),
        "dcgm": gpu.max_count * (gpu.gpus_per_instance * len(DCGM_FIELDS) + 1),
        "exporter": len(settings.models) * EXPORTER_SERIES_PER_MODEL + EXPORTER_SERIES_PER_CLUSTER,
    }


def ingestion_usd(samples: float) -> float:
    """AMP's tiered price for ``samples`` ingested in a month."""
    cost, below = 0.0, 0.0
    for size, price in INGESTION_TIERS:
        in_tier = min(max(samples - below, 0.0), size)
        cost += in_tier * price
        below += size
    return cost


def rule_evaluations_per_month(rule_files: Mapping[str, str]) -> float:
    seconds = HOURS_PER_MONTH * 3600
    total = 0.0
    for text in rule_files.values():
        for group in yaml.safe_load(text)["groups"]:
            total += len(group["rules"]) * seconds / _seconds(group.get("interval", f"{RULE_INTERVAL_S}s"))
    return total


def monitoring_cost(
    settings: Settings, *, rule_files: Optional[Mapping[str, str]] = None, scrape_interval_s: int = SCRAPE_INTERVAL_S
) -> MonitoringCost:
    """The monthly cost of ``settings``' delivery path. ``rule_files``: by default monitoring/rules/*.yml
    (load_rule_files, which raises RuleFilesError when there is none)."""
    rule_files = load_rule_files() if rule_files is None else rule_files
    series = series_by_source(settings)
    total_series = sum(series.values())
    samples = total_series * HOURS_PER_MONTH * 3600 / scrape_interval_s
    # Kept for RETENTION_DAYS: in a steady month the workspace holds that many days of samples.
    stored_bytes = samples * RETENTION_DAYS * 24 / HOURS_PER_MONTH * BYTES_PER_SAMPLE + total_series * BYTES_PER_SERIES
    # At most: each evaluation reads the largest metric's series (one per GPU, or per EFA device) over the lookback.
    gpu = settings.gpu_queue
    largest = gpu.max_count * max(gpu.gpus_per_instance, EFA_INTERFACES.get(gpu.instance_type, 0) if gpu.efa.enabled else 0)
    query_samples = rule_evaluations_per_month(rule_files) * largest * RULE_LOOKBACK_S / scrape_interval_s
    return MonitoringCost(
        series=series,
        scrape_interval_s=scrape_interval_s,
        samples_per_month=samples,
        ingestion_usd=ingestion_usd(samples),
        storage_usd=stored_bytes / 2**30 * STORAGE_USD_PER_GB_MONTH,
        rule_evaluation_usd=query_samples * QSP_USD_PER_SAMPLE,
        sns_usd=len(settings.alerts.email) * ALERT_EMAILS_PER_MONTH * SNS_EMAIL_USD,
        kms_usd=KMS_KEY_USD_MONTH,
    )


def _seconds(duration: str) -> float:
    """A Prometheus duration of one unit (30s, 1m, 2h)."""
    units = {"s": 1, "m": 60, "h": 3600}
    if len(duration) < 2 or duration[-1] not in units or not duration[:-1].isdigit():
        raise CostError(f"rule group interval {duration!r}: expected a number and one of s, m, h (e.g. 1m)")
    return int(duration[:-1]) * units[duration[-1]]
