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
