"""cdk-nag (3.x) AwsSolutions checks and every acknowledged finding, each with its reason.

Findings make synth fail (they are reported in ``cdk.out/<env>/validation-report.json``). A
finding is accepted only through ``acknowledge()``, on the narrowest construct that has it, with a
written reason. cdk-nag 3 matches granular findings one by one: ``AwsSolutions-IAM5[Action::s3:List*]``.
"""

from __future__ import annotations

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

from stacks.network_stack import NetworkStack


def add_checks(app: cdk.App) -> None:
    """Run the AwsSolutions rules over every stack of ``app`` at synth."""
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Accept ``finding`` (e.g. ``AwsSolutions-S1``) on ``scope`` and everything below it."""
    if len(reason.split()) < 5:
        raise ValueError(f"acknowledging {finding} on {scope.node.path} needs a reason of a sentence or more")
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=finding, reason=reason))


def acknowledge_network(network: NetworkStack) -> None:
    """The network stack's accepted findings (the storage stack has none)."""
    for subnet in (network.head_node_subnet, network.compute_subnet):
        acknowledge(
            subnet,
            "CloudFormation-Validate::W3010",
            "The zone is the capacity reservation's zone from the settings; the reserved GPUs exist only there.",
        )

