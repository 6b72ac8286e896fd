"""Every stand-in of the emulated deploy, each with its reason: the one place to read them.

The emulated account is moto (``moto_server`` on 127.0.0.1). Where moto cannot hold what AWS
would answer, this module fills the gap, and nowhere else does. Two kinds:

- ``MOTO_GAPS``: what the moto server process is taught (``patch_moto``, applied by
  ``cluster_config.emulated.moto_server`` before it serves).
- ``PCLUSTER_STUBS``: ParallelCluster client calls answered here instead of by moto
  (``patch_pcluster``, applied in the ParallelCluster venv by ``cluster_config.emulated.pcluster_child``).

Standard library only at import time: both interpreters (.venv and .venv-pcluster) import it.
"""

from __future__ import annotations

import hashlib
from typing import Any

# (what, reason). Printed by `python -m cluster_config validate` and listed in docs/cluster.md.
TEMPLATE_EDITS = {
    "Custom::* resources and their CDK-asset Lambda functions dropped from the network template":
        "moto runs Lambda-backed custom resources only under Docker, and the functions' code lives in the "
        "CDK bootstrap bucket; the network stack's one custom resource is CDK's default-security-group "
        "restriction, which the cluster config does not read",
    "BootstrapVersion parameter and CheckBootstrapVersion rule dropped":
        "they read the CDK bootstrap stack's SSM parameter, which exists only in a bootstrapped account",
}
MOTO_GAPS = {
    "FSx file systems created through the FSx API, not CloudFormation":
        "moto has FSx APIs but no AWS::FSx::FileSystem CloudFormation type; the storage stack's file "
        "systems are created with the settings' deployment type, capacity, throughput, subnet and security group",
    "FSx file system ids with 17 characters, Lifecycle AVAILABLE, a MountName and VpcId":
        "moto returns fs- plus 8 characters and no Lifecycle, MountName or VpcId; ParallelCluster's schema "
        "requires ^fs-[0-9a-z]{17}$ and its networking validator compares the VPC",
    "one network interface per FSx file system, in its subnet with its security groups":
        "moto creates no ENIs for FSx; ParallelCluster's ExistingFsxNetworkingValidator checks the Lustre "
        "ports through the file system's ENIs, so without them the real rule check could not run",
    "deleting a file system removes its network interfaces; deleting a stack removes its NAT gateway (and "
    "its interface), VPC endpoint, route tables and internet gateway":
        "moto leaves the ENIs and cannot delete those resource types with their stack, so the network stack's "
        "VPC could never be deleted; with them `cdk destroy` then `cdk deploy` (storage.keep_buckets) is "
        "emulated end to end (tests/deploy/test_come_back.py)",
    "EC2 DescribeCapacityBlockOfferings, PurchaseCapacityBlock and DescribeCapacityReservations":
        "moto implements none of them; the emulated account offers blocks of any instance type and count up to 64 "
        "in every zone of the region, starting 11:30 UTC on each of the first 7 days of the asked window, at "
        "EMULATED_BLOCK_PRICE_USD an instance-hour; a purchase makes a capacity-block reservation, 'scheduled' "
        "until its start. Requests are parsed and answers serialized by botocore's EC2 model (moto's own "
        "machinery), so a parameter the API lacks fails as it would against AWS (tests/deploy/test_day_zero.py)",
    "Service Quotas GetServiceQuota and ListServiceQuotas for ec2 and fsx":
        "moto knows only vpc's default quotas; the emulated account answers EMULATED_QUOTAS, or the JSON "
        "{\"service/code-or-name\": value} in MOTO_SERVICE_QUOTAS (a test's shortfall)",
}
# What the emulated account charges for a Capacity Block, per instance-hour (p5e.48xlarge's order of magnitude).
EMULATED_BLOCK_PRICE_USD = 34.608
# Quotas of the emulated account (MOTO_SERVICE_QUOTAS overrides): service -> (code, name, value, unit).
EMULATED_QUOTAS = {
    "ec2": [("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", 512.0, "None")],
    "fsx": [("L-EMULATED1", "Lustre Persistent_2 storage capacity", 102400.0, "None"),
            ("L-EMULATED2", "Lustre Persistent_1 storage capacity", 102400.0, "None")],
}
PCLUSTER_STUBS = {
    "Ec2Client.get_official_image_id -> an x86_64 Amazon Linux image registered in moto":
        "the official ParallelCluster AMI is owned by 'amazon' and looked up by name; moto holds no "
        "ParallelCluster AMIs, so the lookup is answered with an image that exists in the emulated account",
    "Ec2Client.describe_capacity_reservations -> built from the settings' capacity_reservations":
        "a reservation (ODCR or Capacity Block) cannot be created in moto; each one's id, instance type, zone, "
        "count and reservation type come from the settings, which is what the deploy would find",
    "Ec2Client.run_instances(DryRun=True) -> DryRunOperation (would succeed)":
        "the launch-template validators dry-run RunInstances; moto rejects ParallelCluster's block device "
        "mappings ('must contain the parameter ebs') and cannot judge capacity or quotas anyway",
    "Ec2Client.describe_placement_group -> the network template's placement group":
        "moto implements no placement groups (CreatePlacementGroup is 'not implemented', the template's "
        "AWS::EC2::PlacementGroup deploys without an id); the group is named as CloudFormation would name it",
    "the running cluster of the update checks: compute nodes running, no login nodes":
        "ConfigPatch asks the cluster whether it runs nodes; a user changing settings mid-training has "
        "running GPU nodes, the case where the most update policies refuse a change",
}


