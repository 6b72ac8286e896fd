"""The Slurm accounting database: what ParallelCluster's ``Scheduling.SlurmSettings.Database`` points at.

slurmdbd on the head node stores jobs, accounts and QOS (sacct, sreport, the per-model shares) in a
MySQL-compatible server of its own. RDS for MySQL 8.4 (LTS), one small instance: slurmdbd writes a record per
job and per association change, far below what the smallest classes handle.

- encrypted at rest, in the compute (private) subnet, no public address;
- reachable only from the head node's security group, on 3306;
- the password is generated into Secrets Manager as a plain string (what ParallelCluster's
  ``PasswordSecretArn`` reads), and reaches RDS as a dynamic reference, never in the template;
- on destroy a final snapshot is taken (RemovalPolicy.SNAPSHOT), and deletion protection is on: the
  accounting history outlives the cluster, and deleting it takes two deliberate steps.
"""

from __future__ import annotations

import ipaddress

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2, aws_rds as rds, aws_secretsmanager as secretsmanager
from constructs import Construct

from cluster_config.settings import Settings
from stacks.network_stack import NetworkStack

DB_PORT = 3306
DB_USER = "slurm"  # slurmdbd's StorageUser
INSTANCE_TYPE = "t4g.small"  # 2 vCPU, 2 GiB: slurmdbd of one 80-node cluster
STORAGE_GIB = 20
BACKUP_DAYS = 7


class DatabaseStack(cdk.Stack):
    def __init__(
        self, scope: Construct, construct_id: str, *, settings: Settings, network: NetworkStack, env: cdk.Environment, **kwargs
    ) -> None:
        super().__init__(scope, construct_id, env=env, **kwargs)
        vpc = network.vpc

        self.security_group = ec2.SecurityGroup(
            self, "DatabaseSg", vpc=vpc, allow_all_outbound=False,
            description="Slurm accounting database: MySQL from the head node (slurmdbd) only",
        )
        self.security_group.add_ingress_rule(network.head_node_sg, ec2.Port.tcp(DB_PORT), "slurmdbd on the head node")

        # RDS wants a subnet group in two zones even for a one-zone instance. The second subnet only
        # completes the group: the instance stays in the cluster's zone (below). Its zone is the
        # region's first or second, whichever is not the cluster's, chosen at deploy (no lookup).
        zones = cdk.Fn.get_azs()
        first_is_ours = cdk.CfnCondition(
            self, "FirstZoneIsClusterZone", expression=cdk.Fn.condition_equals(cdk.Fn.select(0, zones), settings.availability_zone)
        )
        other_zone = cdk.Fn.condition_if(first_is_ours.logical_id, cdk.Fn.select(1, zones), cdk.Fn.select(0, zones)).to_string()
        standby_subnet = ec2.Subnet(
            self, "StandbySubnet", vpc_id=vpc.vpc_id, availability_zone=other_zone,
            cidr_block=standby_subnet_cidr(settings.network.vpc_cidr), map_public_ip_on_launch=False,
        )
        subnet_group = rds.SubnetGroup(
            self, "SubnetGroup", vpc=vpc, description="Slurm accounting database",
            vpc_subnets=ec2.SubnetSelection(subnets=[network.compute_subnet, standby_subnet]),
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )

        # A plain-string secret: ParallelCluster gives slurmdbd the secret's value as the password.
        self.secret = secretsmanager.Secret(
            self, "Password", description=f"Password of the Slurm accounting database user '{DB_USER}' ({settings.cluster_name})",
            generate_secret_string=secretsmanager.SecretStringGenerator(
                password_length=32, exclude_punctuation=True,  # safe in slurmdbd.conf and MySQL URIs
            ),
            removal_policy=cdk.RemovalPolicy.RETAIN,  # the snapshot is useless without it
        )
        self.instance = rds.DatabaseInstance(
            self, "Database",
            engine=rds.DatabaseInstanceEngine.mysql(version=rds.MysqlEngineVersion.VER_8_4_7),
            instance_type=ec2.InstanceType(INSTANCE_TYPE),
            vpc=vpc,
            subnet_group=subnet_group,
            availability_zone=settings.availability_zone,
            security_groups=[self.security_group],
            port=DB_PORT,
            credentials=rds.Credentials.from_password(DB_USER, self.secret.secret_value),
            storage_encrypted=True,
            allocated_storage=STORAGE_GIB,
            storage_type=rds.StorageType.GP3,
            multi_az=False,
            publicly_accessible=False,
            backup_retention=cdk.Duration.days(BACKUP_DAYS),
            deletion_protection=True,
            removal_policy=cdk.RemovalPolicy.SNAPSHOT,
            cloudwatch_logs_exports=["error", "slowquery"],
            auto_minor_version_upgrade=True,
        )
        self.instance_user = DB_USER
        self.uri = f"{self.instance.db_instance_endpoint_address}:{DB_PORT}"
        cdk.CfnOutput(self, "DatabaseUri", value=self.uri, description="Slurm accounting database (host:port)")
        cdk.CfnOutput(self, "DatabaseSecretArn", value=self.secret.secret_arn)


def standby_subnet_cidr(vpc_cidr: str) -> str:
    """A /28 right after the head node's /24 (the VPC's first); the compute subnet is the VPC's upper half."""
    vpc = ipaddress.ip_network(vpc_cidr)
    if vpc.prefixlen > 22:
        raise ValueError(f"network.vpc_cidr {vpc_cidr} is too small for the database subnet; use a /22 or larger")
    return str(next(ipaddress.ip_network(f"{vpc.network_address + 256}/28").subnets(new_prefix=28)))
