"""The torch.distributed collective benchmark in one process (multi-node runs: test_cluster_jobs.py)."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from cluster_checks import collectives
from cluster_checks.results import COLLECTIVES, bus_factor


@pytest.mark.parametrize("collective, n, factor", [
    ("all_reduce", 8, 1.75), ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75),
    ("all_to_all", 2, 0.5), ("broadcast", 16, 1.0), ("reduce", 16, 1.0),
])
def test_bus_bandwidth_factors_follow_nccl_tests(collective, n, factor):
    assert bus_factor(collective, n) == factor


@pytest.fixture
def single_rank_group(tmp_path, monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")
    yield tmp_path


def run(tmp_path, *extra):
    status = collectives.main(["--min-bytes", "1K", "--max-bytes", "4K", "--iters", "2", "--warmup", "1",
                               "--backend", "gloo", "--out-dir", str(tmp_path / "out"), *extra])
    return status, json.loads((tmp_path / "out" / "results.json").read_text())["results"]


def test_every_collective_is_checked_and_reported(single_rank_group):
    status, rows = run(single_rank_group)
    assert status == 0
    assert [r["collective"] for r in rows] == [c for c in COLLECTIVES for _ in (1024, 4096)]
    assert all(r["correct"] and r["ranks_checked"] == 1 and r["method"] == "native" for r in rows)


def test_backend_without_reduce_scatter_is_emulated_and_labelled(single_rank_group, monkeypatch):
    # Simulates an older gloo that has no reduce_scatter.
    def unsupported(*args, **kwargs):
        raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")

    monkeypatch.setattr(dist, "reduce_scatter_single", unsupported, raising=False)
    monkeypatch.setattr(dist, "reduce_scatter_tensor", unsupported)
    status, rows = run(single_rank_group, "--collectives", "reduce_scatter", "all_reduce")
    assert status == 0
    methods = {r["collective"]: r["method"] for r in rows}
    assert methods == {"reduce_scatter": collectives.EMULATION, "all_reduce": "native"}
    assert all(r["correct"] for r in rows)


def test_wrong_result_fails_the_run(single_rank_group, monkeypatch, capsys):
    real = dist.broadcast

    def corrupting_broadcast(tensor, *args, **kwargs):
        real(tensor, *args, **kwargs)
        tensor[0] += 1

    monkeypatch.setattr(dist, "broadcast", corrupting_broadcast)
    status, rows = run(single_rank_group, "--collectives", "broadcast")
    assert status == 1 and not any(r["correct"] for r in rows)
    assert "problem: rank 0: wrong results for broadcast@1024" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--max-bytes", "lots"], "not a byte size: 'LOTS'"),
    (["--min-bytes", "8K", "--max-bytes", "4K"], "need 0 < --min-bytes <= --max-bytes"),
])
def test_bad_sweep_is_rejected_before_starting(argv, message, tmp_path, capsys):
    with pytest.raises((SystemExit, ValueError)) as err:
        collectives.main([*argv, "--out-dir", str(tmp_path)])
    assert message in str(err.value) + capsys.readouterr().err


def test_sizes_parse_like_nccl_tests():
    assert [collectives.parse_bytes(s) for s in ("8", "4K", "16M", "1G", "2kb")] == [8, 4096, 16 << 20, 1 << 30, 2048]
    assert collectives.message_sizes(1024, 16384, 4) == [1024, 4096, 16384]
