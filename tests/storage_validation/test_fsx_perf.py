"""The FSx measurement driver: commands, fio jobfiles run by the real fio, collecting raw outputs."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cluster_checks import fsx_perf
from cluster_checks.fsx_report import FAILED, MISSING, MountResult
from cluster_checks.io_results import ResultsError

FIXTURES = Path(__file__).parent / "fixtures"

MOUNTS = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
/dev/nvme0n1p1 / xfs rw,noatime 0 0
10.0.1.23@tcp:/abcdefgh /fsx/data lustre rw,flock,lazystatfs 0 0
10.0.1.24@tcp:/ijklmnop /fsx/data\\040set lustre rw,flock 0 0
"""


def test_parse_size():
    assert fsx_perf.parse_size("16m") == 16 * 2**20
    assert fsx_perf.parse_size("16G") == 16 * 2**30
    assert fsx_perf.parse_size("4096") == 4096
    with pytest.raises(ValueError, match="'lots' is not a size; write e.g. 16m"):
        fsx_perf.parse_size("lots")


def test_fs_type_comes_from_the_longest_mount_point():
    assert fsx_perf.mount_fs_type("/fsx/data/sub", MOUNTS) == "lustre"
    assert fsx_perf.mount_fs_type("/fsx/database", MOUNTS) == "xfs"  # a prefix of the name is not a parent
    assert fsx_perf.mount_fs_type("/fsx/data set", MOUNTS) == "lustre"
    assert fsx_perf.mount_fs_type("/home", MOUNTS) == "xfs"


def test_ior_command_is_file_per_process_with_cross_node_reads():
    command = fsx_perf.ior_command(["srun", "--mpi=pmix"], "/opt/ior/bin/ior", Path("/fsx/data/.w"),
                                   Path("/out/raw"), "16m", "16g", 120)
    text = " ".join(command)
    assert command[:3] == ["srun", "--mpi=pmix", "/opt/ior/bin/ior"]
    for flag in ("-a POSIX", "-w -r", "-F", "-C", "-e", "-t 16m -b 16g", "-D 120",
                 "-o /fsx/data/.w/ior/data", "summaryFormat=JSON", "summaryFile=/out/raw/ior.json"):
        assert flag in text


def test_mdtest_command_stats_the_next_nodes_files():
    command = fsx_perf.mdtest_command(["srun"], "mdtest", Path("/fsx/data/.w"), 1000, 8)
    assert " ".join(command) == "srun mdtest -F -C -T -r -u -N 8 -n 1000 -i 1 -d /fsx/data/.w/mdtest"


def test_fio_reads_and_stats_the_next_nodes_files_and_writes_its_own():
    jobs = {phase: fsx_perf.fio_jobfile(phase, Path("/w"), tasks_per_node=8, xfer="16m", block="16g",
                                        seconds=120, files_per_task=1000) for phase in fsx_perf.FIO_PHASES}
    for phase in ("read", "stat"):
        assert "filename_format=node${FSX_PERF_PEER}.$jobname.$jobnum.$filenum" in jobs[phase]
    for phase in ("write", "create", "remove"):
        assert "filename_format=node${FSX_PERF_SELF}." in jobs[phase]
    assert "size=16g" in jobs["write"] and "end_fsync=1" in jobs["write"]
    assert "size=" not in jobs["read"]  # reads whatever the write phase wrote
    assert "ioengine=filestat" in jobs["stat"] and "nrfiles=1000" in jobs["stat"]