def fsx_id(moto_id: str) -> str:
    """A ParallelCluster-shaped id (fs- + 17 lowercase hex) derived from moto's short one."""
    return "fs-" + hashlib.sha256(moto_id.encode()).hexdigest()[:17]


def patch_moto() -> None:
    """Teach the moto server what MOTO_GAPS lists (call before it serves)."""
    from moto.ec2.models import ec2_backends
    from moto.fsx import models as fsx_models

    original_init = fsx_models.FileSystem.__init__
    original_to_dict = fsx_models.FileSystem.to_dict

    def init(self, account_id: str, region_name: str, *args: Any, **kwargs: Any) -> None:
        original_init(self, account_id, region_name, *args, **kwargs)
        self.file_system_id = fsx_id(self.file_system_id)
        self.dns_name = f"{self.file_system_id}.fsx.{region_name}.amazonaws.com"
        self.resource_arn = f"arn:aws:fsx:{region_name}:{account_id}:file-system/{self.file_system_id}"
        ec2 = ec2_backends[account_id][region_name]
        subnet = ec2.get_subnet(self.subnet_ids[0])
        self.vpc_id = subnet.vpc_id
        eni = ec2.create_network_interface(
            subnet, private_ip_address=None, group_ids=list(self.security_group_ids or []),
            description=f"ENI for FSx file system {self.file_system_id}",
        )
        self.network_interface_ids = [eni.id]

    def to_dict(self) -> dict[str, Any]:
        info = original_to_dict(self)
        lustre = dict(info.get("LustreConfiguration") or {})
        lustre.setdefault("MountName", self.file_system_id[3:11])
        return {**info, "LustreConfiguration": lustre, "Lifecycle": "AVAILABLE", "VpcId": self.vpc_id,
                "NetworkInterfaceIds": self.network_interface_ids}

    fsx_models.FileSystem.__init__ = init
    fsx_models.FileSystem.to_dict = to_dict

    original_delete = fsx_models.FSxBackend.delete_file_system

    def delete_file_system(self, file_system_id: str, *args: Any, **kwargs: Any) -> Any:
        file_system = self.file_systems.get(file_system_id)
        result = original_delete(self, file_system_id, *args, **kwargs)
        ec2 = ec2_backends[self.account_id][self.region_name]
        for eni_id in getattr(file_system, "network_interface_ids", []):
            ec2.enis.pop(eni_id, None)
        return result

    fsx_models.FSxBackend.delete_file_system = delete_file_system
    _teach_capacity_blocks()
    _teach_service_quotas()
    from moto.ec2.models.internet_gateways import InternetGateway
    from moto.ec2.models.nat_gateways import NatGateway
    from moto.ec2.models.route_tables import RouteTable
    from moto.ec2.models.vpcs import VPCEndPoint

    def delete_nat_gateway(self: Any, account_id: str, region_name: str) -> None:
        ec2 = ec2_backends[account_id][region_name]
        ec2.delete_nat_gateway(self.id)
        ec2.enis.pop(self._eni.id, None)

    def delete_vpc_endpoint(self: Any, account_id: str, region_name: str) -> None:
        ec2 = ec2_backends[account_id][region_name]
        self.route_table_ids = [r for r in self.route_table_ids or [] if r in ec2.route_tables]  # in any order
        ec2.delete_vpc_endpoints([self.id])
        ec2.vpc_end_points.pop(self.id, None)

    def delete_route_table(self: Any, account_id: str, region_name: str) -> None:
        ec2_backends[account_id][region_name].delete_route_table(self.id)

    def delete_internet_gateway(self: Any, account_id: str, region_name: str) -> None:
        self.vpc = None  # its attachment goes with the stack too
        ec2_backends[account_id][region_name].delete_internet_gateway(self.id)

    NatGateway.delete = delete_nat_gateway
    VPCEndPoint.delete = delete_vpc_endpoint
    RouteTable.delete = delete_route_table
    InternetGateway.delete = delete_internet_gateway


