"""Day zero against the emulated account: find the Capacity Blocks, refuse to buy them without a confirmation
that echoes the total, buy them with it, write them into the settings, and let deploy-check pass on them and
fail on a zone mismatch, a quota shortfall and a shipped example date (docs/deploy.md, Day zero).

moto has no Capacity Block or EC2/FSx quota calls: the emulated account answers them (stubs.MOTO_GAPS),
through moto's own botocore-model parsing, and boto3 validates every request against botocore's model
before it is sent, so a parameter EC2 lacks fails here as it would against AWS.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from cluster_config import capacity
from cluster_config.deploy_check import EXAMPLE_BLOCK_END, EXAMPLE_TRAINING_START, day_zero, problems
from cluster_config.emulated.moto_server import FAKE_AWS_ENV, running
from cluster_config.emulated.stubs import EMULATED_BLOCK_PRICE_USD
from cluster_config.settings import CONFIG_DIR, load_settings

REPO = Path(__file__).resolve().parents[2]
MOTO_ACCOUNT = "123456789012"
BEFORE_THE_EXAMPLES = datetime(2026, 11, 28, tzinfo=timezone.utc)  # the shipped example dates lie ahead of it


@pytest.fixture(autouse=True)
def fake_credentials(monkeypatch):
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")


def cli(endpoint: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cluster_config", "capacity", "--env", "prod", *args,
                           "--endpoint-url", endpoint], cwd=REPO, env=os.environ, capture_output=True, text=True,
                          timeout=120)


def window() -> tuple[str, str]:
    today = datetime.now(timezone.utc).date()
    return str(today + timedelta(days=60)), str(today + timedelta(days=63))


def edit_yaml(path: Path, change) -> None:
    raw = yaml.safe_load(path.read_text())
    change(raw)
    path.write_text(yaml.safe_dump(raw))


def test_the_example_dates_are_the_shipped_ones():
    raw = yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())
    assert {block["end"] for block in raw["gpu_queue"]["capacity_reservations"]} == {EXAMPLE_BLOCK_END}
    assert raw["goodput"]["training_start"] == EXAMPLE_TRAINING_START


def test_day_zero_buys_the_blocks_writes_them_and_deploy_check_judges_them(tmp_path):
    start_after, start_before = window()
    # The shipped file as a reader edits it (comments and one-line blocks kept): their account, their address.
    path = tmp_path / "prod.yaml"
    path.write_text((CONFIG_DIR / "prod.yaml").read_text().replace('account: "222222222222"', f'account: "{MOTO_ACCOUNT}"')
                    .replace("ml-oncall@example.com", "oncall@llm-team.internal"))
    with running() as endpoint:
        # Offerings that fit: 2 x 40 p5e.48xlarge, 14 days, per zone and start, with the total and the command to buy.
        listed = cli(endpoint, "--start-after", start_after, "--start-before", start_before)
        assert listed.returncode == 0, listed.stderr
        lines = [line for line in listed.stdout.splitlines() if re.match(r"  ap-southeast-3[abc] ", line)]
        assert len(lines) == 3 * 3  # three zones x three daily starts in the window
        total = 2 * 40 * 14 * 24 * EMULATED_BLOCK_PRICE_USD
        assert all(f"{total:,.2f}" in line for line in lines)
        line = next(line for line in lines if line.split()[0] == "ap-southeast-3b")
        offerings = line.split()[-2:]
        assert "--buy <its offerings>" in listed.stdout

        # A purchase without the confirmation buys nothing and says the total; a wrong total buys nothing either.
        refused = cli(endpoint, "--start-after", start_after, "--start-before", start_before, "--buy", *offerings)
        assert refused.returncode == 1
        assert f"not bought: 2 Capacity Block(s) for USD {total:,.2f} in all, paid up front and not cancellable; " \
               f"to buy, add --confirm-total-usd {total:.2f}" in refused.stderr
        wrong = cli(endpoint, "--start-after", start_after, "--start-before", start_before, "--buy", *offerings,
                    "--confirm-total-usd", "1000")
        assert wrong.returncode == 1 and "is not the total" in wrong.stderr
        settings = load_settings("prod", tmp_path)
        with pytest.raises(capacity.CapacityError, match="cr-0a1b2c3d4e5f60718, cr-0a1b2c3d4e5f60729 are the shipped "
                                                         "examples; buy your blocks first"):
            capacity.status(settings, endpoint)

        # Confirmed: bought, then the settings' edit written into the environment's file, its comments kept.
        found = capacity.find(settings, start_after, start_before, endpoint_url=endpoint)
        picks = capacity.chosen(found, offerings, settings)
        bought = capacity.purchase(settings, picks, f"{total:.2f}", endpoint)
        assert [r["State"] for r in bought] == ["scheduled", "scheduled"]
        edit = capacity.settings_edit(settings, bought)
        capacity.write_edit(settings, edit, tmp_path)
        updated = load_settings("prod", tmp_path)
        assert "# must be the Capacity Blocks' zone" in path.read_text()  # the comments stay
        assert updated.availability_zone == "ap-southeast-3b"
        assert [r.id for r in updated.gpu_queue.capacity_reservations] == [r["CapacityReservationId"] for r in bought]
        assert {r.end for r in updated.gpu_queue.capacity_reservations} == {picks[0].end}
        assert updated.goodput.training_start == picks[0].start + capacity.TRAINING_START_AFTER
        assert [r["State"] for r in capacity.status(updated, endpoint)] == ["scheduled", "scheduled"]

        # The command does the same: bought, and the edit printed (without --write the file is left alone).
        again = cli(endpoint, "--start-after", start_after, "--start-before", start_before, "--buy", *offerings,
                    "--confirm-total-usd", f"{total:.2f}")
        assert again.returncode == 0, again.stderr
        assert f"bought 2 Capacity Block(s), USD {total:,.2f}:" in again.stdout
        assert "  availability_zone: ap-southeast-3b" in again.stdout

        # deploy-check passes on them ...
        assert problems(updated, endpoint) == []
        assert day_zero(updated, endpoint) == ([], [])

        # ... and fails on the cluster's zone not the blocks', naming the field and the fix,
        edit_yaml(path, lambda raw: raw.update(availability_zone="ap-southeast-3a"))
        moved, _ = day_zero(load_settings("prod", tmp_path), endpoint)
        assert moved == [
            f"cluster_config/prod.yaml gpu_queue.capacity_reservations.{i}: {r['CapacityReservationId']} is in "
            "ap-southeast-3b, but availability_zone is ap-southeast-3a, where the cluster's subnets are made, and a "
            "block's nodes start only in its own zone; set availability_zone: ap-southeast-3b" for i, r in enumerate(bought)]

        # ... and on the shipped example dates left beside the bought blocks.
        def examples(raw):
            raw["availability_zone"] = "ap-southeast-3b"
            raw["goodput"]["training_start"] = EXAMPLE_TRAINING_START
            for block in raw["gpu_queue"]["capacity_reservations"]:
                block["end"] = EXAMPLE_BLOCK_END

        edit_yaml(path, examples)
        dated, _ = day_zero(load_settings("prod", tmp_path, now=BEFORE_THE_EXAMPLES), endpoint)
        end = f"{picks[0].end:%Y-%m-%dT%H:%M:%SZ}"
        assert dated[:2] == [
            f"cluster_config/prod.yaml gpu_queue.capacity_reservations.{i}.end: 2027-01-18T11:30:00+00:00 (the shipped "
            f"example's date), but {r['CapacityReservationId']} ends {end}; set end: {end}" for i, r in enumerate(bought)]
        assert dated[2].startswith("cluster_config/prod.yaml goodput.training_start: 2027-01-04T13:30:00+00:00 (the "
                                   "shipped example's date) is before the Capacity Blocks start")
        assert len(dated) == 3


def test_a_quota_shortfall_names_the_quota_the_need_and_the_request(monkeypatch):
    monkeypatch.setenv("MOTO_SERVICE_QUOTAS", json.dumps({"ec2/L-1216C47A": 128, "fsx/L-EMULATED1": 9600}))
    settings = load_settings("prod")
    with running() as endpoint:
        found, notes = day_zero(settings, endpoint)
    assert notes == []
    assert found == [
        "service quota ec2 L-1216C47A (Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances) is 128 vCPUs in "
        "ap-southeast-3, but cluster_config/prod.yaml needs 272: head_node.instance_type c7i.4xlarge (16 vCPUs) + "
        "cpu_queue.max_count 8 x c7i.8xlarge (32 vCPUs); ask for it (aws service-quotas request-service-quota-increase "
        "--region ap-southeast-3 --service-code ec2 --quota-code L-1216C47A --desired-value 272) or lower "
        "cpu_queue.max_count",
        "service quota fsx L-EMULATED1 (Lustre Persistent_2 storage capacity) is 9,600 GiB in ap-southeast-3, but "
        "cluster_config/prod.yaml storage: asks 19,200 GiB in all; ask for it (aws service-quotas "
        "request-service-quota-increase --region ap-southeast-3 --service-code fsx --quota-code L-EMULATED1 "
        "--desired-value 19200) or lower storage_capacity_gib",
    ]


def test_bad_flags_name_the_flag_and_the_fix():
    settings = load_settings("prod")
    with pytest.raises(capacity.CapacityError, match=r"--start-after 2027-13-01 is not a date; write it as YYYY-MM-DD"):
        capacity.find(settings, "2027-13-01", "2027-01-10", endpoint_url="http://127.0.0.1:9")
    with pytest.raises(capacity.CapacityError, match=r"--start-before 2027-01-01 is not after --start-after 2027-01-04"):
        capacity.find(settings, "2027-01-04", "2027-01-01", endpoint_url="http://127.0.0.1:9", now=BEFORE_THE_EXAMPLES)
    with pytest.raises(capacity.CapacityError, match=r"--days 20: a Capacity Block lasts 1-14 days, then 7-day steps"):
        capacity.find(settings, "2027-01-04", "2027-01-10", days=20, endpoint_url="http://127.0.0.1:9",
                      now=BEFORE_THE_EXAMPLES)
