"""The acceptance report (cluster_checks.acceptance, from the node, network, storage, layout and drill
checks): checks from recorded results, the go / no-go rule, report.json, the table and the PNG. No Slurm,
no GPU.

Fixtures:
- nccl-tests logs recorded on 2 x p5.48xlarge (tests/local_cluster/fixtures): over EFA, and fallen back
  to TCP sockets;
- ``fixtures/nccl_tests_nvlink.log``: one node's 8 GPUs, written by hand in nccl-tests' format with
  the published NVLink SHARP figure (~470 GB/s busbw at 1 GiB, NVIDIA/nccl-tests#212): no recorded
  single-node run exists yet;
- the FSx summary, built by fsx_perf/fsx_report from recorded IOR, mdtest and fio outputs
  (tests/storage_validation/fixtures);
- ``fixtures/gpu_go``: expected.json, node records and two layouts' numbers in the format
  jobs/acceptance.sh writes, with values a healthy p5e run gives (example values, not a recording);
- ``fixtures/pytorch_nccl``: the trainer's own NCCL (a torch wheel's) at NCCL_DEBUG=INFO,
  NCCL_DEBUG_SUBSYS=INIT,NET, one file per rank as NCCL_DEBUG_FILE writes them: ranks 0 and 8 over
  the aws-ofi-nccl plugin on EFA (``efa/``), and rank 8 of a node where it found no plugin (``socket/``).
  Excerpts written by hand in the format of the recorded nccl-tests logs: no GPU run recorded them.
"""

from __future__ import annotations

import json
import os
import math
import re
import shutil
from pathlib import Path

import pytest

from cluster_checks import acceptance as acc
from cluster_checks import nccl_tests, network_checks, node_checks
from cluster_checks.acceptance_report import write_report
from cluster_checks.drill import drill_checks, drill_overrides, stall_detected
from cluster_checks.fsx_perf import collect
from cluster_checks.fsx_report import MountResult, assess, to_json
from cluster_checks.layout_checks import peak_memory
from cluster_checks.verdict import FAIL, GO, NO_GO, NOT_MEASURED, PASS, Check, Report
from training.config import load_config

HERE = Path(__file__).parent
REPO = HERE.parents[1]
ACCEPTANCE_SH = REPO / "jobs" / "acceptance.sh"
FIXTURES = HERE / "fixtures"
NCCL_LOGS = HERE.parent / "local_cluster" / "fixtures"
STORAGE = HERE.parent / "storage_validation" / "fixtures"

EFA_LOG, SOCKET_LOG, NVLINK_LOG = NCCL_LOGS / "nccl_tests_efa.log", NCCL_LOGS / "nccl_tests_socket.log", \
    FIXTURES / "nccl_tests_nvlink.log"
PYTORCH_NCCL = FIXTURES / "pytorch_nccl"

GPU_CATALOGUE = [
    node_checks.QUEUES, node_checks.VENV, node_checks.HEALTH, node_checks.DRIVER, node_checks.ECC,
    network_checks.INTER_NODE, network_checks.INTRA_NODE, network_checks.TRANSPORT, network_checks.TCP_CONTROL, network_checks.PYTORCH_TRANSPORT,
    "storage: /fsx/data read/write vs provisioned", "storage: /fsx/checkpoints read/write vs provisioned",
    *[f"layout {m}: {what}" for m in ("model1", "model7") for what in (
        "run completes", "init std per parameter", "no two parameters/shards equal", "loss finite and decreasing",
        "grad norm finite", "peak GPU memory vs dry run", "MFU vs plan", "compiled vs eager losses")],
    "drill: killed rank recovers, losses bit-identical", "drill: stalled rank detected",
]


def storage_summary(raw: Path) -> str:
    """summary.json as fsx_perf writes it: /fsx/data measured by IOR + mdtest, /fsx/checkpoints by fio."""
    ior = raw / "data"
    ior.mkdir(parents=True)
    shutil.copy(STORAGE / "ior_4.0.0.json", ior / "ior.json")
    shutil.copy(STORAGE / "mdtest_4.0.0.txt", ior / "mdtest.txt")
    data = assess(collect(ior, MountResult("/fsx/data", fs_type="lustre")), 1000.0, 0.8)  # 0.93 write, 1.68 read
    checkpoints = assess(collect(STORAGE / "fio_two_nodes", MountResult("/fsx/checkpoints", fs_type="lustre")),
                         600.0, 0.8)  # 0.96 write, 3.4 read
    return to_json([data, checkpoints], job="4242", min_ratio=0.8, notes=[])


