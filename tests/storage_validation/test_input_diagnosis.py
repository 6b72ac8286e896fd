"""The input diagnosis driver: real loader, real training steps, report; gdsio parsing; bad input."""

import json

import pytest
import torch

from cluster_checks import input_diagnosis
from training.demo_data import build as build_demo_data

TINY = "jobs/training/configs/tiny.yaml"

# gdsio result lines as GDS prints them (storage -> CPU -> GPU, then GPUDirect).
GDSIO_CPU_GPU = ("IoType: READ XferType: CPU_GPU Threads: 8 DataSetSize: 14325760/8388608(KiB) IOSize: 1024(KiB) "
                 "Throughput: 1.428755 GiB/sec, Avg_Latency: 5467.763581 usecs ops: 13990 total_time 9.562311 secs\n")
GDSIO_GPUD = ("IoType: READ XferType: GPUD Threads: 8 DataSetSize: 16117760/8388608(KiB) IOSize: 1024(KiB) "
              "Throughput: 1.564272 GiB/sec, Avg_Latency: 4993.969457 usecs ops: 15740 total_time 9.826353 secs\n")


def test_gdsio_throughput_is_converted_to_gb_s():
    assert input_diagnosis.parse_gdsio(GDSIO_CPU_GPU) == pytest.approx(1.428755 * 2**30 / 1e9)
    assert input_diagnosis.parse_gdsio(GDSIO_GPUD) == pytest.approx(1.564272 * 2**30 / 1e9)


def test_gdsio_error_output_is_reported():
    with pytest.raises(ValueError, match="no 'Throughput: ... GiB/sec' in gdsio output: .*cuFile"):
        input_diagnosis.parse_gdsio("Error: cuFileDriverOpen failed: GPUDirect Storage not supported\n")


def test_gds_is_not_available_without_the_tool_or_a_gpu(tmp_path):
    result = input_diagnosis.gds_compare(str(tmp_path), None)
    assert result["available"] is False
    assert result["reason"] == ("no GPU" if not torch.cuda.is_available() else
                                "gdsio not found (PATH, /usr/local/cuda/gds/tools/gdsio): GDS tools not installed")


def test_missing_dataset_is_a_clear_error(tmp_path, capsys):
    code = input_diagnosis.main(["--config", TINY, f"data.path={tmp_path / 'nothing'}", "--out", str(tmp_path / "o")])
    assert code == 2
    assert capsys.readouterr().err.startswith("error: no dataset.json in")
    assert not list((tmp_path / "o").glob("train-*")), "scratch folder left behind"


def test_bad_training_override_names_the_field(tmp_path, capsys):
    code = input_diagnosis.main(["--config", TINY, "data.num_workers=-1", "--out", str(tmp_path)])
    assert code == 2
    assert "error: data.num_workers: Input should be greater than or equal to 0 (got -1)" in capsys.readouterr().err


@pytest.mark.slow
def test_diagnosis_runs_the_real_loader_and_training_and_decides(tmp_path, capsys):
    data = tmp_path / "data"
    build_demo_data(data)
    out = tmp_path / "out"
    code = input_diagnosis.main(["--config", TINY, f"data.path={data}", "--out", str(out),
                                 "--steps", "4", "--batches", "30", "--workers", "1"])
    assert code == 0
    report = json.loads((out / "diagnosis.json").read_text())
    assert [r["num_workers"] for r in report["loader"]] == [0, 1]
    assert report["training"]["batches_per_step"] == 2  # tiny.yaml: global 32 / micro 16 on one rank
    assert report["training"]["steps_timed"] == 2
    numbers = report["numbers"]
    assert numbers["workers_in_training"] == 1 and numbers["data_wait_share"] == report["training"]["data_wait_share"]
    printed = capsys.readouterr().out
    assert f"VERDICT: {report['verdict']['kind']}" in printed and f"change: {report['verdict']['change']}" in printed
    assert list(out.iterdir()) == [out / "diagnosis.json"]  # scratch checkpoints and logs removed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_pinned_copy_is_timed_on_the_gpu():
    batch = {"input_ids": torch.zeros(16, 2048, dtype=torch.int64), "labels": torch.zeros(16, 2048, dtype=torch.int64)}
    device = torch.device("cuda", 0)
    pageable = input_diagnosis.copy_seconds(batch, device, pinned=False)
    pinned = input_diagnosis.copy_seconds(batch, device, pinned=True)
    assert 0 < pinned < 0.01 and 0 < pageable < 0.05  # 0.5 MB: microseconds to a millisecond on PCIe
