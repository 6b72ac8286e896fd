"""Collectives of each production layout against the analytic minimum (training.parallel.communication).

The measurement (benchmarks/communication) joins the dry run's fake process group in this process at
the job's real world size, with the real widths and 1 and 2 decoder layers: a few seconds per layout.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from training.parallel.communication import (Traffic, layer_traffic, outer_traffic, recomputed_layers, ring_bytes,
                                    step_traffic)
from training.models.presets import PRESETS

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = ["model1", "model3", "model5", "model7"]  # prod's distinct jobs: 7B, 13B, 18.4B HSDP; 70B FSDP x TP 8
TENSOR_PARALLEL = ["model7"]
DP = ("dp_shard", "dp_replicate")
TOLERANCE = 1.05  # measured bytes / analytic minimum (FSDP pads each parameter's rows to the shard count)


@functools.cache
def report(model: str):
    """The layout's measurement, once per session (each test needs it alone: one failing layout fails its own)."""
    from benchmarks.communication.layouts import compare

    return compare(model, "prod")


def test_the_analytic_model_imports_no_torch():
    """The planner (cluster_config) imports it and must not need PyTorch."""
    code = "import sys, training.parallel.communication; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO / "jobs", check=True)


def test_the_analytic_minimum_by_hand():
    # 7B, HSDP 4 replicas x shards of 8: the layer's 202,383,360 parameters gathered twice in bf16,
    # reduce-scattered once in fp32, its fp32 shard all-reduced across the 4 replicas on the last micro-batch.
    p = PRESETS["llama2-7b"]
    assert p.layer_parameters == 202_383_360
    shape = dict(micro_batch=2, seq_len=4096, dp=32, parallelism="hsdp", hsdp_shard_size=8)
    mb = layer_traffic(p, **shape)
    assert mb.counts() == {("dp_shard", "all_gather"): 2, ("dp_shard", "reduce_scatter"): 1}
    assert mb.bytes("dp_shard", "all_gather") == pytest.approx(2 * 7 / 8 * 2 * 202_383_360)
    assert mb.bytes("dp_shard", "reduce_scatter") == pytest.approx(7 / 8 * 4 * 202_383_360)
    last = layer_traffic(p, **shape, last_micro_batch=True)
    assert (last - mb).counts() == {("dp_replicate", "all_reduce"): 1}
    assert last.bytes("dp_replicate") == pytest.approx(2 * 3 / 4 * 4 * 202_383_360 / 8)

    # 70B, FSDP 34 x TP 8 with activation checkpointing: 6 gathers and 5 reduce-scatters of the
    # 8 x 4096 x 8192 bf16 activation (512 MiB) over the 8 tensor-parallel ranks, two norm-weight all-reduces.
    p = PRESETS["llama2-70b"]
    shape = dict(micro_batch=8, seq_len=4096, tp=8, dp=34, parallelism="fsdp", activation_checkpointing=True)
    mb = layer_traffic(p, **shape)
    activation = 8 * 4096 * 8192 * 2
    assert {k: v for k, v in mb.counts().items() if k[0] == "tp"} == {
        ("tp", "all_gather"): 6, ("tp", "reduce_scatter"): 5, ("tp", "all_reduce"): 2}
    assert mb.bytes("tp") == pytest.approx(11 * 7 / 8 * activation + 2 * 2 * 7 / 8 * 8192 * 2)
    per_rank = (p.layer_parameters - 2 * 8192) / 8 + 2 * 8192  # matrices split 8 ways, norm weights whole
    assert mb.bytes("dp_shard", "all_gather") == pytest.approx(2 * 33 / 34 * 2 * per_rank)
    without = layer_traffic(p, **{**shape, "activation_checkpointing": False})
    assert (without.count("tp", "all_gather"), without.count("tp", "reduce_scatter")) == (4, 4)

    # A step: accumulation micro-batches of every layer and the rest, the replica all-reduce once.
    step = step_traffic(PRESETS["llama2-7b"], vocab_size=32000, accumulation=16, micro_batch=2, seq_len=4096,
                        dp=32, parallelism="hsdp", hsdp_shard_size=8)
    p = PRESETS["llama2-7b"]
    outer = dict(vocab_size=32000, micro_batch=2, seq_len=4096, dp=32, parallelism="hsdp", hsdp_shard_size=8)
    expected = (layer_traffic(p, micro_batch=2, seq_len=4096, dp=32, parallelism="hsdp") * p.layers
                + outer_traffic(p, **outer)) * 15 + (
        layer_traffic(p, micro_batch=2, seq_len=4096, dp=32, parallelism="hsdp", last_micro_batch=True) * p.layers
        + outer_traffic(p, **outer, last_micro_batch=True))
    assert step.counts() == expected.counts()
    for dim in ("dp_shard", "dp_replicate"):
        assert step.bytes(dim) == pytest.approx(expected.bytes(dim))
    assert step.count("dp_replicate") == p.layers + 2  # each layer, the embedding, the output unit
    # Checkpointing 1 layer in 4 of 80: layers 0, 4 ... 76 recomputed, 60 not.
    assert recomputed_layers(80, True, 4) == 20 and recomputed_layers(80, False, 4) == 0
    p70 = PRESETS["llama2-70b"]
    shape = dict(vocab_size=32000, accumulation=8, micro_batch=4, seq_len=4096, tp=8, dp=34,
                 activation_checkpointing=True)
    every4, all_layers = step_traffic(p70, **shape, activation_checkpointing_every=4), step_traffic(p70, **shape)
    assert all_layers.count("tp", "all_gather") - every4.count("tp", "all_gather") == 8 * 60 * 2
    assert all_layers.count("tp", "reduce_scatter") - every4.count("tp", "reduce_scatter") == 8 * 60 * 1
    assert ring_bytes("all_reduce", 100, 4) == 150 and ring_bytes("all_gather", 100, 4) == 75
    assert (Traffic.of("tp", "all_gather", 8, 2) * 3).count() == 3


