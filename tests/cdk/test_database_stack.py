"""The Slurm accounting database: encrypted, private, reachable from the head node only, kept on destroy."""

import ipaddress

import aws_cdk as cdk
import pytest

from stacks.database_stack import DB_PORT, DB_USER, standby_subnet_cidr


def only(resources: dict) -> tuple[str, dict]:
    assert len(resources) == 1, list(resources)
    return next(iter(resources.items()))


def test_database_is_encrypted_private_and_snapshotted_on_destroy(each_env):
    template = each_env.templates["database"]
    _, db = only(template.find_resources("AWS::RDS::DBInstance"))
    props = db["Properties"]
    assert props["Engine"] == "mysql" and props["EngineVersion"].startswith("8.")
    assert props["StorageEncrypted"] is True
    assert props["PubliclyAccessible"] is False
    assert props["DeletionProtection"] is True
    assert db["DeletionPolicy"] == db["UpdateReplacePolicy"] == "Snapshot"
    assert props["BackupRetentionPeriod"] >= 7
    assert props["AvailabilityZone"] == each_env.settings.availability_zone
    assert props["MasterUsername"] == DB_USER
    # The password comes from Secrets Manager at deploy, never as text in the template.
    secret_id, _ = only(template.find_resources("AWS::SecretsManager::Secret"))
    assert props["MasterUserPassword"] == {"Fn::Join": ["", ["{{resolve:secretsmanager:", {"Ref": secret_id}, ":SecretString:::}}"]]}


def test_password_is_a_plain_generated_secret_kept_on_destroy(each_env):
    template = each_env.templates["database"]
    _, secret = only(template.find_resources("AWS::SecretsManager::Secret"))
    generate = secret["Properties"]["GenerateSecretString"]
    # ParallelCluster reads the whole secret value as the password: no JSON template around it.
    assert "SecretStringTemplate" not in generate and "GenerateStringKey" not in generate
    assert secret["DeletionPolicy"] == "Retain"


def test_only_the_head_node_reaches_the_database_on_3306(each_env):
    template = each_env.templates["database"]
    group_id, group = only(template.find_resources("AWS::EC2::SecurityGroup"))
    ingress = group["Properties"].get("SecurityGroupIngress", [])
    ingress += [r["Properties"] for r in template.find_resources("AWS::EC2::SecurityGroupIngress").values()]
    assert len(ingress) == 1
    rule = ingress[0]
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", DB_PORT, DB_PORT)
    head_node_sg = each_env.stacks["network"].head_node_sg
    assert cdk.Stack.of(head_node_sg).get_logical_id(head_node_sg.node.default_child) in str(rule["SourceSecurityGroupId"])
    assert "CidrIp" not in rule
    # No way out: CDK's placeholder egress rule that matches nothing.
    assert [r["CidrIp"] for r in group["Properties"]["SecurityGroupEgress"]] == ["255.255.255.255/32"]
    _, db = only(template.find_resources("AWS::RDS::DBInstance"))
    assert db["Properties"]["VPCSecurityGroups"] == [{"Fn::GetAtt": [group_id, "GroupId"]}]


def test_subnets_are_private_and_the_extra_one_overlaps_nothing(each_env):
    template = each_env.templates["database"]
    _, subnet = only(template.find_resources("AWS::EC2::Subnet"))
    assert subnet["Properties"]["MapPublicIpOnLaunch"] is False
    # Its own route table, with no route beyond the VPC (and the instance is not in it anyway).
    assert template.find_resources("AWS::EC2::RouteTable") and not template.find_resources("AWS::EC2::Route")
    network = each_env.stacks["network"]
    used = [ipaddress.ip_network(s.ipv4_cidr_block) for s in (network.head_node_subnet, network.compute_subnet)]
    extra = ipaddress.ip_network(standby_subnet_cidr(each_env.settings.network.vpc_cidr))
    assert extra.subnet_of(ipaddress.ip_network(each_env.settings.network.vpc_cidr))
    assert not any(extra.overlaps(u) for u in used)
    _, group = only(template.find_resources("AWS::RDS::DBSubnetGroup"))
    assert len(group["Properties"]["SubnetIds"]) == 2


def test_small_vpc_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="vpc_cidr 10.0.0.0/24 .* use a /22 or larger"):
        standby_subnet_cidr("10.0.0.0/24")


def test_cluster_config_points_slurm_at_the_database_and_enforces_limits(each_env):
    cluster, database_stack = each_env.stacks["cluster"], each_env.stacks["database"]
    slurm = cluster.resolve(cluster.config["Scheduling"]["SlurmSettings"])
    # Strong cross-stack references to the database stack's instance endpoint and secret.
    db_id = database_stack.get_logical_id(database_stack.instance.node.default_child)
    secret_id = database_stack.get_logical_id(database_stack.secret.node.default_child)
    stack = f"llm-{each_env.settings.name}-database"
    uri = slurm["Database"]["Uri"]["Fn::Join"][1]
    assert uri[0]["Fn::ImportValue"].startswith(f"{stack}:ExportsOutputFnGetAtt{db_id}EndpointAddress")
    assert uri[1] == f":{DB_PORT}"
    assert slurm["Database"]["UserName"] == DB_USER
    assert slurm["Database"]["PasswordSecretArn"]["Fn::ImportValue"].startswith(f"{stack}:ExportsOutputRef{secret_id}")
    assert {"AccountingStorageEnforce": "associations,limits,qos"} in slurm["CustomSlurmSettings"]
