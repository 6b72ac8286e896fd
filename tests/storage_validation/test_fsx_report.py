"""The FSx summary: comparison with provisioned throughput, flags, table, exit code."""

import json

import pytest

from cluster_checks.fsx_report import (BELOW, FAILED, MISSING, NOT_COMPARED, OK, MountResult, assess, exit_code,
                                       parse_expectations, render_table, to_json)
from cluster_config.hardware import fsx_expectations
from cluster_config.settings import load_settings


def measured(mount="/fsx/data", write=900.0, read=1500.0) -> MountResult:
    return MountResult(mount=mount, fs_type="lustre", tool="ior+mdtest", write_mb_s=write, read_mb_s=read,
                       creates_per_s=9000.0, stats_per_s=40000.0, removes_per_s=14000.0)


def test_expectations_accept_commas_and_spaces():
    assert parse_expectations("/fsx/data=7031, /fsx/logs/=2343.75 /fsx/checkpoints=1") == {
        "/fsx/data": 7031.0, "/fsx/logs": 2343.75, "/fsx/checkpoints": 1.0}
    assert parse_expectations("") == {}


@pytest.mark.parametrize("spec", ["/fsx/data", "/fsx/data=fast", "fsx/data=100", "/fsx/data=0"])
def test_bad_expectation_names_the_variable_and_the_format(spec):
    with pytest.raises(ValueError, match=r"FSX_EXPECTED_MB_S: .* is not MOUNT=MB/s; write e.g. /fsx/data="):
        parse_expectations(spec)


def test_expectations_built_from_the_settings_parse_back():
    # `python -m cluster_config fsx-expected --env dev` prints this (docs/storage_validation.md).
    expected = parse_expectations(fsx_expectations(load_settings("dev")))
    # dev: 1200 GiB at 125 MB/s/TiB = 146.5 MB/s per file system
    assert expected == {"/fsx/data": 146.5, "/fsx/checkpoints": 146.5, "/fsx/logs": 146.5}


def test_ratios_and_ok_status_above_threshold():
    result = assess(measured(write=900, read=1500), 1000.0, min_ratio=0.8)
    assert (result.write_ratio, result.read_ratio, result.status) == (0.9, 1.5, OK)
    assert result.notes == []


def test_a_mount_below_threshold_is_flagged_with_what_to_check():
    result = assess(measured(write=700, read=1500), 1000.0, min_ratio=0.8)
    assert result.status == BELOW
    assert "below 80% of the provisioned 1,000 MB/s" in result.notes[0]
    assert "more nodes or tasks per node" in result.notes[0]


def test_no_expectation_means_not_compared():
    result = assess(measured(), None, min_ratio=0.8)
    assert (result.status, result.write_ratio, result.provisioned_mb_s) == (NOT_COMPARED, None, None)


def test_failed_and_missing_mounts_keep_their_status():
    missing = assess(MountResult(mount="/fsx4", status=MISSING), 1000.0, 0.8)
    failed = assess(MountResult(mount="/fsx/logs", status=FAILED), 1000.0, 0.8)
    assert (missing.status, failed.status, missing.write_ratio) == (MISSING, FAILED, None)


def test_exit_code_follows_the_worst_mount():
    ok = assess(measured(), 1000.0, 0.8)
    below = assess(measured(mount="/fsx/logs", write=10), 1000.0, 0.8)
    assert exit_code([ok]) == 0
    assert exit_code([ok, assess(measured(), None, 0.8)]) == 0
    assert exit_code([ok, below]) == 1
    assert exit_code([ok, MountResult(mount="/fsx3", status=FAILED)]) == 1
    assert exit_code([below, MountResult(mount="/fsx4", status=MISSING)]) == 2
    assert exit_code([]) == 2


def test_table_shows_gb_s_ratios_status_and_notes():
    rows = [assess(measured(write=900, read=1500), 1000.0, 0.8),
            assess(measured(mount="/fsx/logs", write=100, read=120), 1000.0, 0.8)]
    table = render_table(rows, "FSx performance")
    lines = table.splitlines()
    assert lines[0] == "FSx performance"
    assert lines[1].split()[:5] == ["mount", "fs", "tool", "write", "GB/s"]
    data = lines[2].split()
    assert data[:5] == ["/fsx/data", "lustre", "ior+mdtest", "0.900", "1.500"]
    assert data[5:] == ["9,000", "40,000", "14,000", "1.000", "0.90", "1.50", "ok"]
    assert lines[3].split()[-3:] == ["0.10", "0.12", "BELOW"]
    assert lines[4].startswith("  /fsx/logs: below 80%")


def test_json_holds_every_mount_and_the_context():
    document = json.loads(to_json([assess(measured(), 1000.0, 0.8)], job="42", nodes=2))
    assert document["job"] == "42" and document["nodes"] == 2
    assert document["mounts"][0]["mount"] == "/fsx/data"
    assert document["mounts"][0]["read_ratio"] == 1.5