def test_the_layouts_are_prods_distinct_jobs():
    from benchmarks.communication.layouts import production_layouts

    assert production_layouts("prod") == LAYOUTS


@pytest.mark.parametrize("model", LAYOUTS)
def test_the_recorder_sees_what_comm_debug_mode_counts(model):
    """FSDP's process-group collectives and DTensor's functional ones, as many as CommDebugMode counts."""
    for name, phase in report(model).two_layers.items():
        assert phase.debug_mode_count == len(phase.records) > 0, name
    ops = {r.op for r in report(model).two_layers["micro_batch"].records}
    assert any(op.startswith("c10d.") for op in ops), ops  # FSDP2
    if model in TENSOR_PARALLEL:
        assert any(op.startswith("_c10d_functional.") for op in ops), ops  # DTensor
        assert {r.dim for r in report(model).two_layers["micro_batch"].records} == {"tp", "dp_shard"}
    else:
        assert {r.dim for r in report(model).two_layers["last_micro_batch"].records} == set(DP)


def _check(layout, dims: tuple[str, ...], name: str) -> None:
    """Collectives per layer per micro-batch as the minimum's, bytes of the layers and of the step within TOLERANCE."""
    for kind, per in layout.per_layer.items():
        for phase, traffic in per.items():
            measured = {k: v for k, v in traffic.counts().items() if k[0] in dims}
            analytic = {k: v for k, v in layout.per_layer_analytic[kind][phase].counts().items() if k[0] in dims}
            assert measured == analytic, f"{layout.model} {kind} layer, {phase}: {measured}, minimum {analytic}"
    ratios = layout.ratios()
    for scope in ("layers", "step"):
        ratio = ratios[scope][name]
        assert ratio <= TOLERANCE, f"{layout.model}: {name} bytes of the {scope} x{ratio:.3f}"


@pytest.mark.parametrize("model", LAYOUTS)
def test_data_parallel_collectives_are_the_analytic_minimum(model):
    _check(report(model), DP, "dp")


@pytest.mark.parametrize("model", TENSOR_PARALLEL)
def test_tensor_parallel_collectives_are_the_analytic_minimum(model):
    """Megatron with sequence parallelism: per block one all-gather and one reduce-scatter each way."""
    _check(report(model), ("tp",), "tp")


def test_the_benchmark_prints_its_tables_and_writes_its_json(tmp_path, monkeypatch, capsys):
    """What `make bench` runs (python -m benchmarks.communication), on this session's measurements."""
    import benchmarks.communication.__main__ as bench

    monkeypatch.setattr(bench, "compare", lambda model, env: report(model))
    out = tmp_path / "communication.json"
    assert bench.main(["--model", "model1", "--model", "model7", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["env"] == "prod" and [layout["model"] for layout in result["layouts"]] == ["model1", "model7"]

    def gib(traffic: dict, dims: tuple[str, ...]) -> float:
        return sum(flow["bytes"] for key, flow in traffic.items() if key.split()[0] in dims) / 2**30

    for layout in result["layouts"]:
        step, ratios = layout["per_step_whole_model"], layout["ratio_measured_over_analytic"]["step"]
        for name, dims in (("tp", ("tp",)), ("dp", DP)):
            measured, analytic = gib(step["measured"], dims), gib(step["analytic"], dims)
            assert ratios[name] == (pytest.approx(measured / analytic) if analytic else None), (layout["model"], name)
        assert all(flow["count"] > 0 and flow["bytes"] > 0 for flow in step["measured"].values())
    printed = capsys.readouterr().out
    assert "### model1: llama2-7b, HSDP" in printed and "### model7: llama2-70b, FSDP 34 x TP 8" in printed
    assert "2 layouts in" in printed and str(out) in printed
