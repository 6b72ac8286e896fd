"""ParallelCluster validation WARNINGs that are accepted, each with its reason: the one place for them.

A warning not listed here fails the deploy-true tests and `make validate`; an ERROR is never
accepted. Each entry is (validator type, a fragment of its message) -> why it is accepted.
"""

from __future__ import annotations

ACKNOWLEDGED_WARNINGS: dict[tuple[str, str], str] = {
    ("KeyPairValidator", "If you do not specify a key pair"):
        "No SSH key on purpose: administrators connect with SSM Session Manager (the SSM policy is on every "
        "node), and SSH is reachable only from network.ssh_allowed_cidrs when that lists a range.",
    ("DetailedMonitoringValidator", "Detailed Monitoring is enabled"):
        "1-minute EC2 metrics are wanted to see a stalled or throttled GPU node within minutes; they cost "
        "a few dollars a month per node against $34.60 an hour for a p5e.48xlarge.",
}


def reason_for(failure: dict[str, str]) -> str | None:
    for (validator, fragment), reason in ACKNOWLEDGED_WARNINGS.items():
        if failure["validator"] == validator and fragment in failure["message"]:
            return reason
    return None
