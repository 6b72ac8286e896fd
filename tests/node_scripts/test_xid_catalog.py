"""node_scripts/xid_catalog.tsv, the Xid table node_health.sh acts on and the GPUFatalXid alert follows:
each row's action is what NVIDIA's catalog says to do with that Xid, and the alert fires on exactly
the Xids the health check drains for."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "node_scripts" / "xid_catalog.tsv"
# NVIDIA's immediate-action buckets, and what a training cluster does with each
ACTIONS = {"RESTART_APP": "restart", "IGNORE": "ignore", "RESET_GPU": "drain", "RESTART_BM": "drain",
           "WORKFLOW_XID_48": "drain", "WORKFLOW_NVLINK_ERR": "drain",
           "WORKFLOW_XID_45": "ignore"}  # 45: preemptive cleanup after another error, which decides


def rows() -> dict[int, tuple[str, str, str]]:
    table = {}
    for line in CATALOG.read_text().splitlines():
        if line and not line.startswith("#"):
            xid, mnemonic, nvidia, action = line.split("\t")
            assert int(xid) not in table, f"Xid {xid} twice"
            table[int(xid)] = (mnemonic, nvidia, action)
    return table


def test_every_action_is_the_one_nvidia_names():
    for xid, (mnemonic, nvidia, action) in rows().items():
        if xid == 154:
            assert action == "derived", "Xid 154's action is in its message"
            continue
        assert ACTIONS[nvidia] == action, (xid, mnemonic, nvidia, action)


def test_what_one_gets_wrong_most_often_is_pinned():
    table = rows()
    assert table[94][2] == "restart"  # contained ECC: restart the application, the GPU is fine
    assert table[79][2] == table[48][2] == table[95][2] == table[74][2] == "drain"
    assert table[63][2] == table[92][2] == "ignore"
    assert table[13][2] == table[31][2] == "restart"


def test_the_alert_fires_on_exactly_the_xids_the_health_check_drains_for():
    rules = yaml.safe_load((REPO / "monitoring" / "rules" / "cluster.yml").read_text())
    [rule] = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GPUFatalXid"]
    alerted = {int(x) for x in re.findall(r"DCGM_FI_DEV_XID_ERRORS == (\d+)", rule["expr"])}
    assert alerted == {xid for xid, (_, _, action) in rows().items() if action == "drain"}
