"""Communication per production layout: every collective of a training step against the analytic minimum.

    .venv/bin/python -m benchmarks.communication [--env prod] [--model model7 ...] [--out FILE]

For each distinct job of the environment's plan (prod: 7B, 13B and 18.4B HSDP, 70B FSDP x TP 8), one
rank of the job at its real world size, with the preset's real widths (hidden, heads, key/value heads,
FFN, vocabulary, seq_len, the recipe's micro-batch) but 1 and 2 decoder layers, runs micro-batches
(forward + backward, bf16 mixed precision) and an optimizer step on the dry run's fake process group
under FakeTensorMode: no memory, no GPU (benchmarks/communication/measure.py). Every collective is
recorded with its kind, mesh dimension (tp, dp_shard, dp_replicate) and size. Reported per layout:
collectives per decoder layer per micro-batch by kind and dimension, and bytes per GPU per step of the
whole model (ring traffic), each beside the analytic minimum (jobs/training/communication.py) and
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

from cli import ArgumentParser  # noqa: E402

from .layouts import LayoutReport, compare, production_layouts  # noqa: E402

GIB = 2**30


def _count(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.2f}"


def table(report: LayoutReport) -> str:
    """Markdown: per decoder layer per micro-batch (counts) and per step of the whole model (GiB per GPU)."""
    per, fwd, ana = report.per_layer, report.per_layer_forward, report.per_layer_analytic
    step, step_ana = report.step, report.step_analytic
    keys = sorted({*per["micro_batch"].counts(), *per["last_micro_batch"].counts(), *ana["micro_batch"].counts(),
                   *ana["last_micro_batch"].counts(), *step.counts(), *step_ana.counts()})
    lines = [f"### {report.model}: {report.preset}, {report.layout}, {report.world_size} GPUs, micro-batch "
             f"{report.micro_batch_size} x {report.accumulation} accumulation, seq {report.seq_len}, activation "
             f"checkpointing {'on' if report.activation_checkpointing else 'off'}",
             "",
             "| dim | collective | per layer per micro-batch: measured (fwd + bwd) | minimum | last micro-batch: "
             f"measured | minimum | GiB per GPU per step ({report.layers} layers): measured | minimum | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for dim, kind in keys:
        m, a = step.bytes(dim, kind), step_ana.bytes(dim, kind)
        ratio = f"{m / a:.2f}" if a else "-"
        count = per["micro_batch"].count(dim, kind)
        forward = fwd["micro_batch"].count(dim, kind)
        measured = f"{_count(count)} ({_count(forward)} + {_count(count - forward)})" if count else "0"
        if not count and not per["last_micro_batch"].count(dim, kind) and not a:
            measured = "0 (optimizer step only)"
        lines.append(f"| {dim} | {kind} | {measured} | {_count(ana['micro_batch'].count(dim, kind))} | "
                     f"{_count(per['last_micro_batch'].count(dim, kind))} | "
                     f"{_count(ana['last_micro_batch'].count(dim, kind))} | {m / GIB:.2f} | {a / GIB:.2f} | {ratio} |")
    ratios = report.ratios()
    parts = []
    for name, dims in (("tensor parallel", ("tp",)), ("data parallel", ("dp_shard", "dp_replicate"))):
        key = "tp" if name.startswith("tensor") else "dp"
        if ratios["step"][key] is None:
            continue
        parts.append(f"{name} {step.bytes(dims) / GIB:.2f} GiB vs minimum {step_ana.bytes(dims) / GIB:.2f} GiB "
                     f"(ratio {ratios['step'][key]:.3f}; per layer {ratios['layer'][key]:.3f})")
    lines += ["", "Per GPU per step: " + "; ".join(parts) + f". Measured in {report.seconds:.0f} s."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.communication", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="prod", help="environment whose plan gives the layouts (default prod)")
    parser.add_argument("--model", action="append", help="only this model of the plan (repeatable)")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/communication.json"))
    args = parser.parse_args(argv)

    start = time.perf_counter()
    models = args.model or production_layouts(args.env)
    reports = []
    for model in models:
        reports.append(compare(model, args.env))
        print(table(reports[-1]), end="\n\n", flush=True)
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
