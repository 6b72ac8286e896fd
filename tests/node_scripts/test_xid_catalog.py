"""node_scripts/xid_catalog.tsv, the Xid table node_health.sh acts on and the GPUFatalXid alert follows:
every Xid of NVIDIA's catalog is in it with NVIDIA's immediate action, and the action the health check
takes is the one that bucket calls for; the alert fires on exactly the Xids the health check drains for."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "node_scripts" / "xid_catalog.tsv"

# NVIDIA's Xid catalog, "Analyzing Xid Errors with the Xid Catalog"
# (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, Ampere and newer), column
# "Resolution Bucket (Immediate Action)", as NVIDIA ships it in machine-readable form with NVSentinel
# (github.com/NVIDIA/NVSentinel, distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv,
# Xids 1-162; the page itself names UNEXPECTED_ERR_REPORT_ISSUE "CONTACT_SUPPORT"). Each bucket's Xids:
NVIDIA_CATALOG = {
    "UNEXPECTED_ERR_REPORT_ISSUE": [*range(1, 8), 9, 10, 12, *range(15, 25), *range(26, 31), *range(33, 37), 42, 47,
                                    *range(49, 54), *range(55, 60), 61, 65, 73, 81, 87, 90, 91, 108, *range(111, 119),
                                    *range(122, 126), 138, 142],
    "RESTART_APP": [8, 11, 13, 25, 31, 32, *range(39, 42), 60, *range(68, 73), *range(75, 78), 80, *range(82, 87), 88,
                    89, 94, *range(96, 106), *range(126, 136), 139],
    "IGNORE": [14, 37, 38, 43, 44, 63, 66, 67, 92, 93, 106, 107, 121, 137, 141, 152, 153, 157, 161],
    "WORKFLOW_XID_45": [45],
    "RESET_GPU": [46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158, 162],
    "WORKFLOW_XID_48": [48],
    "CHECK_MECHANICALS": [54],
    "WORKFLOW_NVLINK_ERR": [74],
    "UPDATE_SWFW": [78],
    "RESTART_BM": [79, 160],
    "WORKFLOW_NVLINK5_ERR": [*range(144, 151)],
    "RESTART_VM": [151],
    "CHECK_UVM": [159],
    "(derived, in the message)": [154],  # GPU_RECOVERY_ACTION_CHANGED: "follow the guidance of another Xid"
}
# What a training cluster does with each bucket. pass: the node stays (the job that met it restarts);
# reset-reboot and drain: the check fails and Slurm drains the node (a GPU reset or reboot; the GPU's
# hardware); escalate: passes, until the same Xid repeats on one GPU (node_health.sh).
ACTIONS = {"RESTART_APP": "pass", "IGNORE": "pass", "CHECK_UVM": "pass",
           "WORKFLOW_XID_45": "pass",  # 45: preemptive cleanup after another error, which decides
           "RESET_GPU": "reset-reboot", "RESTART_BM": "reset-reboot", "RESTART_VM": "reset-reboot",
           "WORKFLOW_XID_48": "drain", "WORKFLOW_NVLINK_ERR": "drain", "WORKFLOW_NVLINK5_ERR": "drain",
           "CHECK_MECHANICALS": "drain", "UPDATE_SWFW": "drain",
           "UNEXPECTED_ERR_REPORT_ISSUE": "drain",  # NVIDIA cannot explain it on this GPU: not trusted
           "(derived, in the message)": "derived"}
ESCALATE = {13, 31}  # the application's fault once (restart it), the GPU's when it keeps coming back
FATAL = ("drain", "reset-reboot")


def rows() -> dict[int, tuple[str, str, str]]:
    table = {}
    for line in CATALOG.read_text().splitlines():
        if line and not line.startswith("#"):
            xid, mnemonic, nvidia, action = line.split("\t")
            assert int(xid) not in table, f"Xid {xid} twice"
            table[int(xid)] = (mnemonic, nvidia, action)
    return table


def test_the_table_holds_every_xid_of_nvidias_catalog_with_nvidias_action_and_says_its_source():
    catalog = {xid: bucket for bucket, xids in NVIDIA_CATALOG.items() for xid in xids}
    assert sorted(catalog) == list(range(1, 163))
    assert {xid: nvidia for xid, (_, nvidia, _) in rows().items()} == catalog
    header = CATALOG.read_text()
    assert "docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in header
    assert "NVIDIA/NVSentinel" in header and "xiderrorsmapping.csv" in header and "1-162" in header


def test_every_action_is_the_one_its_bucket_calls_for():
    for xid, (mnemonic, nvidia, action) in rows().items():
        expected = "escalate" if xid in ESCALATE else ACTIONS[nvidia]
        assert action == expected, (xid, mnemonic, nvidia, action)


def test_what_one_gets_wrong_most_often_is_pinned():
    table = rows()
    assert table[94][2] == table[63][2] == table[43][2] == table[45][2] == "pass"  # contained ECC, row remap recorded
    for xid in (54, 61, 48, 74):  # power cables, PMU breakpoint, double-bit ECC, NVLink: the hardware
        assert table[xid][2] == "drain", xid
    for xid in (79, 95, 119, 151, 160, 162):  # off the bus, uncontained ECC, GSP, key rotation, channel retirement
        assert table[xid][2] == "reset-reboot", xid
    assert table[13][2] == table[31][2] == "escalate"


def test_the_alert_fires_on_exactly_the_xids_the_health_check_drains_for():
    rules = yaml.safe_load((REPO / "monitoring" / "rules" / "cluster.yml").read_text())
    [rule] = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GPUFatalXid"]
    [codes] = re.findall(r'DCGM_EXP_XID_ERRORS_COUNT\{xid=~"([0-9|]+)"\}', rule["expr"])
    alerted = [int(x) for x in codes.split("|")]
    assert alerted == sorted(xid for xid, (_, _, action) in rows().items() if action in FATAL)
