"""Parsers of IOR, mdtest and fio outputs, on recorded outputs of each tool."""

import json
from pathlib import Path

import pytest

from cluster_checks.io_results import (ResultsError, fio_aggregate_mb_s, fio_aggregate_ops, load_fio_json,
                                       parse_ior_json, parse_ior_text, parse_mdtest)

FIXTURES = Path(__file__).parent / "fixtures"
MIB_TO_MB = 1.048576


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_ior_text_summary_is_converted_from_mib_to_mb():
    result = parse_ior_text(fixture("ior_4.0.0.txt"))
    assert result.write_mb_s == pytest.approx(1108.42 * MIB_TO_MB)
    assert result.read_mb_s == pytest.approx(1741.93 * MIB_TO_MB)


def test_ior_text_takes_the_mean_column_by_name_in_older_layouts():
    # IOR 3.2 has no Stonewall columns and three repetitions: Mean differs from Max and Min.
    result = parse_ior_text(fixture("ior_3.2_three_reps.txt"))
    assert result.write_mb_s == pytest.approx(145.06 * MIB_TO_MB)
    assert result.read_mb_s == pytest.approx(275.13 * MIB_TO_MB)


def test_ior_text_of_a_killed_run_says_it_did_not_finish():
    with pytest.raises(ResultsError, match="no 'Summary of all tests:' block"):
        parse_ior_text(fixture("ior_killed.txt"))


def test_ior_text_without_rows_is_an_error():
    text = fixture("ior_4.0.0.txt")
    cut = text[:text.index("write        1108.42")]
    with pytest.raises(ResultsError, match="no write or read row"):
        parse_ior_text(cut)


def test_ior_json_summary():
    result = parse_ior_json(fixture("ior_4.0.0.json"))
    assert result.write_mb_s == pytest.approx(887.5137 * MIB_TO_MB)
    assert result.read_mb_s == pytest.approx(1602.2790 * MIB_TO_MB)


def test_ior_json_write_only_run_leaves_read_unmeasured():
    document = json.loads(fixture("ior_4.0.0.json"))
    document["summary"] = [e for e in document["summary"] if e["operation"] == "write"]
    result = parse_ior_json(json.dumps(document))
    assert result.read_mb_s is None and result.write_mb_s == pytest.approx(887.5137 * MIB_TO_MB)


def test_ior_json_truncated_is_an_error():
    text = fixture("ior_4.0.0.json")
    with pytest.raises(ResultsError, match="not valid JSON"):
        parse_ior_json(text[: len(text) // 2])


def test_mdtest_4_rates_ignore_the_time_table():
    rates = parse_mdtest(fixture("mdtest_4.0.0.txt"))
    assert (rates.creates_per_s, rates.stats_per_s, rates.removes_per_s) == (9182.411, 41877.302, 13954.770)


def test_mdtest_3_rates_with_colons_use_the_mean_of_iterations():
    rates = parse_mdtest(fixture("mdtest_3.3_three_iterations.txt"))
    assert (rates.creates_per_s, rates.stats_per_s, rates.removes_per_s) == (4703.118, 29102.571, 7518.640)


def test_mdtest_without_stat_and_remove_names_the_missing_rows_and_the_flags():
    with pytest.raises(ResultsError, match=r"lacks File stat, File removal: run mdtest with -F -C -T -r"):
        parse_mdtest(fixture("mdtest_no_stat.txt"))


def test_mdtest_killed_before_summary():
    text = fixture("mdtest_4.0.0.txt")
    with pytest.raises(ResultsError, match="no 'SUMMARY rate:' table"):
        parse_mdtest(text[: text.index("SUMMARY rate")])


def _fio(phase: str) -> list[dict]:
    return [load_fio_json(p.read_text(), str(p)) for p in sorted((FIXTURES / "fio_two_nodes").glob(f"fio-{phase}-*.json"))]


def test_fio_bandwidth_is_all_bytes_over_the_slowest_node():
    # Two nodes x two jobs, 32 MiB each: 128 MiB in all. Slowest write 234 ms, slowest read 65 ms.
    assert fio_aggregate_mb_s(_fio("write"), "write") == pytest.approx(4 * 32 * 2**20 / 0.234 / 1e6)
    assert fio_aggregate_mb_s(_fio("read"), "read") == pytest.approx(4 * 32 * 2**20 / 0.065 / 1e6)


def test_fio_metadata_rates_are_all_files_over_the_slowest_node():
    # 2 nodes x 2 jobs x 200 files; slowest create 7 ms, stat 6 ms, remove 7 ms.
    assert fio_aggregate_ops(_fio("create")) == pytest.approx(800 / 0.007)
    assert fio_aggregate_ops(_fio("stat")) == pytest.approx(800 / 0.006)
    assert fio_aggregate_ops(_fio("remove")) == pytest.approx(800 / 0.007)


def test_fio_asked_for_a_direction_it_did_not_do():
    with pytest.raises(ResultsError, match="no read I/O"):
        fio_aggregate_mb_s(_fio("write"), "read")


def test_fio_json_after_notes_is_found():
    text = "note: both iodepth >= 1 and synchronous I/O engine are selected\n" + \
        (FIXTURES / "fio_two_nodes" / "fio-write-0.json").read_text()
    assert load_fio_json(text)["jobs"][0]["jobname"] == "seq"


def test_fio_job_error_is_reported_with_its_errno():
    with pytest.raises(ResultsError, match=r"fio job 'md' failed with errno 2"):
        load_fio_json(fixture("fio_stat_missing_files.json"), "stat")


def test_fio_truncated_output():
    text = (FIXTURES / "fio_two_nodes" / "fio-read-1.json").read_text()
    with pytest.raises(ResultsError, match="truncated or invalid JSON"):
        load_fio_json(text[:500], "fio-read-1.json")
    with pytest.raises(ResultsError, match="no JSON document"):
        load_fio_json("", "fio-read-1.json")
