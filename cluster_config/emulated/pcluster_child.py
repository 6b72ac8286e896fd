"""Runs inside .venv-pcluster (ParallelCluster 3.16.1): its validators and update checks, as JSON.

Started by ``cluster_config.emulated.check`` with a JSON request on stdin:

    {"endpoint": "http://127.0.0.1:PORT", "region": ..., "cluster_name": ...,
     "config": "<yaml>" | null, "reservations": [...], "placement_groups": [...], "patches": {"name": ["<base yaml>", "<target yaml>"]}}

and answers on stdout:

    {"failures": [{"level", "validator", "message"}], "error": null | "<why the config did not load>",
     "validators": [names that ran], "stubbed": [stubbed calls], "patches": {"name": {"allowed", "rows"}}}

``validate_create_request`` is what ``pcluster create-cluster --dryrun`` runs (schema, then every
validator); ``ConfigPatch(...).check()`` is what ``pcluster update-cluster`` and ParallelCluster's
CloudFormation custom resource run before an update. Every AWS call goes to the emulated account
(``AWS_ENDPOINT_URL``) except those listed in ``stubs.PCLUSTER_STUBS``.
"""

from __future__ import annotations

import json
import logging
import os
import sys


def main() -> None:
    request = json.loads(sys.stdin.read())
    os.environ.update({
        "AWS_ENDPOINT_URL": request["endpoint"], "AWS_DEFAULT_REGION": request["region"],
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
    })
    logging.disable(logging.CRITICAL)  # ParallelCluster logs every call; the answer is the JSON

    import boto3
    import yaml
    from pcluster.config.common import Resource
    from pcluster.config.config_patch import ConfigPatch
    from pcluster.models.cluster import Cluster, ConfigValidationError
    from pcluster.validators.common import FailureLevel

    from cluster_config.emulated.stubs import RunningCluster, amazon_linux_image, patch_pcluster

    stubbed: list[str] = []
    patch_pcluster(request["reservations"], request["placement_groups"], amazon_linux_image(boto3.client("ec2")), stubbed)

    ran: list[str] = []
    execute = Resource._validator_execute

    def record(validator_class, validator_args, suppressors, executor):
        ran.append(validator_class.__name__)
        return execute(validator_class, validator_args, suppressors, executor)

    Resource._validator_execute = staticmethod(record)

    error, failures = None, []
    if request["config"] is not None:  # None: update checks only
        cluster = Cluster(request["cluster_name"], config=request["config"])
        try:
            failures = cluster.validate_create_request(validator_suppressors=set(), validation_failure_level=FailureLevel.ERROR)
        except ConfigValidationError as exc:
            failures = exc.validation_failures or []
            if not failures:
                error = str(exc)

    running = RunningCluster(request["cluster_name"])
    patches = {}
    for name, (base, target) in request.get("patches", {}).items():
        allowed, rows = ConfigPatch(cluster=running, base_config=yaml.safe_load(base), target_config=yaml.safe_load(target)).check()
        patches[name] = {"allowed": allowed, "rows": [[_plain(cell) for cell in row] for row in rows[1:]]}

    json.dump({
        "failures": [{"level": f.level.name, "validator": f.validator_type, "message": f.message} for f in failures],
        "error": error,
        "validators": sorted(set(ran)),
        "stubbed": sorted(set(stubbed)),
        "patches": patches,
    }, sys.stdout)


def _plain(value):
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


if __name__ == "__main__":
    main()
