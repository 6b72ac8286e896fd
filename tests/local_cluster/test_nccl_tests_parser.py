"""nccl-tests output parsing and the EFA transport check, on recorded output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster_checks import nccl_tests
from cluster_checks.results import COLLECTIVES

FIXTURES = Path(__file__).parent / "fixtures"
EFA_LOG = FIXTURES / "nccl_tests_efa.log"
SOCKET_LOG = FIXTURES / "nccl_tests_socket.log"


def test_efa_run_parses_all_six_collectives():
    rows, text = nccl_tests.parse_logs([EFA_LOG])
    assert [c for c in dict.fromkeys(r.collective for r in rows)] == list(COLLECTIVES)
    assert len(rows) == 36 and all(r.world_size == 16 and r.correct for r in rows)
    first = rows[0]  # out-of-place columns of the first all_reduce line
    assert (first.size_bytes, first.count, first.time_us, first.algbw_gbps, first.busbw_gbps) == (
        1048576, 262144, 62.81, 16.69, 31.30)
    assert nccl_tests.check_transport(text).ok


def test_efa_run_passes_and_writes_table_csv_json_plot(tmp_path, capsys):
    assert nccl_tests.main([str(EFA_LOG), "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "transport: EFA: NCCL network Libfabric, libfabric provider efa" in out
    assert "all_to_all          1 GiB" in out
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["transport_ok"] is True and len(data["results"]) == 36
    assert (tmp_path / "busbw.png").stat().st_size > 0 and (tmp_path / "results.csv").exists()


def test_socket_fallback_fails_with_a_clear_message(tmp_path, capsys):
    assert nccl_tests.main([str(SOCKET_LOG), "--out-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "NCCL fell back to TCP sockets (NET/Socket), not EFA" in err
    assert json.loads((tmp_path / "results.json").read_text())["transport_ok"] is False


@pytest.mark.parametrize("log, message", [
    ("", "no 'NCCL INFO Using network' line. Run with NCCL_DEBUG=INFO"),
    ("h:1:1 [0] NCCL INFO Using network IB\n", "NCCL used network IB, not the aws-ofi-nccl"),
    ("h:1:1 [0] NCCL INFO Using network Libfabric\nh:1:1 [0] NCCL INFO NET/OFI Selected provider is tcp, "
     "fabric is tcp (found 1 nics)\n", "libfabric provider is tcp, not efa"),
])
def test_transport_check_rejects_anything_but_efa(log, message):
    verdict = nccl_tests.check_transport(log)
    assert not verdict.ok and message in verdict.message


def test_wrong_results_fail_the_run(tmp_path, capsys):
    text = EFA_LOG.read_text().replace(
        "    1048576        262144     float     sum      -1    62.81   16.69   31.30      0",
        "    1048576        262144     float     sum      -1    62.81   16.69   31.30      3", 1)
    log = tmp_path / "wrong.log"
    log.write_text(text)
    assert nccl_tests.main([str(log), "--out-dir", str(tmp_path / "out")]) == 1
    assert "wrong results in all_reduce" in capsys.readouterr().err


def test_log_named_after_its_binary_needs_no_start_marker(tmp_path):
    section = SOCKET_LOG.read_text().replace("# Collective test starting: all_reduce_perf\n", "")
    (tmp_path / "all_reduce_perf.log").write_text(section)
    rows, _ = nccl_tests.parse_logs([tmp_path / "all_reduce_perf.log"])
    assert {r.collective for r in rows} == {"all_reduce"} and len(rows) == 6


@pytest.mark.parametrize("name, text, message", [
    ("mystery.log", "#  Rank  0 Group  0 Pid 1 on h device 0\n", "does not name an nccl-tests binary"),
    ("all_reduce_perf.log", "srun: error: task 3 launch failed\n", "no '#  Rank N Group ...' lines"),
    ("all_reduce_perf.log", "#  Rank  0 Group  0 Pid 1 on h device 0\nsegfault\n", "no result lines"),
])
def test_unreadable_logs_fail_naming_the_file(tmp_path, capsys, name, text, message):
    (tmp_path / name).write_text(text)
    assert nccl_tests.main([str(tmp_path / name), "--out-dir", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert name in err and message in err
