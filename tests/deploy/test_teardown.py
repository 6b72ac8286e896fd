"""`make destroy` checks first (`python -m cluster_config teardown-check`): in the emulated account, a
ParallelCluster cluster that still exists and an accounting database with deletion protection each stop
it with the command that clears them; once both are cleared it says go ahead.

The account is moto's (the true AWS boundary). The cluster is its CloudFormation stack, named after
``cluster_name`` as ParallelCluster names it; the database stack holds an RDS instance, whose deletion
protection is set through RDS (moto's CloudFormation drops that property).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3

from cluster_config.emulated.moto_server import FAKE_AWS_ENV, running

REPO = Path(__file__).resolve().parents[2]
REGION = "ap-southeast-3"  # prod's
DATABASE = {"Resources": {"Database": {"Type": "AWS::RDS::DBInstance", "Properties": {
    "DBInstanceClass": "db.t4g.small", "Engine": "mysql", "AllocatedStorage": "20", "MasterUsername": "slurm",
    "MasterUserPassword": "emulated-password"}}}}


def teardown_check(endpoint: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **FAKE_AWS_ENV, "AWS_MAX_ATTEMPTS": "1"}
    return subprocess.run([sys.executable, "-m", "cluster_config", "teardown-check", "--env", "prod",
                           "--endpoint-url", endpoint], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_destroy_waits_for_the_cluster_to_go_and_the_database_to_be_unprotected():
    with running() as endpoint:
        clients = {name: boto3.client(name, endpoint_url=endpoint, region_name=REGION, **{
            "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}) for name in ("cloudformation", "rds")}
        cloudformation, rds = clients["cloudformation"], clients["rds"]

        empty = teardown_check(endpoint)
        assert empty.returncode == 0 and "cdk destroy -c env=prod --all may go ahead" in empty.stdout, empty

        cloudformation.create_stack(StackName="llm-prod", TemplateBody=json.dumps(
            {"Resources": {"HeadNodeStandIn": {"Type": "AWS::SNS::Topic"}}}))
        cloudformation.create_stack(StackName="llm-prod-database", TemplateBody=json.dumps(DATABASE))
        identifier = cloudformation.describe_stack_resources(StackName="llm-prod-database")["StackResources"][0][
            "PhysicalResourceId"]
        rds.modify_db_instance(DBInstanceIdentifier=identifier, DeletionProtection=True, ApplyImmediately=True)

        both = teardown_check(endpoint)
        problems = [line for line in both.stdout.splitlines() if line.startswith("problem: ")]
        assert both.returncode == 1 and len(problems) == 2, both
        assert ("the ParallelCluster cluster llm-prod still exists (its stack is CREATE_COMPLETE)" in problems[0]
                and "run `pcluster delete-cluster --region ap-southeast-3 --cluster-name llm-prod`" in problems[0])
        assert (f"the accounting database {identifier} has deletion protection" in problems[1]
                and f"--db-instance-identifier {identifier} --no-deletion-protection" in problems[1])

        cloudformation.delete_stack(StackName="llm-prod")  # pcluster delete-cluster
        database_only = teardown_check(endpoint)
        assert database_only.returncode == 1 and "ParallelCluster" not in database_only.stdout, database_only

        rds.modify_db_instance(DBInstanceIdentifier=identifier, DeletionProtection=False, ApplyImmediately=True)
        cleared = teardown_check(endpoint)
        assert cleared.returncode == 0 and "may go ahead" in cleared.stdout, cleared

        rds.delete_db_instance(DBInstanceIdentifier=identifier, SkipFinalSnapshot=True)  # gone outside its stack
        deleted = teardown_check(endpoint)
        assert deleted.returncode == 0 and "may go ahead" in deleted.stdout, deleted


def test_an_account_it_cannot_reach_is_one_error_line_and_exit_2():
    result = teardown_check("http://127.0.0.1:9")  # the discard port: nothing listens
    assert result.returncode == 2, result
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot read the account's stacks (EndpointConnectionError") and "for region " \
        "ap-southeast-3" in last


def test_make_destroy_runs_the_check_before_cdk_destroy():
    recipe = subprocess.run(["make", "-n", "destroy", "ENV=prod"], cwd=REPO, capture_output=True, text=True, check=True,
                            env={**os.environ, "MAKEFLAGS": ""}).stdout.splitlines()
    check = next(i for i, line in enumerate(recipe) if "cluster_config teardown-check --env prod" in line)
    destroy = next(i for i, line in enumerate(recipe) if "npx cdk destroy -c env=prod --all" in line)
    assert check < destroy