def _teach_capacity_blocks() -> None:
    """MOTO_GAPS: Capacity Block offerings, their purchase, and the reservations it makes."""
    from datetime import datetime, timedelta, timezone

    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses import EC2Response

    def state(backend: Any) -> dict[str, dict[str, Any]]:
        if not hasattr(backend, "emulated_capacity_blocks"):
            backend.emulated_capacity_blocks = {"offerings": {}, "reservations": {}}
        return backend.emulated_capacity_blocks

    def utc(value: Any) -> datetime:
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))

    def describe_capacity_block_offerings(self: Any) -> ActionResult:
        hours = int(self._get_param("CapacityDurationHours"))
        count = int(self._get_param("InstanceCount") or 1)
        instance_type = self._get_param("InstanceType")
        if count > 64:
            raise EC2ClientError("InvalidParameterValue", f"InstanceCount {count}: a Capacity Block holds at most 64 instances")
        now = datetime.now(timezone.utc)
        earliest = utc(self._get_param("StartDateRange") or now)
        latest_end = utc(self._get_param("EndDateRange") or earliest + timedelta(days=56) + timedelta(hours=hours))
        first = earliest.replace(hour=11, minute=30, second=0, microsecond=0)
        first += timedelta(days=1) if first < earliest else timedelta()
        offerings = []
        for zone in sorted(z.name for z in self.ec2_backend.describe_availability_zones()):
            for day in range(7):
                start = first + timedelta(days=day)
                end = start + timedelta(hours=hours)
                if end > latest_end:
                    break
                key = f"{instance_type}/{count}/{zone}/{start.isoformat()}/{hours}"
                offering = {
                    "CapacityBlockOfferingId": "cb-" + hashlib.sha256(key.encode()).hexdigest()[:17],
                    "InstanceType": instance_type, "AvailabilityZone": zone, "InstanceCount": count,
                    "StartDate": start, "EndDate": end, "CapacityBlockDurationHours": hours,
                    "UpfrontFee": f"{EMULATED_BLOCK_PRICE_USD * count * hours:.2f}", "CurrencyCode": "USD",
                    "Tenancy": "default",
                }
                state(self.ec2_backend)["offerings"][offering["CapacityBlockOfferingId"]] = offering
                offerings.append(offering)
        return ActionResult({"CapacityBlockOfferings": offerings})

    def purchase_capacity_block(self: Any) -> ActionResult:
        blocks = state(self.ec2_backend)
        offering_id = self._get_param("CapacityBlockOfferingId")
        offering = blocks["offerings"].get(offering_id)
        if offering is None:
            raise EC2ClientError("InvalidCapacityBlockOfferingId.NotFound",
                                 f"The Capacity Block offering ID '{offering_id}' does not exist")
        reservation_id = "cr-" + hashlib.sha256(f"{offering_id}/{len(blocks['reservations'])}".encode()).hexdigest()[:17]
        now = datetime.now(timezone.utc)
        reservation = {
            "CapacityReservationId": reservation_id, "OwnerId": self.current_account,
            "CapacityReservationArn": f"arn:aws:ec2:{self.region}:{self.current_account}:capacity-reservation/{reservation_id}",
            "InstanceType": offering["InstanceType"], "InstancePlatform": self._get_param("InstancePlatform"),
            "AvailabilityZone": offering["AvailabilityZone"], "Tenancy": "default",
            "TotalInstanceCount": offering["InstanceCount"], "AvailableInstanceCount": offering["InstanceCount"],
            "State": "scheduled" if offering["StartDate"] > now else "active",
            "StartDate": offering["StartDate"], "EndDate": offering["EndDate"], "EndDateType": "limited",
            "InstanceMatchCriteria": "targeted", "CreateDate": now, "ReservationType": "capacity-block",
        }
        blocks["reservations"][reservation_id] = reservation
        return ActionResult({"CapacityReservation": reservation})

    def describe_capacity_reservations(self: Any) -> ActionResult:
        known = state(self.ec2_backend)["reservations"]
        ids = self._get_param("CapacityReservationIds") or list(known)
        for reservation_id in ids:
            if reservation_id not in known:
                raise EC2ClientError("InvalidCapacityReservationId.NotFound",
                                     f"The capacity reservation ID '{reservation_id}' does not exist")
        return ActionResult({"CapacityReservations": [known[i] for i in ids]})

    EC2Response.describe_capacity_block_offerings = describe_capacity_block_offerings
    EC2Response.purchase_capacity_block = purchase_capacity_block
    EC2Response.describe_capacity_reservations = describe_capacity_reservations


