"""Check rendered cluster configs against ParallelCluster's own schema, in a separate interpreter.

ParallelCluster's package pins CDK v1 and jsii 1.85, so it lives in its own folder
(``scripts/install_pcluster_schema.sh`` -> ``.build/pcluster``) and runs in a child Python started
with ``-I -S``: no site-packages, so nothing of the CDK venv mixes in. This module is both the
parent side (``check_configs``) and the child's entry point (``python pcluster_schema.py``).

The schema load makes one AWS call: EC2 DescribeCapacityReservations for the CapacityReservationTargets.
The child answers it locally with botocore's Stubber (the AWS boundary, nothing else is replaced),
describing the reservations the config names, so the check never needs credentials or a network.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TARGET = REPO_ROOT / ".build" / "pcluster"
INSTALL_HINT = "install it with: scripts/install_pcluster_schema.sh"


class SchemaNotInstalled(RuntimeError):
    pass


@dataclass(frozen=True)
class SchemaResult:
    name: str
    errors: dict  # ParallelCluster's ValidationError.messages; empty when the config loads
    ec2_calls: list  # AWS calls the load made (answered by the stub)

    @property
    def ok(self) -> bool:
        return not self.errors


def check_configs(configs: dict[str, tuple[str, str, str]], target: Path = DEFAULT_TARGET) -> list[SchemaResult]:
    """Load each ``name -> (cluster_name, region, yaml_text)`` with ParallelCluster's ClusterSchema."""
    if not (target / "pcluster" / "schemas" / "cluster_schema.py").is_file():
        raise SchemaNotInstalled(f"ParallelCluster's schema is not in {target}; {INSTALL_HINT}")
    request = json.dumps(
        {"target": str(target), "configs": {name: list(value) for name, value in configs.items()}}
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "AWS_EC2_METADATA_DISABLED": "true"}
    proc = subprocess.run(
        [sys.executable, "-I", "-S", __file__],
        input=request, capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ParallelCluster schema check crashed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    answer = json.loads(proc.stdout)
    return [SchemaResult(name, item["errors"], item["ec2_calls"]) for name, item in answer.items()]


def _child() -> None:
    """Runs in the isolated interpreter: stdlib + the ParallelCluster folder only."""
    argparse.ArgumentParser(description="ParallelCluster's schema check of the configs in a JSON request on stdin, "
                                        "as check_configs sends it; the answer, JSON, on stdout").parse_args()
    request = json.loads(sys.stdin.read())
    sys.path.insert(0, request["target"])
    import logging

    logging.disable(logging.WARNING)  # ParallelCluster logs its boto3 calls; the answer is the JSON below
    results = {}
    for name, (cluster_name, region, text) in request["configs"].items():
        os.environ["AWS_DEFAULT_REGION"] = region  # the schema ignores the config's Region for this
        results[name] = _load_one(cluster_name, text)
    json.dump(results, sys.stdout)


def _load_one(cluster_name: str, text: str) -> dict:
    from botocore.stub import ANY, Stubber
    from marshmallow import ValidationError
    from pcluster.aws.aws_api import AWSApi
    from pcluster.schemas.cluster_schema import ClusterSchema
    from pcluster.utils import yaml_load

    AWSApi.reset()
    ec2 = AWSApi.instance().ec2._client
    calls: list = []
    config = yaml_load(text)
    stubber = Stubber(ec2)
    reservations = _reservations(config)
    if reservations:
        # ParallelCluster asks for the ids of a set, in no fixed order; what it asked is checked below.
        stubber.add_response("describe_capacity_reservations", {"CapacityReservations": reservations},
                             {"CapacityReservationIds": ANY})
        asked: list = []
        ec2.meta.events.register("provide-client-params.ec2.DescribeCapacityReservations",
                                 lambda params, **_: asked.extend(params.get("CapacityReservationIds", [])))
    ec2.meta.events.register("provide-client-params.ec2.*", lambda event_name, **_: calls.append(event_name.rsplit(".", 1)[-1]))
    try:
        with stubber:
            ClusterSchema(cluster_name=cluster_name).load(config)
        errors: dict = {}
    except ValidationError as exc:
        errors = exc.messages if isinstance(exc.messages, dict) else {"_schema": exc.messages}
    if reservations and sorted(asked) != sorted({r["CapacityReservationId"] for r in reservations}):
        errors = {**errors, "_stub": [f"DescribeCapacityReservations asked for {sorted(asked)}, the config names "
                                      f"{sorted(r['CapacityReservationId'] for r in reservations)}"]}
    return {"errors": errors, "ec2_calls": calls}


def _reservations(config: dict) -> list[dict]:
    """What EC2 would say about each reservation the config targets (one per compute resource)."""
    found = []
    for queue in config.get("Scheduling", {}).get("SlurmQueues", []):
        for resource in queue.get("ComputeResources", []):
            target = resource.get("CapacityReservationTarget") or queue.get("CapacityReservationTarget") or {}
            if "CapacityReservationId" in target:
                found.append(
                    {
                        "CapacityReservationId": target["CapacityReservationId"],
                        "InstanceType": resource.get("InstanceType", ""),
                        "AvailabilityZone": os.environ["AWS_DEFAULT_REGION"] + "a",
                        "TotalInstanceCount": resource.get("MaxCount", 1),
                        "AvailableInstanceCount": resource.get("MaxCount", 1),
                        "State": "active",
                        "InstanceMatchCriteria": "targeted",
                    }
                )
    return found


if __name__ == "__main__":
    _child()
