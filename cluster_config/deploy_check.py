"""Before ``cdk deploy``: settings that synthesize but would deploy the shipped examples, or into another account.

    python -m cluster_config deploy-check --env prod     # make deploy ENV=prod runs it, then cdk deploy

``cdk synth`` runs anywhere, without credentials, so the shipped ``prod.yaml`` carries example values that
pass every check: an account id, Capacity Block ids and an alert address nobody reads. Deployed, they fail
late (CloudFormation refuses the account; ``pcluster create-cluster`` cannot find the reservations, after
the stacks are up) or not at all (alerts go to example.com). Two kinds of finding, each a ``problem:`` line
naming the field and the fix, exit 1:

- the credentials' account (STS GetCallerIdentity) is not ``account:``;
- a value is still the shipped example: an account of one repeated digit, the example Capacity Block ids,
  an alert address at a domain reserved for examples (RFC 2606, RFC 6761).

None: exit 0. AWS not reachable or no credentials: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import sys

import boto3
import botocore.exceptions

from cluster_config.settings import EXAMPLE_RESERVATIONS, Settings, is_example_account

EXAMPLE_DOMAINS = ("example.com", "example.org", "example.net", "example", "test", "invalid")


def example_values(settings: Settings) -> list[str]:
    """The shipped examples still in ``settings``, each with the key that holds it and its fix."""
    source = f"cluster_config/{settings.name}.yaml"
    found = []
    if is_example_account(settings.account):
        found.append(f"{source} account: {settings.account} is an example; set it to the AWS account you deploy into")
    for reservation in settings.gpu_queue.capacity_reservations:
        if reservation.id in EXAMPLE_RESERVATIONS:
            found.append(f"{source} gpu_queue.capacity_reservations: {reservation.id} is an example; set the id of "
                         "your Capacity Block (aws ec2 describe-capacity-reservations, its end beside it)")
    for address in settings.alerts.email:
        domain = address.rsplit("@", 1)[-1].lower()
        if any(domain == reserved or domain.endswith("." + reserved) for reserved in EXAMPLE_DOMAINS):
            found.append(f"{source} alerts.email: {address} is an example address, reserved for documentation; "
                         "set the addresses of the people on call (or [] for none)")
    return found


def problems(settings: Settings, endpoint_url: str | None = None) -> list[str]:
    """What stands in the way of ``cdk deploy -c env=<settings.name> --all``, each with its fix."""
    sts = boto3.session.Session(region_name=settings.region).client("sts", endpoint_url=endpoint_url)
    caller = sts.get_caller_identity()["Account"]
    found = []
    if caller != settings.account:
        found.append(f"cluster_config/{settings.name}.yaml account: is {settings.account}, but these credentials are "
                     f"account {caller}'s: set account: to the account you deploy into, or use its credentials")
    return found + example_values(settings)


def main(settings: Settings, endpoint_url: str | None = None) -> int:
    try:
        found = problems(settings, endpoint_url)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        print(f"error: cannot tell which account these credentials are for ({type(exc).__name__}: {exc}) — run it "
              "with the credentials you deploy with", file=sys.stderr)
        return 2
    for problem in found:
        print(f"problem: {problem}")
    if not found:
        print(f"deploy-check: account {settings.account}, no example values left: cdk deploy -c env={settings.name} "
              "--all may go ahead")
    return 1 if found else 0