@pytest.fixture
def results(tmp_path) -> Path:
    """A GPU cluster's results folder that is a go."""
    folder = tmp_path / "4242"
    shutil.copytree(FIXTURES / "gpu_go", folder)
    for part, log in (("inter_node", EFA_LOG), ("intra_node", NVLINK_LOG), ("tcp_control", SOCKET_LOG)):
        (folder / "nccl" / part).mkdir(parents=True)
        shutil.copy(log, folder / "nccl" / part / "all_reduce_perf.log")
    shutil.copytree(PYTORCH_NCCL / "efa", folder / "nccl" / "pytorch")
    (folder / "storage").mkdir()
    (folder / "storage" / "summary.json").write_text(storage_summary(tmp_path / "raw"))
    return folder


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def by_name(report: Report) -> dict[str, Check]:
    return {c.name: c for c in report.checks}


def blocking(report: Report) -> list[str]:
    return [c.name for c in report.blocking()]


# --- a go, and what it writes ----------------------------------------------------------------------

def test_a_healthy_gpu_run_is_a_go_with_every_check_passed(results):
    report = acc.assemble(results)
    assert [c.name for c in report.checks] == GPU_CATALOGUE
    assert [c.name for c in report.checks if c.status != PASS] == []
    assert report.verdict == GO and report.gpu
    checks = by_name(report)
    inter = checks[network_checks.INTER_NODE]
    assert inter.measured == "381.9 GB/s busbw at 1 GiB, 16 ranks on 2 nodes"
    assert inter.expected == ">= 349.6 GB/s busbw at 1 GiB (80% of the published 436.95)"
    assert inter.ratio == pytest.approx(381.90 / 436.95) and inter.limit == 0.8
    assert "awesome" not in inter.source and "awsome-distributed-training" in inter.source
    assert checks[network_checks.INTRA_NODE].measured == "467.3 GB/s busbw at 1 GiB, 8 GPUs on ip-10-1-40-17"
    assert checks[network_checks.INTRA_NODE].expected.startswith(">= 360 GB/s busbw")
    assert checks[network_checks.TRANSPORT].measured == "EFA: NCCL network Libfabric, libfabric provider efa"
    assert checks[network_checks.TCP_CONTROL].measured == "refused: NCCL fell back to TCP sockets (NET/Socket), not EFA"
    assert checks[network_checks.PYTORCH_TRANSPORT].measured == "EFA: NCCL network Libfabric, libfabric provider efa"
    assert checks["storage: /fsx/data read/write vs provisioned"].measured == \
        "write 0.931 GB/s, read 1.680 GB/s (ior+mdtest)"
    assert checks["layout model7: MFU vs plan"].measured == "29.3% (290 tokens/s per GPU)"
    assert checks[node_checks.QUEUES].measured == "gpu 2, cpu 1"
    assert all(c.source for c in report.checks), "every threshold names its source"


