"""checkov (3.3, its own venv .venv-checkov) over the synthesized templates, and every accepted finding with its reason.

    python -m stacks.checkov cdk.out/prod        # prints every finding; exit 1 on one not accepted below

A finding is accepted only here, per check and per resource (logical-id prefix), with a reason: a
new resource failing the same check is not covered. All other checks run.
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
CHECKOV = REPO_ROOT / ".venv-checkov" / "bin" / "checkov"
INSTALL_HINT = "install it with: make deps (scripts/install_tool_venv.sh .venv-checkov requirements-checkov.txt)"

# CDK's own deploy-time Lambdas: the bucket deployment, the auto-delete of the assets bucket, the
# default security group restriction. They run only while CloudFormation deploys.
CDK_PROVIDER_LAMBDAS = ("CustomCDKBucketDeployment", "CustomS3AutoDeleteObjectsCustomResourceProviderHandler",
                        "CustomVpcRestrictDefaultSGCustomResourceProviderHandler")
CDK_LAMBDA_REASON = "CDK's own deploy-time function, called once per deploy by CloudFormation, which reports and retries failures"

# check id -> (resource logical-id prefixes, reason)
ACCEPTED: dict[str, tuple[tuple[str, ...], str]] = {
    "CKV_AWS_115": (CDK_PROVIDER_LAMBDAS, f"{CDK_LAMBDA_REASON}: a concurrency limit has nothing to limit."),
    "CKV_AWS_116": (CDK_PROVIDER_LAMBDAS, f"{CDK_LAMBDA_REASON}: a dead-letter queue would receive nothing."),
    "CKV_AWS_117": (CDK_PROVIDER_LAMBDAS, f"{CDK_LAMBDA_REASON}: it calls only S3 and EC2 APIs, no VPC resource."),
    "CKV_AWS_173": (("CustomCDKBucketDeployment",),
                    "The bucket deployment's environment holds no secret (only CDK's settings); the default key encrypts it."),
    "CKV_AWS_158": (("FlowLogGroup", "CustomCDKBucketDeployment", "WorkspaceLogGroup"),
                    "CloudWatch Logs encrypts log groups at rest by default; flow logs, the deployment log and the "
                    "Prometheus workspace's alert manager and ruler log hold addresses, ports, object keys, rule names "
                    "and delivery errors, no secrets, so a customer-managed key adds cost and key policy only."),
    "CKV_AWS_18": (("AccessLogBucket",), "It is the server-access-log destination of the other buckets; logging it would log into itself."),
    # The Slurm accounting database (stacks/database_stack.py).
    "CKV_AWS_149": (("Password",),
                    "The database password secret uses Secrets Manager's own key: ParallelCluster grants the head node "
                    "GetSecretValue on it, not kms:Decrypt on a customer key, so a CMK would lock slurmdbd out."),
    "CKV_AWS_157": (("Database",),
                    "One instance in the cluster's zone: the cluster is single-zone, and slurmctld queues accounting "
                    "records while RDS replaces an instance (also cdk-nag AwsSolutions-RDS3, stacks/nag.py)."),
    "CKV_AWS_118": (("Database",),
                    "slurmdbd's load is a few writes per job; basic CloudWatch metrics and the exported error log "
                    "cover it without an enhanced-monitoring role."),
    "CKV_AWS_161": (("Database",),
                    "slurmdbd logs in with a user and password (ParallelCluster's Database settings have no IAM "
                    "authentication); the port is open to the head node's security group only."),
    "CKV_AWS_21": (("AccessLogBucket", "AssetsBucket"),
                   "Access logs are written once by the S3 logging service and never overwritten; the assets bucket is "
                   "re-uploaded from the repository by every deploy. Data and checkpoint buckets are versioned."),
}


@dataclass(frozen=True)
class Finding:
    check_id: str
    resource: str  # AWS::Type.LogicalId
    template: str
    title: str

    @property
    def logical_id(self) -> str:
        return self.resource.split(".", 1)[1]

    @property
    def reason(self) -> str | None:
        prefixes, reason = ACCEPTED.get(self.check_id, ((), None))
        return reason if self.logical_id.startswith(prefixes) else None


def run(template_dir: Path) -> tuple[list[Finding], dict]:
    """checkov over every *.template.json in ``template_dir``: (failed findings, summary)."""
    if not CHECKOV.is_file():
        raise RuntimeError(f"checkov is not installed ({CHECKOV}); {INSTALL_HINT}")
    proc = subprocess.run(
        [str(CHECKOV), "-d", str(template_dir), "--framework", "cloudformation", "-o", "json", "--quiet"],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},  # offline: no mapping download from Bridgecrew
    )
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"checkov failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    findings, summary = [], {"passed": 0, "failed": 0}
    for report in reports:
        summary["passed"] += report["summary"]["passed"]
        summary["failed"] += report["summary"]["failed"]
        for failed in report["results"]["failed_checks"]:
            findings.append(Finding(failed["check_id"], failed["resource"], failed["file_path"].lstrip("/"), failed["check_name"]))
    return findings, summary


class _ArgumentParser(argparse.ArgumentParser):
    """Usage errors as ``error: <what> — <fix>``, exit 2: the convention of docs/cli.md (jobs/cli there)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {message} — see {self.prog} --help\n")


def main(argv: list[str] | None = None) -> int:
    parser = _ArgumentParser(prog="python -m stacks.checkov", description=__doc__.splitlines()[0])
    parser.add_argument("template_dir", type=Path, metavar="TEMPLATE_DIR",
                        help="a folder of synthesized templates (*.template.json), e.g. cdk.out/prod")
    args = parser.parse_args(argv)
    if not args.template_dir.is_dir():
        print(f"error: {args.template_dir} is not a folder — synthesize the templates first: make synth", file=sys.stderr)
        return 2
    try:
        findings, summary = run(args.template_dir)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    open_findings = [f for f in findings if not f.reason]
    print(f"{args.template_dir}: checkov {summary['passed']} passed, {summary['failed']} failed "
          f"({summary['failed'] - len(open_findings)} accepted in stacks/checkov.py, {len(open_findings)} not)")
    for finding in findings:
        status = "accepted" if finding.reason else "FAILED"
        print(f"  {status} {finding.check_id} {finding.resource} ({finding.template}): {finding.title}")
    return 1 if open_findings else 0


if __name__ == "__main__":
    sys.exit(main())
