"""Put the repository's Grafana dashboard into the environment's Amazon Managed Grafana workspace.

    python -m cluster_config dashboard --env prod      # after cdk deploy with alerts.grafana: true

Finds both workspaces from the alerts stack's outputs (``llm-<env>-alerts``: GrafanaWorkspaceId,
WorkspaceId), then, through Grafana's HTTP API with a service-account token that lives ten minutes and
is deleted afterwards:

- the data source ``amp`` (Prometheus, SigV4 with the Grafana workspace's role, which may only query this
  Prometheus workspace: stacks/alerts_stack.py), created or updated in place;
- the dashboard ``monitoring/dashboards/cluster.json`` (every model's loss, throughput, GPUs, EFA, FSx
  and the alerts' inputs), created or overwritten, with the data source above as its default.

Run it again after a change to the dashboard; nothing else is changed. Printed: the dashboard's address.
AWS not reachable, no credentials or the workspace missing: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

import boto3
import botocore.exceptions

from cluster_config.settings import Settings

DASHBOARD = Path(__file__).resolve().parents[1] / "monitoring/dashboards/cluster.json"
DATASOURCE_UID = "amp"
SERVICE_ACCOUNT = "llm-dashboard-import"
TOKEN_SECONDS = 600


class DashboardError(Exception):
    """What stopped the import, with what to do."""


def stack_outputs(cloudformation, stack: str) -> dict[str, str]:
    try:
        (found,) = cloudformation.describe_stacks(StackName=stack)["Stacks"]
    except botocore.exceptions.ClientError as exc:
        raise DashboardError(f"stack {stack} not found ({exc}) — run make deploy for this environment first") from exc
    return {o["OutputKey"]: o["OutputValue"] for o in found.get("Outputs", [])}


def datasource(settings: Settings, amp_workspace_id: str) -> dict[str, Any]:
    """The Prometheus data source: the AMP workspace's query URL, signed with the Grafana workspace's role."""
    return {
        "uid": DATASOURCE_UID, "name": f"{settings.cluster_name} (Amazon Managed Service for Prometheus)",
        "type": "prometheus", "access": "proxy", "isDefault": True,
        "url": f"https://aps-workspaces.{settings.region}.amazonaws.com/workspaces/{amp_workspace_id}",
        # "ec2_iam_role": Amazon Managed Grafana's name for the workspace's own role (no keys stored).
        "jsonData": {"httpMethod": "POST", "sigV4Auth": True, "sigV4AuthType": "ec2_iam_role",
                     "sigV4Region": settings.region},
    }


def dashboard_body(path: Path = DASHBOARD) -> dict[str, Any]:
    """The dashboard as Grafana's import API takes it: no id (Grafana's own), overwriting by uid."""
    board = json.loads(path.read_text())
    board.pop("id", None)
    return {"dashboard": board, "overwrite": True, "message": "python -m cluster_config dashboard"}


Request = Callable[[str, str, dict[str, Any] | None], tuple[int, dict[str, Any]]]


def http_client(base_url: str, token: str) -> Request:
    """``request(method, path, body) -> (status, json)`` against Grafana's HTTP API."""
    def request(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{base_url}{path}", data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")
    return request


def put_datasource_and_dashboard(request: Request, source: dict[str, Any], body: dict[str, Any]) -> str:
    """Create or update the data source, then the dashboard; return the dashboard's path in Grafana."""
    status, _ = request("GET", f"/api/datasources/uid/{source['uid']}", None)
    if status == 200:
        status, answer = request("PUT", f"/api/datasources/uid/{source['uid']}", source)
    else:
        status, answer = request("POST", "/api/datasources", source)
    if status != 200:
        raise DashboardError(f"Grafana refused the data source ({status}: {answer.get('message', answer)})")
    status, answer = request("POST", "/api/dashboards/db", body)
    if status != 200:
        raise DashboardError(f"Grafana refused the dashboard ({status}: {answer.get('message', answer)})")
    return answer.get("url", "")


def import_dashboard(settings: Settings, cloudformation, client,
                     make_request: Callable[[str, str], Request] = http_client) -> str:
    """The whole import with these CloudFormation and Grafana clients; returns the dashboard's address."""
    outputs = stack_outputs(cloudformation, f"llm-{settings.name}-alerts")
    if "GrafanaWorkspaceId" not in outputs:
        raise DashboardError(f"the {settings.name} environment has no Grafana workspace — set alerts.grafana: true in "
                             f"cluster_config/{settings.name}.yaml, enable IAM Identity Center, then make deploy")
    workspace_id = outputs["GrafanaWorkspaceId"]
    endpoint = client.describe_workspace(workspaceId=workspace_id)["workspace"]["endpoint"]
    accounts = client.list_workspace_service_accounts(workspaceId=workspace_id)["serviceAccounts"]
    account = next((a for a in accounts if a["name"] == SERVICE_ACCOUNT), None) or client.create_workspace_service_account(
        workspaceId=workspace_id, name=SERVICE_ACCOUNT, grafanaRole="ADMIN")
    token = client.create_workspace_service_account_token(
        workspaceId=workspace_id, serviceAccountId=account["id"], name=f"import-{settings.name}",
        secondsToLive=TOKEN_SECONDS)["serviceAccountToken"]
    base_url = f"https://{endpoint}"
    try:
        path = put_datasource_and_dashboard(make_request(base_url, token["key"]),
                                            datasource(settings, outputs["WorkspaceId"]), dashboard_body())
    finally:  # the token's ten minutes are a bound, not the plan
        client.delete_workspace_service_account_token(
            workspaceId=workspace_id, serviceAccountId=account["id"], tokenId=token["id"])
    return f"{base_url}{path}"


def main(settings: Settings, endpoint_url: str | None = None) -> int:
    session = boto3.session.Session(region_name=settings.region)
    try:
        address = import_dashboard(settings, session.client("cloudformation", endpoint_url=endpoint_url),
                                   session.client("grafana", endpoint_url=endpoint_url))
    except DashboardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError) as exc:
        print(f"error: cannot reach the {settings.name} workspaces ({type(exc).__name__}: {exc}) — run it with the "
              f"credentials you deploy with, for region {settings.region}", file=sys.stderr)
        return 2
    print(f"dashboard: {address} (sign in through IAM Identity Center; docs/monitoring.md)")
    return 0