def _teach_service_quotas() -> None:
    """MOTO_GAPS: the ec2 and fsx quotas the day-zero checks read (MOTO_SERVICE_QUOTAS overrides values)."""
    import json
    import os

    from moto.servicequotas.exceptions import NoSuchResource
    from moto.servicequotas.responses import ServiceQuotasResponse

    overrides = json.loads(os.environ.get("MOTO_SERVICE_QUOTAS") or "{}")

    def quotas(service: str) -> list[dict[str, Any]]:
        return [{"ServiceCode": service, "QuotaCode": code, "QuotaName": name, "Unit": unit, "Adjustable": True,
                 "GlobalQuota": False,
                 "Value": float(overrides.get(f"{service}/{code}", overrides.get(f"{service}/{name}", value)))}
                for code, name, value, unit in EMULATED_QUOTAS.get(service, [])]

    original_get = ServiceQuotasResponse.get_service_quota

    def get_service_quota(self: Any) -> str:
        params = json.loads(self.body)
        if params.get("ServiceCode") not in EMULATED_QUOTAS:
            return original_get(self)
        found = [q for q in quotas(params["ServiceCode"]) if q["QuotaCode"] == params.get("QuotaCode")]
        if not found:
            raise NoSuchResource
        return json.dumps({"Quota": found[0]})

    def list_service_quotas(self: Any) -> str:
        return json.dumps({"Quotas": quotas(json.loads(self.body).get("ServiceCode"))})

    ServiceQuotasResponse.get_service_quota = get_service_quota
    ServiceQuotasResponse.list_service_quotas = list_service_quotas


