"""The emulated account's server ends when its block ends, even when it does not answer SIGTERM in time."""

from __future__ import annotations

import subprocess
import sys
import time

import boto3
from botocore.config import Config

from cluster_config.emulated.moto_server import FAKE_AWS_ENV, running, stop


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace():
    # CI met moto's SIGTERM handler taking over 10 s on a busy machine; the test then failed in teardown.
    stubborn = subprocess.Popen([sys.executable, "-c",
                                 "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                 "print('ready', flush=True); time.sleep(120)"],
                                stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline().strip() == "ready"
    started = time.monotonic()
    stop(stubborn, grace=0.5)
    assert stubborn.returncode == -9
    assert time.monotonic() - started < 5


def test_the_server_answers_inside_the_block_and_is_gone_after_it(monkeypatch):
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    with running() as endpoint:
        sts = boto3.client("sts", endpoint_url=endpoint, region_name="us-east-1",
                           config=Config(retries={"total_max_attempts": 1}))
        assert sts.get_caller_identity()["Account"] == "123456789012"
    try:
        sts.get_caller_identity()
    except Exception as error:  # noqa: BLE001 - any connection failure means the server is gone
        assert "Could not connect" in str(error) or "Connection" in type(error).__name__
    else:
        raise AssertionError(f"{endpoint} still answers after its block ended")
