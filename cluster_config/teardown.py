"""Before ``cdk destroy``: what would make it fail halfway or delete what is in use.

    python -m cluster_config teardown-check --env prod     # make destroy ENV=prod runs it, then cdk destroy

Two things, each found in the account (the environment's region, the caller's credentials):

- the ParallelCluster cluster: its CloudFormation stack (named ``cluster_name``) still exists. The
  cluster's nodes mount the file systems the storage stack would delete, and its own stack uses the
  subnets and security groups of the network stack, whose deletion then fails: delete the cluster
  first and wait until it is gone.
- the accounting database still has deletion protection: CloudFormation stops at it, with the network
  stack half deleted. Turning it off is a decision, so it is left to the person (the instance is then
  deleted with a final snapshot: stacks/database_stack.py).

Each finding is a ``problem:`` line with the command that clears it, exit 1; none, exit 0. AWS not
reachable or no credentials: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import sys

import boto3
import botocore.exceptions

from cluster_config.settings import Settings

GONE = {"DELETE_COMPLETE"}


def _stack(cloudformation, name: str) -> dict | None:
    try:
        stacks = cloudformation.describe_stacks(StackName=name)["Stacks"]
    except botocore.exceptions.ClientError as exc:
        if "does not exist" in str(exc):
            return None
        raise
    return next((s for s in stacks if s["StackStatus"] not in GONE), None)


def problems(settings: Settings, endpoint_url: str | None = None) -> list[str]:
    """What stands in the way of ``cdk destroy -c env=<settings.name> --all``, each with its fix."""
    session = boto3.session.Session(region_name=settings.region)
    cloudformation = session.client("cloudformation", endpoint_url=endpoint_url)
    found = []
    cluster = _stack(cloudformation, settings.cluster_name)
    if cluster:
        found.append(
            f"the ParallelCluster cluster {settings.cluster_name} still exists (its stack is {cluster['StackStatus']}): "
            f"its nodes mount the file systems cdk destroy deletes, and its stack holds the subnets and security "
            f"groups; run `pcluster delete-cluster --region {settings.region} --cluster-name {settings.cluster_name}` "
            f"and wait until `pcluster describe-cluster` says it is not found")
    database_stack = f"llm-{settings.name}-database"
    if _stack(cloudformation, database_stack):
        rds = session.client("rds", endpoint_url=endpoint_url)
        resources = cloudformation.describe_stack_resources(StackName=database_stack)["StackResources"]
        for resource in resources:
            if resource["ResourceType"] != "AWS::RDS::DBInstance" or not resource.get("PhysicalResourceId"):
                continue
            identifier = resource["PhysicalResourceId"]
            try:
                instances = rds.describe_db_instances(DBInstanceIdentifier=identifier)["DBInstances"]
            except rds.exceptions.DBInstanceNotFoundFault:  # deleted outside the stack: nothing to stop at
                continue
            if instances and instances[0].get("DeletionProtection"):
                found.append(
                    f"the accounting database {identifier} has deletion protection: cdk destroy would stop at it "
                    f"with the other stacks half deleted; if its Slurm accounting may go (a final snapshot is "
                    f"kept), run `aws rds modify-db-instance --region {settings.region} --db-instance-identifier "
                    f"{identifier} --no-deletion-protection --apply-immediately`")
    return found


def main(settings: Settings, endpoint_url: str | None = None) -> int:
    try:
        found = problems(settings, endpoint_url)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        print(f"error: cannot read the account's stacks ({type(exc).__name__}: {exc}) — run it with the "
              f"credentials you deploy with, for region {settings.region}", file=sys.stderr)
        return 2
    for problem in found:
        print(f"problem: {problem}")
    if not found:
        print(f"teardown-check: no ParallelCluster cluster {settings.cluster_name} and no protected accounting "
              f"database in {settings.region}: cdk destroy -c env={settings.name} --all may go ahead")
    return 1 if found else 0
