"""Communication per production layout: every collective of a training step against the analytic minimum.

    .venv/bin/python -m benchmarks.communication [--env prod] [--model model7 ...] [--out FILE]

For each distinct job of the environment's plan (prod: 7B, 13B and 18.4B HSDP, 70B FSDP x TP 8), one
rank of the job at its real world size, with the preset's real widths (hidden, heads, key/value heads,
FFN, vocabulary, seq_len, the recipe's micro-batch) but 1 and 2 decoder layers, runs micro-batches
(forward + backward, bf16 mixed precision) and an optimizer step on the dry run's fake process group
under FakeTensorMode: no memory, no GPU (benchmarks/communication/measure.py). Every collective is
recorded with its kind, mesh dimension (tp, dp_shard, dp_replicate) and size. Reported per layout:
collectives per decoder layer per micro-batch by kind and dimension, and bytes per GPU per step of the
whole model (ring traffic), each beside the analytic minimum (jobs/training/parallel/communication.py) and
their ratio, tensor-parallel and data-parallel apart. Writes JSON (default
benchmarks/results/communication.json).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "jobs"))

from cli import ArgumentParser, fail  # noqa: E402
from cluster_config.settings import SettingsError  # noqa: E402
from training.config import ConfigError  # noqa: E402

from .layouts import LayoutReport, compare, production_layouts  # noqa: E402

GIB = 2**30


def _count(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.2f}"


def table(report: LayoutReport) -> str:
    """Markdown: collectives per decoder layer per micro-batch, then GiB per GPU per step of the whole model."""
    layers = ", ".join(f"{n} {kind}" for kind, n in report.layers.items())
    lines = [f"### {report.model}: {report.preset}, {report.layout}, {report.world_size} GPUs, micro-batch "
             f"{report.micro_batch_size} x {report.accumulation} accumulation, seq {report.seq_len}, activation "
             f"checkpointing {report.activation_checkpointing} (decoder layers: {layers})",
             "",
             "| decoder layer | dim | collective | per micro-batch: measured (fwd + bwd) | minimum | "
             "last micro-batch: measured | minimum |",
             "|---|---|---|---|---|---|---|"]
    for kind, per in report.per_layer.items():
        forward, analytic = report.per_layer_forward[kind], report.per_layer_analytic[kind]
        keys = sorted({key for traffic in (*per.values(), *analytic.values()) for key in traffic.counts()})
        for dim, collective in keys:
            count, fwd = per["micro_batch"].count(dim, collective), forward["micro_batch"].count(dim, collective)
            lines.append(f"| {kind} | {dim} | {collective} | {_count(count)} ({_count(fwd)} + {_count(count - fwd)}) | "
                         f"{_count(analytic['micro_batch'].count(dim, collective))} | "
                         f"{_count(per['last_micro_batch'].count(dim, collective))} | "
                         f"{_count(analytic['last_micro_batch'].count(dim, collective))} |")
    step, minimum = report.step, report.step_analytic
    lines += ["", f"| dim | collective | per step ({report.accumulation} micro-batches, {sum(report.layers.values())} "
              "layers): collectives | minimum | GiB per GPU | minimum | ratio |", "|---|---|---|---|---|---|---|"]
    for dim, collective in sorted({*step.counts(), *minimum.counts()}):
        m, a = step.bytes(dim, collective), minimum.bytes(dim, collective)
        note = "" if minimum.count(dim, collective) else " (optimizer step: gradient norm)"
        lines.append(f"| {dim} | {collective} | {_count(step.count(dim, collective))}{note} | "
                     f"{_count(minimum.count(dim, collective))} | {m / GIB:.2f} | {a / GIB:.2f} | "
                     f"{f'{m / a:.3f}' if a else '-'} |")
    ratios, parts = report.ratios(), []
    for name, key, dims in (("tensor parallel", "tp", ("tp",)), ("data parallel", "dp", ("dp_shard", "dp_replicate"))):
        if ratios["step"][key] is not None:
            parts.append(f"{name} {step.bytes(dims) / GIB:.2f} GiB vs minimum {minimum.bytes(dims) / GIB:.2f} GiB "
                         f"(ratio {ratios['step'][key]:.3f}; decoder layers alone {ratios['layers'][key]:.3f})")
    lines += ["", "Per GPU per step: " + "; ".join(parts) + f". Measured in {report.seconds:.0f} s."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.communication", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="prod", help="environment whose plan gives the layouts (default prod)")
    parser.add_argument("--model", action="append", help="only this model of the plan (repeatable)")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/communication.json"))
    args = parser.parse_args(argv)

    start = time.perf_counter()
    reports = []
    try:
        for model in args.model or production_layouts(args.env):
            reports.append(compare(model, args.env))
            print(table(reports[-1]), end="\n\n", flush=True)
    except (ConfigError, SettingsError) as exc:
        return fail(exc)
    seconds = time.perf_counter() - start
    result = {"machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(),
                          "device": "cpu: fake process group under FakeTensorMode (counts and sizes, no timing)"},
              "env": args.env, "seconds": round(seconds, 1), "layouts": [r.as_dict() for r in reports]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(reports)} layouts in {seconds:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