def test_the_report_command_writes_json_table_and_png_and_exits_0_on_go(results, capsys):
    assert acc.main(["report", str(results)]) == 0
    out = capsys.readouterr().out
    document = json.loads((results / "report.json").read_text())
    assert document["verdict"] == "go" and document["job"] == "4242" and document["blocking"] == []
    for check in document["checks"]:
        assert {"name", "status", "measured", "expected", "why", "source"} <= set(check)
        assert check["status"] in ("pass", "fail", "not measured")
    table = (results / "report.txt").read_text()
    assert table == out.split("report: ")[0]
    assert table.startswith("acceptance: GO (GPU cluster)\n")
    assert "pass    network: all_reduce across 2 nodes (EFA)" in table
    assert "\n  aws-samples/awsome-distributed-training micro-benchmarks" in table.split("\nsources:\n")[1]
    png = (results / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_the_report_can_go_to_another_folder(results, tmp_path):
    assert acc.main(["report", str(results), "--out", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.json", "report.png", "report.txt"]


# --- no-go, each for its reason --------------------------------------------------------------------

def test_a_slow_inter_node_all_reduce_is_a_no_go_naming_the_figure(results, capsys):
    log = results / "nccl" / "inter_node" / "all_reduce_perf.log"
    slow = "  1073741824     268435456     float     sum      -1  6710.89  160.00  300.00      0"
    log.write_text(log.read_text().replace(
        "  1073741824     268435456     float     sum      -1  5271.71  203.68  381.90      0", slow, 1))
    assert acc.main(["report", str(results)]) == 1
    report = acc.assemble(results)
    assert blocking(report) == [network_checks.INTER_NODE]
    check = by_name(report)[network_checks.INTER_NODE]
    assert check.status == FAIL and check.measured.startswith("300.0 GB/s busbw at 1 GiB")
    assert check.why.startswith("69% of the published figure: first rerun jobs/validate_gpu_efa.sh")
    err = capsys.readouterr().err
    assert f"problem: {network_checks.INTER_NODE}: fail: 69% of the published figure" in err
    assert json.loads((results / "report.json").read_text())["verdict"] == "no-go"


def test_a_tcp_fallback_is_a_no_go(results):
    shutil.copy(SOCKET_LOG, results / "nccl" / "inter_node" / "all_reduce_perf.log")
    report = acc.assemble(results)
    assert report.verdict == NO_GO and blocking(report) == [network_checks.INTER_NODE, network_checks.TRANSPORT]
    transport = by_name(report)[network_checks.TRANSPORT]
    assert transport.measured == "NCCL fell back to TCP sockets (NET/Socket), not EFA"
    assert "aws-ofi-nccl plugin was not loaded" in transport.why and "LD_LIBRARY_PATH" in transport.why
    assert by_name(report)[network_checks.INTER_NODE].measured.startswith("2.5 GB/s")


def test_a_tcp_control_run_that_is_not_refused_is_a_no_go(results):
    shutil.copy(EFA_LOG, results / "nccl" / "tcp_control" / "all_reduce_perf.log")  # NCCL_NET=Socket did not apply
    report = acc.assemble(results)
    assert blocking(report) == [network_checks.TCP_CONTROL]
    assert by_name(report)[network_checks.TCP_CONTROL].measured == "accepted"
    assert "NCCL_NET=Socket did not reach the ranks" in by_name(report)[network_checks.TCP_CONTROL].why


def test_pytorch_s_nccl_on_sockets_is_a_no_go_though_nccl_tests_used_efa(results):
    """One node's torch NCCL found no plugin: the system NCCL of nccl-tests did, and its check passes."""
    shutil.copy(PYTORCH_NCCL / "socket" / "ip-10-1-51-72.40977.log", results / "nccl" / "pytorch")
    report = acc.assemble(results)
    assert blocking(report) == [network_checks.PYTORCH_TRANSPORT] and by_name(report)[network_checks.TRANSPORT].status == PASS
    check = by_name(report)[network_checks.PYTORCH_TRANSPORT]
    assert check.status == FAIL and check.measured == "NCCL fell back to TCP sockets (NET/Socket), not EFA"
    assert "LD_LIBRARY_PATH" in check.why and "torch.cuda.nccl.version()" in check.why


@pytest.mark.parametrize("lines, status", [
    # older aws-ofi-nccl releases named their network "AWS Libfabric" and wrote "Selected Provider"
    (["NET/OFI Selected Provider is efa (found 32 nics)", "Using network AWS Libfabric"], PASS),
    (["NET/Socket : Using [0]eth0:10.1.34.183<0>", "Using network Socket"], FAIL),
    (["NET/OFI Selected provider is tcp, fabric is 10.1.0.0/16 (found 1 nics)", "Using network Libfabric"], FAIL),
    (["NCCL version 2.27.5+cuda12.9"], FAIL),  # no network line: cannot tell, never a pass
])
def test_pytorch_s_nccl_transport_reads_the_same_lines_as_nccl_tests(tmp_path, lines, status):
    log = "".join(f"gpu-1:4242:4300 [0] NCCL INFO {line}\n" for line in lines)
    (tmp_path / "gpu-1.4242.log").write_text(log)
    check = network_checks.pytorch_transport(tmp_path)
    verdict = nccl_tests.check_transport(log)  # one parser for both NCCLs
    assert check.status == status and check.needs_gpu
    assert check.measured == (verdict.message if verdict.ok else verdict.message.split(":")[0])


def test_pytorch_s_nccl_without_its_log_is_not_measured_and_blocks(results):
    shutil.rmtree(results / "nccl" / "pytorch")
    report = acc.assemble(results)
    assert blocking(report) == [network_checks.PYTORCH_TRANSPORT]
    check = by_name(report)[network_checks.PYTORCH_TRANSPORT]
    assert check.status == NOT_MEASURED and "NCCL_DEBUG_FILE" in check.why


def test_an_out_of_memory_layout_run_is_a_no_go(results):
    edit_json(results / "layouts" / "model7.json", oom=True, peak_memory_gib=None, losses=None, grad_norms=None)
    report = acc.assemble(results)
    assert report.verdict == NO_GO
    checks = by_name(report)
    memory = checks["layout model7: peak GPU memory vs dry run"]
    assert memory.status == FAIL and memory.measured == "out of memory"
    assert "lower train.micro_batch_size" in memory.why
    assert checks["layout model7: run completes"].status == FAIL
    assert checks["layout model7: loss finite and decreasing"].why == \
        "fewer than 2 losses recorded (the run failed: out of memory)"
    assert not [n for n in blocking(report) if n.startswith("layout model1")]


def test_duplicated_shards_at_initialisation_are_a_no_go(results):
    edit_json(results / "layouts" / "model7.json", duplicate_hashes=2)
    report = acc.assemble(results)
    assert blocking(report) == ["layout model7: no two parameters/shards equal"]
    check = by_name(report)["layout model7: no two parameters/shards equal"]
    assert check.measured == "2 duplicate hash(es)" and "same generator state" in check.why


def test_on_a_gpu_cluster_a_gpu_check_not_measured_is_a_no_go(results):
    edit_json(results / "layouts" / "model7.json", compiled_losses=None)
    report = acc.assemble(results)
    check = by_name(report)["layout model7: compiled vs eager losses"]
    assert check.status == NOT_MEASURED and check.needs_gpu
    assert report.verdict == NO_GO and blocking(report) == [check.name]


def test_a_missing_nccl_step_is_not_measured_and_blocks(results):
    shutil.rmtree(results / "nccl" / "inter_node")
    report = acc.assemble(results)
    assert blocking(report) == [network_checks.INTER_NODE, network_checks.TRANSPORT]
    assert all(by_name(report)[n].status == NOT_MEASURED for n in blocking(report))


def test_a_missing_layout_run_is_reported_not_skipped(results):
    (results / "layouts" / "model1.json").unlink()
    report = acc.assemble(results)
    assert [c.name for c in report.checks] == GPU_CATALOGUE
    run = by_name(report)["layout model1: run completes"]
    assert run.status == FAIL and "no layouts/model1.json" in run.why


@pytest.mark.parametrize("part, file, changes, name, why", [
    ("nodes", "gpu-dy-p5e-2", {"health_rc": 1, "health_output": "checking\nfatal NVIDIA Xid 79 in the kernel log"},
     node_checks.HEALTH, "gpu-dy-p5e-2: fatal NVIDIA Xid 79 in the kernel log: the prolog drains"),
    ("nodes", "gpu-dy-p5e-1", {"driver_cuda": "12.2"}, node_checks.DRIVER, "gpu-dy-p5e-1: the driver is older"),
    ("nodes", "gpu-dy-p5e-1", {"ecc_uncorrected": 3, "row_remap_pending": True}, node_checks.ECC,
     "gpu-dy-p5e-1: 3 uncorrectable, row remap pending"),
    ("nodes", "cpu-dy-c7i-1", {"venv_ok": False, "venv_detail": "libcudart.so.12: cannot open"}, node_checks.VENV,
     "cpu-dy-c7i-1 (cpu): libcudart.so.12: cannot open"),
    ("layouts", "model1", {"losses": [10.4, 10.5, 10.6, 10.7]}, "layout model1: loss finite and decreasing",
     "the loss does not fall"),
    ("layouts", "model1", {"grad_norms": [3.0, "NaN"]}, "layout model1: grad norm finite", "a NaN/inf or zero"),
    ("layouts", "model1", {"peak_memory_gib": 50.0}, "layout model1: peak GPU memory vs dry run",
     "the dry run is 16% under"),
    ("layouts", "model1", {"tokens_per_s_per_gpu": 2000.0}, "layout model1: MFU vs plan", "59% of the plan"),
    ("layouts", "model1", {"init_std": {"model.layers.0.mlp.down_proj.weight": [0.02, 0.0025]}},
     "layout model1: init std per parameter", "1 parameter(s) off"),
    ("layouts", "model1", {"eager_losses": [10.41, 10.12, 9.63, 9.05, 8.51, 8.02, 7.66, 8.0]},
     "layout model1: compiled vs eager losses", "compiled layers compute something else"),
    ("drill", "drill", {"resumed_losses": {"5": 8.51, "6": 8.020001, "7": 7.66, "8": 7.41}},
     "drill: killed rank recovers, losses bit-identical", "1 of 4 steps differ (first: step 6) on the same data"),
    ("drill", "drill", {"resumed_samples": {"5": 2863217746, "6": 1093447118, "7": 1, "8": 2}},
     "drill: killed rank recovers, losses bit-identical", "the data differs from step 7 (samples_crc)"),
    ("drill", "drill", {"recovered": False}, "drill: killed rank recovers, losses bit-identical",
     "did not resume on its own"),
    ("drill", "drill", {"stall_detected_s": None}, "drill: stalled rank detected", "left the job hanging"),
    ("drill", "drill", {"stall_detected_s": 400.0}, "drill: stalled rank detected", "noticed later"),
])
def test_each_failure_blocks_alone_and_says_what_to_do(results, part, file, changes, name, why):
    path = results / part / f"{file}.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, **changes}).replace('"NaN"', "NaN"))
    report = acc.assemble(results)
    assert blocking(report) == [name]
    assert by_name(report)[name].status == FAIL and why in by_name(report)[name].why


def test_a_queue_short_of_nodes_and_a_storage_mount_below_provisioned_block(results):
    (results / "nodes" / "cpu-dy-c7i-1.json").unlink()
    summary = json.loads((results / "storage" / "summary.json").read_text())
    data = next(m for m in summary["mounts"] if m["mount"] == "/fsx/data")
    result = assess(MountResult(**{**data, "status": "not compared", "notes": []}), 2000.0, 0.8)  # 0.47 write
    summary["mounts"] = [{**m, **(vars(result) if m["mount"] == "/fsx/data" else {})} for m in summary["mounts"]]
    (results / "storage" / "summary.json").write_text(json.dumps(summary))
    report = acc.assemble(results)
    assert blocking(report) == [node_checks.QUEUES, "storage: /fsx/data read/write vs provisioned"]
    assert "cpu (0 of 1)" in by_name(report)[node_checks.QUEUES].why
    storage = by_name(report)["storage: /fsx/data read/write vs provisioned"]
    assert "below 80% of the provisioned 2,000 MB/s" in storage.why and storage.ratio == pytest.approx(0.465, abs=1e-3)


@pytest.mark.parametrize("log, why", [
    (EFA_LOG, "ran on 2 node(s)"),  # the NVLink check must not be fed a 2-node run
    (None, "no *_perf.log in"),
])
def test_the_nvlink_check_needs_a_one_node_run(results, log, why):
    target = results / "nccl" / "intra_node" / "all_reduce_perf.log"
    if log:
        shutil.copy(log, target)
    else:
        target.unlink()
    check = by_name(acc.assemble(results))[network_checks.INTRA_NODE]
    assert check.status != PASS and why in check.why


def test_a_run_on_fewer_than_8_gpus_per_node_is_not_compared(results):
    log = results / "nccl" / "intra_node" / "all_reduce_perf.log"
    log.write_text("\n".join(line for line in log.read_text().splitlines()
                             if not line.startswith(("#  Rank  6", "#  Rank  7"))))
    check = by_name(acc.assemble(results))[network_checks.INTRA_NODE]
    assert check.status == FAIL and "6 ranks on 1 node(s), not 8 per node" in check.why


def test_a_sweep_that_stops_below_1_gib_is_not_compared(results):
    log = results / "nccl" / "intra_node" / "all_reduce_perf.log"
    log.write_text("\n".join(line for line in log.read_text().splitlines() if not line.startswith("  1073741824")))
    check = by_name(acc.assemble(results))[network_checks.INTRA_NODE]
    assert check.status == FAIL and "largest message 256 MiB is below 1 GiB" in check.why


def test_an_unfinished_nccl_run_fails_with_the_parser_s_reason(results):
    (results / "nccl" / "intra_node" / "all_reduce_perf.log").write_text("srun: error: task 3 launch failed\n")
    check = by_name(acc.assemble(results))[network_checks.INTRA_NODE]
    assert check.status == FAIL and "unfinished run" in check.why and "no '#  Rank N Group" in check.why


# --- the CPU cluster ---------------------------------------------------------------------------------

@pytest.fixture
def cpu_results(results) -> Path:
    """The local CPU cluster: no nccl-tests, no GPU numbers, nodes without GPUs."""
    edit_json(results / "expected.json", gpu=False)
    shutil.rmtree(results / "nccl")
    for node in (results / "nodes").glob("gpu-*.json"):
        edit_json(node, gpus_expected=0, driver_cuda=None, torch_cuda=None, ecc_uncorrected=None)
    for layout in (results / "layouts").glob("*.json"):
        edit_json(layout, peak_memory_gib=None, predicted_memory_gib=None, tokens_per_s_per_gpu=None,
                  compiled_losses=None, eager_losses=None)
    return results


def test_on_a_cpu_cluster_no_gpu_checks_are_allowed_and_the_verdict_is_go(cpu_results):
    report = acc.assemble(cpu_results)
    assert [c.name for c in report.checks] == GPU_CATALOGUE  # the same checks: none left out
    not_measured = [c for c in report.checks if c.status == NOT_MEASURED]
    assert len(not_measured) == 13 and all(c.needs_gpu and c.why.startswith("no GPU") for c in not_measured)
    assert all(c.status == PASS for c in report.checks if not c.needs_gpu)
    assert report.verdict == GO
    assert acc.main(["report", str(cpu_results)]) == 0
    assert (cpu_results / "report.txt").read_text().startswith(
        "acceptance: GO (CPU cluster: checks that need a GPU may be not measured)")


def test_on_a_cpu_cluster_a_check_that_needs_no_gpu_must_still_run(cpu_results):
    edit_json(cpu_results / "drill" / "drill.json", reference_losses=None)
    report = acc.assemble(cpu_results)
    assert blocking(report) == ["drill: killed rank recovers, losses bit-identical"]
    assert report.verdict == NO_GO


# --- the rule itself, and bad input --------------------------------------------------------------------

def check(status: str, needs_gpu: bool) -> Check:
    return Check("x", status, "", "", "", "s", needs_gpu=needs_gpu)


@pytest.mark.parametrize("gpu, checks, verdict", [
    (True, [check(PASS, True), check(PASS, False)], GO),
    (True, [check(PASS, False), check(NOT_MEASURED, True)], NO_GO),
    (True, [check(FAIL, False)], NO_GO),
    (False, [check(PASS, False), check(NOT_MEASURED, True)], GO),
    (False, [check(NOT_MEASURED, False)], NO_GO),
    (False, [check(FAIL, True)], NO_GO),
    (True, [check("skipped", False)], NO_GO),
    (True, [], NO_GO),
])
def test_the_verdict_rule(gpu, checks, verdict):
    assert Report(gpu, checks).verdict == verdict


def test_the_plot_draws_checks_without_numbers_and_unbounded_ratios(tmp_path):
    report = Report(True, [check(NOT_MEASURED, True),
                               Check("y", FAIL, "9", "1", "", "s", ratio=math.inf, limit=1.0),
                               Check("z", PASS, "1", "1", "", "s", ratio=5.0, limit=0.8)])
    write_report(report, tmp_path)
    assert (tmp_path / "report.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("setup, message", [
    (lambda d: shutil.rmtree(d), "is not a folder — pass the acceptance job's results folder"),
    (lambda d: (d / "expected.json").unlink(), "no expected.json with \"gpu\": true|false in"),
    (lambda d: (d / "layouts" / "model1.json").write_text('{"losses": [1'), "model1.json is not valid JSON"),
])
def test_bad_input_exits_2_with_one_error_line(results, capsys, setup, message):
    setup(results)
    assert acc.main(["report", str(results)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0] and " — " in err[0]


def write_metrics(path: Path, lines: list[dict]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 9, "lo')


def test_drill_runs_that_failed_at_start_up_are_not_measured_never_a_pass(results, capsys):
    """Every drill run exited 2 before its first step (as the fixed batch of 32 did on 16 ranks): no losses,
    and the stalled run never reached the step where a rank is stopped, so jobs/acceptance.sh passes
    --no-rank-stopped. Both checks say why, and block."""
    drill = results / "drill"
    (drill / "drill.json").unlink()
    assert acc.main(["drill", str(drill), "--no-rank-stopped", "--timeout-s", "30"]) == 0
    assert "no rank stopped" in capsys.readouterr().out
    report = acc.assemble(results)
    recovery, stall = "drill: killed rank recovers, losses bit-identical", "drill: stalled rank detected"
    assert blocking(report) == [recovery, stall] and report.verdict == NO_GO
    checks = by_name(report)
    assert {checks[recovery].status, checks[stall].status} == {NOT_MEASURED}
    assert not checks[recovery].needs_gpu and not checks[stall].needs_gpu  # blocking on the CPU rehearsal too
    assert "uninterrupted run (drill/reference) logged no loss" in checks[recovery].why
    assert "killed run (drill/recovered) logged no loss after a resume" in checks[recovery].why
    assert "no rank was stopped" in checks[stall].why


def test_a_stall_check_without_a_stop_time_is_never_a_pass():
    """A missing stop time used to read as "detected in 0 s", a pass."""
    check = stall_detected("drill", None, 30.0, rank_stopped=False)
    assert check.status == NOT_MEASURED and check.measured == ""
    assert stall_detected("drill", 0.0, 30.0, rank_stopped=False).status == NOT_MEASURED


# The drill's allocation: jobs/acceptance.sh's nodes, with one rank per GPU on p5e or NPROC_PER_NODE=2 in
# the local rehearsal (tests/local_cluster/test_acceptance_job.py).
DRILL_NODES = int(re.search(r"^#SBATCH --nodes=(\d+)", ACCEPTANCE_SH.read_text(), re.M).group(1))


@pytest.mark.parametrize("ranks", [DRILL_NODES * network_checks.GPUS_PER_NODE, DRILL_NODES * 2], ids=["p5e", "rehearsal"])
def test_the_drill_s_config_starts_on_its_allocation(ranks, tmp_path, capsys):
    """The overrides jobs/acceptance.sh takes from drill-args load, and their batch divides over the ranks
    (a fixed global batch of 32 does not on 16 ranks: the drill could not start on 2 x p5e)."""
    assert acc.main(["drill-args", "--ranks", str(ranks)]) == 0
    overrides = capsys.readouterr().out.split()
    assert overrides == drill_overrides(ranks)
    run = tmp_path / "drill" / "reference"  # the drill's own paths, as acceptance.sh passes them
    cfg = load_config(REPO / "jobs/training/configs/tiny.yaml",
                      [f"data.path={tmp_path}/data", f"checkpoint.dir={run}/checkpoints", f"log.dir={run}/logs",
                       *overrides])
    assert cfg.grad_accum_steps(ranks) >= 1
    assert cfg.train.deterministic  # the recovery check demands bit-identical losses on GPUs


def test_acceptance_sh_takes_the_drill_s_batch_from_drill_args_only():
    script = ACCEPTANCE_SH.read_text()
    assert "cluster_checks.acceptance drill-args --ranks $((SLURM_NNODES * NPROC_PER_NODE))" in script
    assert "batch_size=" not in script and "deterministic=" not in script  # no second source


def test_drill_args_refuses_no_ranks(capsys):
    assert acc.main(["drill-args", "--ranks", "0"]) == 2
    assert "--ranks 0: the drill needs at least one rank — pass nodes x workers per node" in capsys.readouterr().err


def test_drill_record_reads_the_runs_the_job_left(tmp_path):
    """reference: 8 steps; recovered: killed after step 5, resumed from the step-4 checkpoint, completed."""
    losses = {s: 10.0 - s / 2 for s in range(1, 9)}
    data = {s: 1000 + s for s in range(1, 9)}  # samples_crc: which data rank 0 read at each step
    write_metrics(tmp_path / "reference" / "logs", [
        {"event": "start", "step": 0, "resumed": False},
        *({"step": s, "loss": v, "samples_crc": data[s]} for s, v in losses.items()),
        {"event": "complete", "step": 8}])
    write_metrics(tmp_path / "recovered" / "logs", [
        {"event": "start", "step": 0, "resumed": False},
        *({"step": s, "loss": losses[s] + 1, "samples_crc": 0} for s in range(1, 6)),
        {"event": "start", "step": 4, "resumed": True},
        *({"step": s, "loss": losses[s], "samples_crc": data[s]} for s in range(5, 9)),
        {"event": "complete", "step": 8}])
    assert acc.main(["drill", str(tmp_path), "--stall-detected-s", "41.5", "--timeout-s", "30"]) == 0
    record = json.loads((tmp_path / "drill.json").read_text())
    assert record["recovered"] and record["resumed_from_step"] == 4 and record["rank_stopped"]
    assert record["resumed_samples"] == {str(s): data[s] for s in range(5, 9)}  # the steps after the resume only
    checks = drill_checks(record)
    assert [c.status for c in checks] == [PASS, PASS]  # steps 5-8 identical; 41.5 s <= 30 + grace
    # A resume that lost state: the same data, other losses.
    changed = {**record, "resumed_losses": {**record["resumed_losses"], "6": losses[6] + 1e-6}}
    assert "1 of 4 steps differ (first: step 6) on the same data" in drill_checks(changed)[0].why
    # A resume that lost the data position: other data, whatever the losses.
    changed = {**record, "resumed_samples": {**record["resumed_samples"], "7": data[8], "8": data[7]}}
    recovery = drill_checks(changed)[0]
    assert recovery.status == FAIL and "the data differs from step 7 (samples_crc)" in recovery.why


def test_node_record_runs_the_prolog_s_check_and_the_venv(tmp_path, monkeypatch):
    """On this (CPU) machine: the health check from HEALTH_CONF, the venv imports, no nvidia-smi facts."""
    from cluster_checks import node_record

    check = tmp_path / "check.sh"
    check.write_text("#!/bin/bash\necho 'checking GPUs'\necho 'fatal NVIDIA Xid 79'\nexit 1\n")
    check.chmod(0o755)
    (tmp_path / "health.conf").write_text(f"HEALTH_CHECK={check}\n")
    monkeypatch.delenv("HEALTH_CHECK", raising=False)
    monkeypatch.setenv("HEALTH_CONF", str(tmp_path / "health.conf"))
    monkeypatch.setenv("SLURMD_NODENAME", "cpu-dy-c7i-1")
    monkeypatch.setattr(node_record.shutil, "which", lambda name: None)  # a CPU node: no nvidia-smi
    assert node_record.main(["--queue", "cpu", "--out", str(tmp_path / "nodes")]) == 0
    record = node_checks.NodeRecord(**json.loads((tmp_path / "nodes" / "cpu_cpu-dy-c7i-1.json").read_text()))
    assert (record.queue, record.gpus_expected, record.health_rc) == ("cpu", 0, 1)
    assert record.health_output.endswith("fatal NVIDIA Xid 79") and record.venv_ok and record.driver_cuda is None
    assert "fatal NVIDIA Xid 79" in node_checks.node_health([record]).why


def test_node_record_reads_the_driver_and_memory_errors_from_nvidia_smi(tmp_path, monkeypatch):
    """The GPU node's branch, with a stand-in nvidia-smi answering as the real one does (CSV, no header)."""
    from cluster_checks import node_record

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/bash\n"
                   "case $1 in\n"
                   "  --query-gpu=*) printf '0\\n[N/A]\\n2\\n' ;;\n"
                   "  --query-remapped-rows=*) printf 'No, No\\nYes, No\\n' ;;\n"
                   "  *) echo '| NVIDIA-SMI 570.133.20   Driver Version: 570.133.20   CUDA Version: 12.8 |' ;;\n"
                   "esac\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    facts = node_record.gpu_facts()
    assert facts == {"driver_cuda": "12.8", "ecc_uncorrected": 2, "row_remap_pending": True, "row_remap_failed": False}
    record = node_checks.NodeRecord(node="gpu-1", queue="gpu", gpus_expected=8, torch_cuda="12.9", **facts)
    assert node_checks.driver_supports_torch([record]).status == FAIL  # 12.8 driver, 12.9 build
    assert node_checks.ecc_clean([record]).status == FAIL


@pytest.mark.parametrize("peak, status, said", [
    (41.7, PASS, "-13%"),  # the compiled 70B recipe on one H100 against the eager dry run's 48.1 GiB
    (53.4, FAIL, "the dry run is 11% under: production layouts sized from it may not fit"),
    (33.0, FAIL, "the dry run is 31% over: the plan leaves memory unused"),
])
def test_memory_check_allows_the_compiled_job_below_the_eager_dry_run_but_not_above_it(peak, status, said):
    check = peak_memory("llama2-70b", peak, 48.1)
    assert check.status == status
    assert said in (check.measured if status == PASS else check.why)
    assert check.expected == "-25% to +10% of 48.1 GiB predicted"
