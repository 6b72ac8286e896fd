"""Before ``cdk deploy``: settings that synthesize but would deploy the shipped examples, or into another account.

    python -m cluster_config deploy-check --env prod     # make deploy ENV=prod runs it, then cdk deploy

``cdk synth`` runs anywhere, without credentials, so the shipped ``prod.yaml`` carries example values that
pass every check: an account id, Capacity Block ids and an alert address nobody reads. Deployed, they fail
late (CloudFormation refuses the account; ``pcluster create-cluster`` cannot find the reservations, after
the stacks are up) or not at all (alerts go to example.com). Two kinds of finding, each a ``problem:`` line
naming the field and the fix, exit 1:

- the credentials' account (STS GetCallerIdentity) is not ``account:``;
- a value is still the shipped example: an account of one repeated digit, the example Capacity Block ids,
  an alert address at a domain reserved for examples (RFC 2606, RFC 6761);
- day zero (``day_zero``), once the blocks are bought: Service Quotas (on-demand standard vCPUs for the head
  node and the CPU queue at its max_count; FSx for Lustre storage of the deployment type), each reservation
  found by EC2 in ``availability_zone`` (where the cluster's subnets are made) with the settings' type, count
  and end, not ended or failed, and ``goodput.training_start`` not before the blocks start; a block end or
  training start still the shipped example's is named as such. Dates in the past are refused by the
  settings themselves (cluster_config/settings.py), so deploy-check stops there with that message.

None: exit 0. A quota that Service Quotas does not name (FSx's names differ by deployment type): a
``note:`` line with where to look, not a problem. AWS not reachable or no credentials: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone

import boto3
import botocore.exceptions

from cluster_config.capacity import TRAINING_START_AFTER
from cluster_config.settings import EXAMPLE_RESERVATIONS, Settings, is_example_account

# prod.yaml's illustrations of a block end and of the training start (tests/deploy/test_day_zero.py keeps them
# equal to the shipped file's): left beside real block ids, deploy-check names them as the examples they are.
EXAMPLE_BLOCK_END = datetime(2027, 1, 18, 11, 30, tzinfo=timezone.utc)
EXAMPLE_TRAINING_START = datetime(2027, 1, 4, 13, 30, tzinfo=timezone.utc)
# Service Quotas' code of "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", in vCPUs.
STANDARD_VCPU_QUOTA = "L-1216C47A"
STANDARD_FAMILIES = frozenset("acdhimrtz")
ENDED = frozenset({"expired", "cancelled", "failed", "payment-failed"})
EXAMPLE_DOMAINS = ("example.com", "example.org", "example.net", "example", "test", "invalid")


def example_values(settings: Settings) -> list[str]:
    """The shipped examples still in ``settings``, each with the key that holds it and its fix."""
    source = f"cluster_config/{settings.name}.yaml"
    found = []
    if is_example_account(settings.account):
        found.append(f"{source} account: {settings.account} is an example; set it to the AWS account you deploy into")
    for reservation in settings.gpu_queue.capacity_reservations:
        if reservation.id in EXAMPLE_RESERVATIONS:
            found.append(f"{source} gpu_queue.capacity_reservations: {reservation.id} is an example; set the id of "
                         "your Capacity Block (aws ec2 describe-capacity-reservations, its end beside it)")
    for address in settings.alerts.email:
        domain = address.rsplit("@", 1)[-1].lower()
        if any(domain == reserved or domain.endswith("." + reserved) for reserved in EXAMPLE_DOMAINS):
            found.append(f"{source} alerts.email: {address} is an example address, reserved for documentation; "
                         "set the addresses of the people on call (or [] for none)")
    return found


def problems(settings: Settings, endpoint_url: str | None = None) -> list[str]:
    """What stands in the way of ``cdk deploy -c env=<settings.name> --all``, each with its fix."""
    sts = boto3.session.Session(region_name=settings.region).client("sts", endpoint_url=endpoint_url)
    caller = sts.get_caller_identity()["Account"]
    found = []
    if caller != settings.account:
        found.append(f"cluster_config/{settings.name}.yaml account: is {settings.account}, but these credentials are "
                     f"account {caller}'s: set account: to the account you deploy into, or use its credentials")
    return found + example_values(settings)


def _standard_vcpus(settings: Settings, ec2) -> tuple[int, str]:
    """vCPUs the head node and the CPU queue at max_count take of the standard on-demand quota, and how."""
    parts = [("head_node.instance_type", settings.head_node.instance_type, 1),
             ("cpu_queue.max_count", settings.cpu_queue.instance_type, settings.cpu_queue.max_count)]
    types = sorted({kind for _, kind, _ in parts})
    vcpus = {t["InstanceType"]: t["VCpuInfo"]["DefaultVCpus"]
             for t in ec2.describe_instance_types(InstanceTypes=types)["InstanceTypes"]}
    counted = [(key, kind, count) for key, kind, count in parts if kind[0] in STANDARD_FAMILIES]
    need = sum(vcpus[kind] * count for _, kind, count in counted)
    how = " + ".join(f"{key} {count} x {kind} ({vcpus[kind]} vCPUs)" if count != 1 else f"{key} {kind} ({vcpus[kind]} vCPUs)"
                     for key, kind, count in counted)
    return need, how


def _quota_by_name(quotas, service: str, *words: str) -> dict | None:
    for page in quotas.get_paginator("list_service_quotas").paginate(ServiceCode=service):
        for quota in page["Quotas"]:
            name = quota["QuotaName"].lower().replace(" ", "_")
            if all(word in name for word in words):
                return quota
    return None


def day_zero(settings: Settings, endpoint_url: str | None = None,
             now: datetime | None = None) -> tuple[list[str], list[str]]:
    """(problems, notes) of the account on day zero: quotas, the reservations, their zone and dates."""
    source = f"cluster_config/{settings.name}.yaml"
    session = boto3.session.Session(region_name=settings.region)
    ec2 = session.client("ec2", endpoint_url=endpoint_url)
    quotas = session.client("service-quotas", endpoint_url=endpoint_url)
    found, notes = [], []

    need, how = _standard_vcpus(settings, ec2)
    quota = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=STANDARD_VCPU_QUOTA)["Quota"]
    if need and quota["Value"] < need:
        found.append(
            f"service quota ec2 {STANDARD_VCPU_QUOTA} ({quota['QuotaName']}) is {quota['Value']:.0f} vCPUs in "
            f"{settings.region}, but {source} needs {need}: {how}; ask for it (aws service-quotas "
            f"request-service-quota-increase --region {settings.region} --service-code ec2 --quota-code "
            f"{STANDARD_VCPU_QUOTA} --desired-value {need}) or lower cpu_queue.max_count")
    storage = settings.storage
    gib = sum(fs.storage_capacity_gib for fs in storage.file_systems().values())
    fsx_quota = _quota_by_name(quotas, "fsx", "lustre", storage.deployment_type.lower(), "storage_capacity")
    if fsx_quota is None:
        notes.append(f"no FSx quota named for Lustre {storage.deployment_type} storage capacity in Service Quotas; check "
                     f"{gib:,} GiB against the FSx quotas in the console (Service Quotas > Amazon FSx) before the deploy")
    elif fsx_quota["Value"] < gib:
        found.append(
            f"service quota fsx {fsx_quota['QuotaCode']} ({fsx_quota['QuotaName']}) is {fsx_quota['Value']:,.0f} GiB in "
            f"{settings.region}, but {source} storage: asks {gib:,} GiB in all; ask for it (aws service-quotas "
            f"request-service-quota-increase --region {settings.region} --service-code fsx --quota-code "
            f"{fsx_quota['QuotaCode']} --desired-value {gib}) or lower storage_capacity_gib")

    reservations = [r for r in settings.gpu_queue.capacity_reservations if r.id not in EXAMPLE_RESERVATIONS]
    starts = []
    for index, reservation in enumerate(settings.gpu_queue.capacity_reservations):
        if reservation not in reservations:
            continue
        key = f"{source} gpu_queue.capacity_reservations.{index}"
        try:
            described = ec2.describe_capacity_reservations(CapacityReservationIds=[reservation.id])["CapacityReservations"]
        except botocore.exceptions.ClientError as exc:
            if "NotFound" not in exc.response["Error"]["Code"]:
                raise
            described = []
        if not described:
            found.append(f"{key}: {reservation.id} is not a reservation of this account in {settings.region}; set the id "
                         f"python -m cluster_config capacity --env {settings.name} printed when it bought the block")
            continue
        block = described[0]
        if block["AvailabilityZone"] != settings.availability_zone:
            found.append(f"{key}: {reservation.id} is in {block['AvailabilityZone']}, but availability_zone is "
                         f"{settings.availability_zone}, where the cluster's subnets are made, and a block's nodes start "
                         f"only in its own zone; set availability_zone: {block['AvailabilityZone']}")
        if block["InstanceType"] != settings.gpu_queue.instance_type or block["TotalInstanceCount"] != reservation.instance_count:
            found.append(f"{key}: {reservation.id} holds {block['TotalInstanceCount']} x {block['InstanceType']}, the "
                         f"settings say {reservation.instance_count} x {settings.gpu_queue.instance_type}; set "
                         f"instance_count: {block['TotalInstanceCount']} (and gpu_queue.instance_type) as bought")
        if block["State"] in ENDED:
            found.append(f"{key}: {reservation.id} is {block['State']}; no node starts in it: buy another block "
                         f"(python -m cluster_config capacity --env {settings.name}) and set its id")
        end = block["EndDate"].astimezone(timezone.utc)
        if reservation.kind == "capacity_block" and reservation.end != end:
            shipped = " (the shipped example's date)" if reservation.end == EXAMPLE_BLOCK_END else ""
            found.append(f"{key}.end: {reservation.end.isoformat() if reservation.end else 'missing'}{shipped}, but "
                         f"{reservation.id} ends {end:%Y-%m-%dT%H:%M:%SZ}; set end: {end:%Y-%m-%dT%H:%M:%SZ}")
        starts.append(block["StartDate"].astimezone(timezone.utc))
    start = settings.goodput.training_start
    if starts and start is not None and start < max(starts):
        shipped = " (the shipped example's date)" if start == EXAMPLE_TRAINING_START else ""
        found.append(f"{source} goodput.training_start: {start.isoformat()}{shipped} is before the Capacity Blocks start "
                     f"({max(starts):%Y-%m-%dT%H:%M:%SZ}), and the plan counts the models' days from it; set it to the "
                     f"blocks' start + the GPU nodes' boot and the acceptance run, e.g. "
                     f"{(max(starts) + TRAINING_START_AFTER):%Y-%m-%dT%H:%M:%SZ}")
    elif starts and start is not None and start == EXAMPLE_TRAINING_START:
        found.append(f"{source} goodput.training_start: {start.isoformat()} is the shipped example's date; set the blocks' "
                     f"start + the boot and the acceptance run, e.g. {(max(starts) + TRAINING_START_AFTER):%Y-%m-%dT%H:%M:%SZ}")
    return found, notes


def main(settings: Settings, endpoint_url: str | None = None) -> int:
    try:
        found = problems(settings, endpoint_url)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        print(f"error: cannot tell which account these credentials are for ({type(exc).__name__}: {exc}) — run it "
              "with the credentials you deploy with", file=sys.stderr)
        return 2
    try:
        day_zero_found, notes = day_zero(settings, endpoint_url)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        print(f"error: cannot read the quotas or the Capacity Blocks ({type(exc).__name__}: {exc}) — these credentials "
              "need ec2:DescribeInstanceTypes, ec2:DescribeCapacityReservations and servicequotas:GetServiceQuota, "
              "servicequotas:ListServiceQuotas", file=sys.stderr)
        return 2
    found += day_zero_found
    for note in notes:
        print(f"note: {note}")
    for problem in found:
        print(f"problem: {problem}")
    if not found:
        print(f"deploy-check: account {settings.account}, no example values left, quotas and Capacity Blocks ready: "
              f"cdk deploy -c env={settings.name} --all may go ahead")
    return 1 if found else 0