def run_fio_phases(work: Path, raw: Path, **sizes) -> None:
    """What the job's srun steps do on each node, here for one node (node index 0, its own peer)."""
    (work / "seq").mkdir(parents=True)
    (work / "md").mkdir()
    raw.mkdir(parents=True)
    env = {**os.environ, "FSX_PERF_SELF": "0", "FSX_PERF_PEER": "0"}
    for phase in fsx_perf.FIO_PHASES:
        jobfile = raw / f"fio-{phase}.fio"
        jobfile.write_text(fsx_perf.fio_jobfile(phase, work, **sizes))
        with (raw / f"fio-{phase}-0.json").open("w") as out:
            subprocess.run(["fio", "--output-format=json", str(jobfile)], stdout=out, env=env, check=True)


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (apt-get install fio)")
def test_fio_jobfiles_run_and_their_results_collect(tmp_path):
    work, raw = tmp_path / "mount" / ".fsx_perf" / "1", tmp_path / "raw"
    run_fio_phases(work, raw, tasks_per_node=2, xfer="1m", block="8m", seconds=30, files_per_task=300)
    result = fsx_perf.collect(raw, MountResult(mount=str(tmp_path)))
    assert result.tool == "fio"
    figures = (result.write_mb_s, result.read_mb_s, result.creates_per_s, result.stats_per_s, result.removes_per_s)
    assert all(value > 0 for value in figures), figures
    written = json.loads((raw / "fio-write-0.json").read_text())["jobs"][0]["write"]["io_bytes"]
    read = json.loads((raw / "fio-read-0.json").read_text())["jobs"][0]["read"]["io_bytes"]
    assert written == read == 2 * 8 * 2**20
    assert list((work / "md").iterdir()) == []  # the remove phase deleted every file it created


def test_collect_ior_and_mdtest_outputs(tmp_path):
    shutil.copy(FIXTURES / "ior_4.0.0.json", tmp_path / "ior.json")
    shutil.copy(FIXTURES / "mdtest_4.0.0.txt", tmp_path / "mdtest.txt")
    result = fsx_perf.collect(tmp_path, MountResult(mount="/fsx/data"))
    assert result.tool == "ior+mdtest"
    assert round(result.write_mb_s, 1) == 930.6 and round(result.read_mb_s, 1) == 1680.1
    assert result.creates_per_s == 9182.411


def test_collect_falls_back_to_ior_text_when_the_json_is_empty(tmp_path):
    (tmp_path / "ior.json").write_text("")
    shutil.copy(FIXTURES / "ior_4.0.0.txt", tmp_path / "ior.txt")
    shutil.copy(FIXTURES / "mdtest_4.0.0.txt", tmp_path / "mdtest.txt")
    assert round(fsx_perf.collect(tmp_path, MountResult(mount="/fsx/data")).write_mb_s, 1) == 1162.3


def test_collect_without_mdtest_output_says_it_did_not_run(tmp_path):
    shutil.copy(FIXTURES / "ior_4.0.0.txt", tmp_path / "ior.txt")
    with pytest.raises(ResultsError, match="mdtest.txt is missing: the tool did not run"):
        fsx_perf.collect(tmp_path, MountResult(mount="/fsx/data"))


def test_collect_with_nothing_names_what_it_looked_for(tmp_path):
    with pytest.raises(ResultsError, match=r"neither IOR output \(ior.json, ior.txt\) nor fio write results"):
        fsx_perf.collect(tmp_path, MountResult(mount="/fsx/data"))


def test_missing_mount_and_too_little_space_are_reported_without_running_anything(tmp_path, capsys):
    out = tmp_path / "report"
    code = fsx_perf.main([str(tmp_path / "fsx4"), str(tmp_path), "--out", str(out), "--tool", "fio",
                          "--nodes", "2", "--tasks-per-node", "8", "--block", "1000t"])
    assert code == 2  # a mount that does not exist is bad input (docs/cli.md)
    document = json.loads((out / "summary.json").read_text())
    missing, full = document["mounts"]
    assert missing["status"] == MISSING and "does not exist on" in missing["notes"][0]
    assert full["status"] == FAILED and "lower FSX_PERF_BLOCK" in full["notes"][-1]
    assert full["notes"][-1].startswith("the test writes 16,384,000.0 GiB")  # 2 x 8 x 1000 TiB
    printed = capsys.readouterr().out
    assert "no provisioned throughput given (FSX_EXPECTED_MB_S): nothing compared" in printed
    assert (out / "summary.txt").read_text() in printed


def test_bad_expectation_stops_before_measuring(tmp_path, capsys):
    with pytest.raises(SystemExit):
        fsx_perf.main([str(tmp_path), "--out", str(tmp_path / "o"), "--tool", "fio", "--expect", "/fsx/data"])
    assert "FSX_EXPECTED_MB_S: '/fsx/data' is not MOUNT=MB/s" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
