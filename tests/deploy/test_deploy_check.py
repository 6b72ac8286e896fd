"""`make deploy` checks first (`python -m cluster_config deploy-check`): settings that synthesize but hold the
shipped examples, or name another account than the credentials', are refused with the field and the fix.

The account is moto's (the true AWS boundary): STS answers GetCallerIdentity with its account, 123456789012.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from cluster_config.deploy_check import problems
from cluster_config.emulated.moto_server import FAKE_AWS_ENV, running
from cluster_config.settings import load_settings
from tests.settings_files import write_env

REPO = Path(__file__).resolve().parents[2]
MOTO_ACCOUNT = "123456789012"


def deploy_check(endpoint: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **FAKE_AWS_ENV, "AWS_MAX_ATTEMPTS": "1"}
    return subprocess.run([sys.executable, "-m", "cluster_config", "deploy-check", "--env", "prod", "--endpoint-url",
                           endpoint], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_the_shipped_prod_settings_are_refused_naming_each_example_and_the_account(tmp_path, monkeypatch):
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    write_env(tmp_path, "prod", account=MOTO_ACCOUNT, alerts__email=["oncall@llm-team.internal"],
              gpu_queue__capacity_reservations__0__id="cr-0123456789abcdef0",
              gpu_queue__capacity_reservations__1__id="cr-0123456789abcdef1")
    with running() as endpoint:
        shipped = deploy_check(endpoint)
        # Own blocks' dates count: loaded as before prod.yaml's example end, so that the test outlives it.
        replaced = problems(load_settings("prod", tmp_path, now=datetime(2026, 11, 28, tzinfo=timezone.utc)), endpoint)
    assert shipped.returncode == 1, shipped
    assert shipped.stdout.splitlines() == [
        f"problem: cluster_config/prod.yaml account: is 222222222222, but these credentials are account {MOTO_ACCOUNT}'s: "
        "set account: to the account you deploy into, or use its credentials",
        "problem: cluster_config/prod.yaml account: 222222222222 is an example; set it to the AWS account you deploy into",
        "problem: cluster_config/prod.yaml gpu_queue.capacity_reservations: cr-0a1b2c3d4e5f60718 is an example; set the "
        "id of your Capacity Block (aws ec2 describe-capacity-reservations, its end beside it)",
        "problem: cluster_config/prod.yaml gpu_queue.capacity_reservations: cr-0a1b2c3d4e5f60729 is an example; set the "
        "id of your Capacity Block (aws ec2 describe-capacity-reservations, its end beside it)",
        "problem: cluster_config/prod.yaml alerts.email: ml-oncall@example.com is an example address, reserved for "
        "documentation; set the addresses of the people on call (or [] for none)",
    ]
    assert replaced == []  # the same settings with the examples replaced, in the credentials' account


def test_no_reachable_account_is_one_error_line():
    env = {**os.environ, **FAKE_AWS_ENV, "AWS_MAX_ATTEMPTS": "1"}
    result = subprocess.run([sys.executable, "-m", "cluster_config", "deploy-check", "--env", "prod", "--endpoint-url",
                             "http://127.0.0.1:9"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("error: cannot tell which account these credentials are for (")
    assert result.stderr.rstrip().endswith("run it with the credentials you deploy with")
