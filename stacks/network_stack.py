"""VPC, subnets, security groups and the placement group the cluster runs in."""

from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2, aws_logs as logs
from constructs import Construct

from cluster_config.settings import Settings

# Lustre clients talk to the file servers on 988 (LNet) and 1018-1023.
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))


class NetworkStack(cdk.Stack):
    """One-zone VPC: a public subnet for the head node and a private one for compute and FSx.

    Everything lives in the capacity reservation's zone: the reserved GPUs, the FSx file
    systems (single-AZ by design) and the placement group are zonal, and cross-zone traffic
    between nodes and storage would add latency and cost.
    """

    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings, env: cdk.Environment, **kwargs) -> None:
        self._zone = settings.availability_zone
        super().__init__(scope, construct_id, env=env, **kwargs)
        network = settings.network
        vpc_prefix = int(network.vpc_cidr.split("/")[1])

        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(network.vpc_cidr),
            max_azs=1,
            nat_gateways=1,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="HeadNode", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                # Half the VPC: with EFA every network card of a GPU node takes an address (32 on p5).
                ec2.SubnetConfiguration(
                    name="Compute", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=vpc_prefix + 1
                ),
            ],
            # Keeps S3 traffic (datasets, checkpoints, FSx imports) off the NAT gateway's per-GB charge.
            gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
        )
        flow_log_group = logs.LogGroup(
            self,
            "FlowLogGroup",
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )
        self.head_node_subnet: ec2.ISubnet = self.vpc.public_subnets[0]
        self.compute_subnet: ec2.ISubnet = self.vpc.private_subnets[0]

        self.head_node_sg = ec2.SecurityGroup(
            self, "HeadNodeSg", vpc=self.vpc, description="Slurm head node: SSM by default, SSH only from the allow-list"
        )
        self.compute_sg = ec2.SecurityGroup(
            self, "ComputeSg", vpc=self.vpc, description="Compute nodes: all traffic within the group (EFA) and with the head node"
        )
        # All outbound stays open: ParallelCluster checks that the file system's groups allow
        # port 988 both ways, and the file servers only answer their clients.
        self.fsx_sg = ec2.SecurityGroup(
            self, "FsxSg", vpc=self.vpc, description="FSx for Lustre: Lustre ports from the cluster security groups"
        )

        for cidr in network.ssh_allowed_cidrs:
            self.head_node_sg.add_ingress_rule(ec2.Peer.ipv4(cidr), ec2.Port.SSH, f"SSH from the allow-list {cidr}")
        # EFA needs every protocol to and from the group itself; all outbound is already open.
        self.compute_sg.add_ingress_rule(self.compute_sg, ec2.Port.all_traffic(), "EFA and MPI between compute nodes")
        self.compute_sg.add_ingress_rule(self.head_node_sg, ec2.Port.all_traffic(), "Slurm and NFS from the head node")
        self.head_node_sg.add_ingress_rule(self.compute_sg, ec2.Port.all_traffic(), "Slurm and NFS from compute nodes")
        for port in LUSTRE_PORTS:
            # to_string(): "988", "1018-1023"; str() of the jsii object holds its memory address, which
            # would change every rule's description, and so replace the rule, at every synth.
            ports = port.to_string()
            for peer, who in ((self.fsx_sg, "file servers"), (self.head_node_sg, "head node"), (self.compute_sg, "compute nodes")):
                self.fsx_sg.add_ingress_rule(peer, port, f"Lustre {ports} from the {who}")
            for client in (self.head_node_sg, self.compute_sg):
                client.add_ingress_rule(self.fsx_sg, port, f"Lustre {ports} from the file servers")

        self.placement_group: Optional[ec2.CfnPlacementGroup] = None
        if settings.gpu_queue.placement_group:
            self.placement_group = ec2.CfnPlacementGroup(self, "GpuPlacementGroup", strategy="cluster")
            cdk.CfnOutput(self, "PlacementGroupName", value=self.placement_group.ref)

        cdk.CfnOutput(self, "VpcId", value=self.vpc.vpc_id)
        cdk.CfnOutput(self, "HeadNodeSubnetId", value=self.head_node_subnet.subnet_id)
        cdk.CfnOutput(self, "ComputeSubnetId", value=self.compute_subnet.subnet_id)

    @property
    def availability_zones(self) -> list[str]:
        # The zone comes from the settings, so synth needs neither AWS credentials nor
        # cached context, and never falls back to CDK's placeholder zones.
        return [self._zone]
