"""The network stack: one-zone VPC, NAT, S3 endpoint, flow logs, security groups, placement group."""

import json

import aws_cdk as cdk
from aws_cdk.assertions import Match, Template

from cluster_config.settings import NetworkSettings
from stacks.network_stack import NetworkStack


def ingress_rules(template: Template) -> set[tuple]:
    """Every ingress rule, inline or separate, as (group, source, protocol, from port, to port).

    Groups are logical ids; the source is a logical id or a CIDR block.
    """
    def source(rule):
        if "SourceSecurityGroupId" in rule:
            return rule["SourceSecurityGroupId"]["Fn::GetAtt"][0]
        return rule.get("CidrIp") or rule.get("CidrIpv6")

    rules = {
        (r["GroupId"]["Fn::GetAtt"][0], source(r), r["IpProtocol"], r.get("FromPort"), r.get("ToPort"))
        for r in (res["Properties"] for res in template.find_resources("AWS::EC2::SecurityGroupIngress").values())
    }
    for group, res in template.find_resources("AWS::EC2::SecurityGroup").items():
        rules |= {
            (group, source(r), r["IpProtocol"], r.get("FromPort"), r.get("ToPort"))
            for r in res["Properties"].get("SecurityGroupIngress", [])
        }
    return rules


def logical_id(group) -> str:
    return cdk.Stack.of(group).get_logical_id(group.node.default_child)


LUSTRE = [(988, 988), (1018, 1023)]


def test_vpc_has_one_public_and_one_private_subnet_in_the_reservation_zone(each_env):
    template = each_env.templates["network"]
    settings = each_env.settings
    template.has_resource_properties("AWS::EC2::VPC", {"CidrBlock": settings.network.vpc_cidr})
    subnets = template.find_resources("AWS::EC2::Subnet")
    assert len(subnets) == 2
    assert {s["Properties"]["AvailabilityZone"] for s in subnets.values()} == {settings.availability_zone}
    public = [s for s in subnets.values() if s["Properties"].get("MapPublicIpOnLaunch")]
    assert len(public) == 1
    network = each_env.stacks["network"]
    assert network.compute_subnet.availability_zone == settings.availability_zone
    assert [s.node.path for s in network.vpc.public_subnets] == [network.head_node_subnet.node.path]
    assert [s.node.path for s in network.vpc.private_subnets] == [network.compute_subnet.node.path]


def test_synth_needs_no_context_lookup(each_env):
    # A lookup (e.g. of the region's zones) would make the CLI ask AWS, or fall back to dummy zones.
    manifest = (each_env.outdir / "manifest.json").read_text()
    assert '"missing"' not in manifest
    assert "dummy" not in json.dumps(each_env.template_json("network"))


def test_private_subnet_routes_through_one_nat_gateway_and_s3_through_the_endpoint(each_env):
    template = each_env.templates["network"]
    template.resource_count_is("AWS::EC2::NatGateway", 1)
    template.has_resource_properties(
        "AWS::EC2::Route", {"DestinationCidrBlock": "0.0.0.0/0", "NatGatewayId": Match.any_value()}
    )
    endpoints = each_env.template_json("network")["Resources"]
    (endpoint,) = [r["Properties"] for r in endpoints.values() if r["Type"] == "AWS::EC2::VPCEndpoint"]
    assert endpoint["VpcEndpointType"] == "Gateway"
    assert endpoint["ServiceName"]["Fn::Join"][1][-1] == ".s3"
    assert len(endpoint["RouteTableIds"]) == 2  # both subnets


def test_all_vpc_traffic_is_logged(each_env):
    each_env.templates["network"].has_resource_properties(
        "AWS::EC2::FlowLog",
        {"ResourceType": "VPC", "TrafficType": "ALL", "LogDestinationType": "cloud-watch-logs"},
    )


def test_only_the_ssh_allow_list_reaches_in_from_address_ranges(each_env):
    head = logical_id(each_env.stacks["network"].head_node_sg)
    rules = ingress_rules(each_env.templates["network"])
    assert rules, "the security groups must have rules"
    # dev and prod list none: no SSH at all, administrators use SSM.
    assert {rule for rule in rules if "/" in rule[1]} == {
        (head, cidr, "tcp", 22, 22) for cidr in each_env.settings.network.ssh_allowed_cidrs
    }


def test_compute_nodes_allow_all_traffic_within_their_group_and_with_the_head_node(each_env):
    network = each_env.stacks["network"]
    compute, head = logical_id(network.compute_sg), logical_id(network.head_node_sg)
    rules = ingress_rules(each_env.templates["network"])
    assert (compute, compute, "-1", None, None) in rules  # EFA
    assert (compute, head, "-1", None, None) in rules
    assert (head, compute, "-1", None, None) in rules
    # EFA also needs all outbound traffic to the group itself: all outbound is open.
    egress = each_env.template_json("network")["Resources"][compute]["Properties"]["SecurityGroupEgress"]
    assert [(r["CidrIp"], r["IpProtocol"]) for r in egress] == [("0.0.0.0/0", "-1")]


def test_lustre_ports_open_between_file_servers_and_cluster_groups(each_env):
    network = each_env.stacks["network"]
    fsx, head, compute = (logical_id(g) for g in (network.fsx_sg, network.head_node_sg, network.compute_sg))
    rules = ingress_rules(each_env.templates["network"])
    # Only the Lustre ports reach the file servers, from themselves and the cluster's groups.
    assert {rule for rule in rules if rule[0] == fsx} == {
        (fsx, source, "tcp", low, high) for source in (fsx, head, compute) for low, high in LUSTRE
    }
    for client in (head, compute):
        for low, high in LUSTRE:
            assert (client, fsx, "tcp", low, high) in rules


def test_placement_group_follows_the_settings(dev, prod):
    assert dev.settings.gpu_queue.placement_group and not prod.settings.gpu_queue.placement_group
    dev.templates["network"].has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    assert dev.stacks["network"].placement_group is not None
    prod.templates["network"].resource_count_is("AWS::EC2::PlacementGroup", 0)
    assert prod.stacks["network"].placement_group is None


def test_ssh_allow_list_opens_port_22_to_those_ranges_only(dev):
    network_settings = NetworkSettings(vpc_cidr="10.1.0.0/16", ssh_allowed_cidrs=["203.0.113.0/24"])
    settings = dev.settings.model_copy(update={"network": network_settings})
    network = NetworkStack(cdk.App(), "network", settings=settings, env=cdk.Environment(account=settings.account, region=settings.region))
    rules = ingress_rules(Template.from_stack(network))
    assert [rule for rule in rules if "/" in rule[1]] == [(logical_id(network.head_node_sg), "203.0.113.0/24", "tcp", 22, 22)]