def patch_pcluster(reservations: list[dict[str, Any]], placement_groups: list[dict[str, Any]], image_id: str,
                   calls: list[str]) -> None:
    """Answer the PCLUSTER_STUBS calls; ``calls`` records each stubbed call made."""
    from pcluster.aws.aws_resources import CapacityReservationInfo
    from pcluster.aws.common import AWSClientError
    from pcluster.aws.ec2 import Ec2Client

    def get_official_image_id(self, os, architecture, filters=None):
        calls.append(f"get_official_image_id({os}, {architecture})")
        return image_id

    def describe_capacity_reservations(self, capacity_reservation_ids):
        # ParallelCluster collects the ids in a set: sorted, the record is the same in every run.
        calls.append(f"describe_capacity_reservations({', '.join(sorted(capacity_reservation_ids))})")
        known = {r["CapacityReservationId"]: r for r in reservations}
        missing = [i for i in capacity_reservation_ids if i not in known]
        if missing:
            raise AWSClientError("describe_capacity_reservations", f"The capacity reservations {missing} do not exist")
        return [CapacityReservationInfo(known[i]) for i in capacity_reservation_ids]

    def describe_placement_group(self, group_name):
        calls.append(f"describe_placement_group({group_name})")
        found = [group for group in placement_groups if group["GroupName"] == group_name]
        if not found:
            raise AWSClientError("describe_placement_groups", f"The Placement Group '{group_name}' is unknown.")
        return {"PlacementGroups": found}

    original_run_instances = Ec2Client.run_instances

    def run_instances(self, **kwargs):
        if not kwargs.get("DryRun"):
            return original_run_instances(self, **kwargs)
        # EC2 answers a dry run that would succeed with DryRunOperation, which ParallelCluster swallows.
        calls.append(f"run_instances(DryRun, {kwargs.get('InstanceType')})")
        return None

    Ec2Client.get_official_image_id = get_official_image_id
    Ec2Client.describe_capacity_reservations = describe_capacity_reservations
    Ec2Client.run_instances = run_instances
    Ec2Client.describe_placement_group = describe_placement_group


class RunningCluster:
    """The cluster an update is checked against (PCLUSTER_STUBS): compute nodes running, no login nodes."""

    class _Instance:
        state = "running"

    def __init__(self, name: str) -> None:
        self.name = name
        self.stack_name = name
        self.head_node_instance = self._Instance()

    def has_running_capacity(self) -> bool:
        return True

    def has_running_login_nodes(self, pool_name=None) -> bool:
        return False


def amazon_linux_image(ec2) -> str:
    """An x86_64 Amazon Linux image that exists in the emulated account (answers get_official_image_id)."""
    images = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])["Images"]
    preferred = [i for i in images if "al2023" in i.get("Name", "")] or images
    return sorted(preferred, key=lambda i: i["ImageId"])[0]["ImageId"]


def reservation_description(settings: dict[str, Any]) -> list[dict[str, Any]]:
    """What EC2 DescribeCapacityReservations says about the settings' reservations (plain settings dict)."""
    queue = settings["gpu_queue"]
    return [{
        "CapacityReservationId": reservation["id"],
        # ParallelCluster's compute role names it (its AllowRunningReservedCapacity statement).
        "CapacityReservationArn": f"arn:aws:ec2:{settings['region']}:{settings['account']}:capacity-reservation/{reservation['id']}",
        "InstanceType": queue["instance_type"],
        "InstancePlatform": "Linux/UNIX",
        "AvailabilityZone": settings["availability_zone"],
        "TotalInstanceCount": reservation["instance_count"],
        "AvailableInstanceCount": reservation["instance_count"],
        "State": "active" if reservation.get("kind", "odcr") == "odcr" else "scheduled",
        "InstanceMatchCriteria": "targeted",
        "ReservationType": "capacity-block" if reservation.get("kind") == "capacity_block" else "default",
    } for reservation in queue.get("capacity_reservations") or []]
