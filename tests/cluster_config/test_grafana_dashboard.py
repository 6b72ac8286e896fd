"""python -m cluster_config dashboard: the data source and the dashboard into Amazon Managed Grafana.

Grafana's side is a real HTTP server on this machine that keeps what it is given and checks the bearer
token (the four calls of Grafana's API the import makes); the AWS side (CloudFormation's outputs, the
Grafana workspace's service account and token) is botocore's Stubber: moto has no Amazon Managed Grafana.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
from botocore.stub import Stubber

from cluster_config import dashboard
from cluster_config.settings import load_settings

TOKEN = "glsa_test"


class FakeGrafana(BaseHTTPRequestHandler):
    datasources: dict[str, dict] = {}
    dashboards: dict[str, dict] = {}
    calls: list[tuple[str, str]] = []

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        self.calls.append((self.command, self.path))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._answer(401, {"message": "invalid API key"})
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        uid = self.path.rsplit("/", 1)[-1]
        if self.command == "GET" and self.path.startswith("/api/datasources/uid/"):
            return self._answer(200, self.datasources[uid]) if uid in self.datasources else self._answer(404, {"message": "not found"})
        if self.command == "POST" and self.path == "/api/datasources":
            if body["uid"] in self.datasources:
                return self._answer(409, {"message": "data source with the same uid already exists"})
            self.datasources[body["uid"]] = body
            return self._answer(200, {"message": "Datasource added"})
        if self.command == "PUT" and self.path.startswith("/api/datasources/uid/"):
            self.datasources[uid] = body
            return self._answer(200, {"message": "Datasource updated"})
        if self.command == "POST" and self.path == "/api/dashboards/db":
            board = body["dashboard"]
            if board["uid"] in self.dashboards and not body.get("overwrite"):
                return self._answer(412, {"message": "dashboard exists"})
            self.dashboards[board["uid"]] = board
            return self._answer(200, {"status": "success", "url": f"/d/{board['uid']}/cluster"})
        return self._answer(404, {"message": "not found"})

    do_GET = do_POST = do_PUT = _handle

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def grafana():
    FakeGrafana.datasources, FakeGrafana.dashboards, FakeGrafana.calls = {}, {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeGrafana)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def aws_clients(outputs: dict[str, str], accounts: list[dict]):
    """CloudFormation and Grafana clients answering as an account where the alerts stack is deployed."""
    cloudformation = boto3.client("cloudformation", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    client = boto3.client("grafana", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    cf_stub, grafana_stub = Stubber(cloudformation), Stubber(client)
    cf_stub.add_response("describe_stacks", {"Stacks": [{
        "StackName": "llm-dev-alerts", "CreationTime": "2026-11-28T00:00:00Z", "StackStatus": "CREATE_COMPLETE",
        "Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in outputs.items()]}]}, {"StackName": "llm-dev-alerts"})
    if "GrafanaWorkspaceId" in outputs:
        workspace = {"workspaceId": "g-123"}
        grafana_stub.add_response("describe_workspace", {"workspace": {
            "id": "g-123", "endpoint": "g-123.grafana-workspace.us-east-1.amazonaws.com", "status": "ACTIVE",
            "authentication": {"providers": ["AWS_SSO"]}, "created": "2026-11-28T00:00:00Z", "modified": "2026-11-28T00:00:00Z",
            "dataSources": ["PROMETHEUS"], "grafanaVersion": "10.4"}}, workspace)
        grafana_stub.add_response("list_workspace_service_accounts",
                                  {"serviceAccounts": accounts, "workspaceId": "g-123"}, workspace)
        if not accounts:
            grafana_stub.add_response("create_workspace_service_account", {
                "id": "7", "name": dashboard.SERVICE_ACCOUNT, "grafanaRole": "ADMIN", "workspaceId": "g-123"},
                {**workspace, "name": dashboard.SERVICE_ACCOUNT, "grafanaRole": "ADMIN"})
        grafana_stub.add_response("create_workspace_service_account_token", {
            "serviceAccountToken": {"id": "t1", "name": "import-dev", "key": TOKEN}, "serviceAccountId": "7",
            "workspaceId": "g-123"}, {**workspace, "serviceAccountId": "7", "name": "import-dev", "secondsToLive": 600})
        grafana_stub.add_response("delete_workspace_service_account_token", {
            "tokenId": "t1", "serviceAccountId": "7", "workspaceId": "g-123"},
            {**workspace, "serviceAccountId": "7", "tokenId": "t1"})
    cf_stub.activate()
    grafana_stub.activate()
    return cloudformation, client, (cf_stub, grafana_stub)


def to(base_url: str):
    """Grafana's API at the fake server instead of the workspace's https endpoint."""
    return lambda _endpoint, token: dashboard.http_client(base_url, token)


OUTPUTS = {"WorkspaceId": "ws-abc", "GrafanaWorkspaceId": "g-123", "GrafanaUrl": "https://g-123.grafana-workspace"}


def test_the_import_adds_the_signed_prometheus_source_and_the_dashboard_and_deletes_its_token(grafana):
    settings = load_settings("dev")
    cloudformation, client, stubs = aws_clients(OUTPUTS, accounts=[])
    address = dashboard.import_dashboard(settings, cloudformation, client, make_request=to(grafana))
    for stub in stubs:
        stub.assert_no_pending_responses()  # the token deleted, the service account made once
    source = FakeGrafana.datasources["amp"]
    assert source["url"] == "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-abc"
    assert source["jsonData"] == {"httpMethod": "POST", "sigV4Auth": True, "sigV4AuthType": "ec2_iam_role",
                                  "sigV4Region": "us-east-1"}
    board = json.loads(dashboard.DASHBOARD.read_text())
    (imported,) = FakeGrafana.dashboards.values()
    assert imported["uid"] == board["uid"] and imported["panels"] == board["panels"] and "id" not in imported
    assert address == f"https://g-123.grafana-workspace.us-east-1.amazonaws.com/d/{board['uid']}/cluster"


def test_a_second_import_updates_in_place(grafana):
    settings = load_settings("dev")
    existing = [{"id": "7", "name": dashboard.SERVICE_ACCOUNT, "grafanaRole": "ADMIN", "isDisabled": "false"}]
    for _ in range(2):
        cloudformation, client, stubs = aws_clients(OUTPUTS, accounts=existing)
        dashboard.import_dashboard(settings, cloudformation, client, make_request=to(grafana))
        for stub in stubs:
            stub.assert_no_pending_responses()
    assert ("PUT", "/api/datasources/uid/amp") in FakeGrafana.calls
    assert len(FakeGrafana.datasources) == 1 and len(FakeGrafana.dashboards) == 1


def test_without_a_grafana_workspace_it_says_which_setting_turns_it_on(capsys, monkeypatch):
    settings = load_settings("dev")
    cloudformation, client, _ = aws_clients({"WorkspaceId": "ws-abc"}, accounts=[])
    monkeypatch.setattr(dashboard.boto3.session.Session, "client",
                        lambda self, name, **_: cloudformation if name == "cloudformation" else client)
    assert dashboard.main(settings) == 2
    assert "set alerts.grafana: true in cluster_config/dev.yaml" in capsys.readouterr().err


def test_a_refusal_by_grafana_is_an_error_naming_what_was_refused(grafana):
    request = dashboard.http_client(grafana, "wrong-token")
    with pytest.raises(dashboard.DashboardError, match="Grafana refused the data source \\(401: invalid API key\\)"):
        dashboard.put_datasource_and_dashboard(request, {"uid": "amp"}, {"dashboard": {"uid": "x"}})
