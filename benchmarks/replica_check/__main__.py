"""Cost of the replica-consistency sentinel (training/resilience/replicas.py) for prod's replicated models.

    .venv/bin/python -m benchmarks.replica_check [--gib 4] [--out benchmarks/results/replica_check.json]

Measures, on this machine's GPU (or its CPU), how fast ``parameter_sums`` reads parameters: over
``--gib`` of fp32 tensors shaped like llama2-7b's, against a plain fp32 ``sum`` of the same tensors
(the baseline: one read of the same bytes, in the same run). Then, for each prod model whose layout
keeps copies (DDP, HSDP), the check's seconds at its rank's share of the parameters and their
fraction of the steps between two checks (``train.replica_check_every``), with the step time from
the model's FLOPs at the plan's MFU on its GPUs. The all-gather of one integer per tensor is left
out (a few KiB). Target: under 0.5 % of step time. Exit 1 if a model misses it.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "jobs")]

import torch  # noqa: E402
from cli import ArgumentParser  # noqa: E402
from cluster_config.model_jobs import bundled_cluster  # noqa: E402
from training.dry_run import load_model_config, production_setup  # noqa: E402
from training.models.llama import build_model, count_parameters, flops_per_token, hf_config  # noqa: E402
from training.resilience.replicas import parameter_sums  # noqa: E402

TARGET = 0.005  # of step time
PEAK_FLOPS = {"cuda": 989e12}  # H100/H200 dense bf16; the plan's MFU applies to it
PLAN_MFU = 0.40


class Tensors(torch.nn.Module):
    """fp32 tensors shaped like a model's parameters, totalling about ``gib``."""

    def __init__(self, gib: float, device: torch.device):
        super().__init__()
        shapes = [tuple(p.shape) for p in build_model(hf_config("llama2-7b", 32000, 4096)).parameters()]
        budget, self.tensors = gib * 2**30, torch.nn.ParameterList()
        for shape in shapes * 4:
            numel = 1
            for n in shape:
                numel *= n
            if budget < numel * 4:
                continue  # too large for what is left: smaller ones may fit
            self.tensors.append(torch.nn.Parameter(torch.randn(shape, device=device)))
            budget -= numel * 4


def elapsed(fn, device: torch.device) -> float:
    """Seconds of one call of ``fn``, the device's queued work included."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def seconds(fn, device: torch.device, repeats: int = 5) -> float:
    fn()  # warm-up
    return statistics.median(elapsed(fn, device) for _ in range(repeats))


def replicated_models(every: int | None) -> list[dict]:
    """Prod's models whose layout keeps copies: each rank's parameter bytes and its step's seconds."""
    cluster, rows = bundled_cluster("prod"), []
    for model in cluster.models:
        raw, world_size, _ = production_setup(model, cluster)
        cfg = load_model_config(raw)
        if cfg.train.parallelism not in ("ddp", "hsdp"):
            continue
        config = hf_config(cfg.model.preset, cfg.model.vocab_size or 32000, cfg.data.seq_len)
        params, _ = count_parameters(config)
        shards = cfg.train.hsdp_shard_size if cfg.train.parallelism == "hsdp" else 1
        step_flops = flops_per_token(config, cfg.data.seq_len) * cfg.train.global_batch_size * cfg.data.seq_len
        rows.append({"model": model, "preset": cfg.model.preset, "layout": f"{cfg.train.parallelism} shards of {shards}",
                     "world_size": world_size, "rank_bytes": 4 * params / shards,
                     "step_s": step_flops / (world_size * PEAK_FLOPS["cuda"] * PLAN_MFU),
                     "every": every or cfg.train.replica_check_every})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0, help="fp32 parameters to read (default 4)")
    parser.add_argument("--every", type=int, help="steps between checks (default: each model's config)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/replica_check.json")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Tensors(args.gib, device)
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    if not nbytes:
        parser.error(f"--gib {args.gib}: too small for one of llama2-7b's tensors")
    check = seconds(lambda: parameter_sums(model), device)
    baseline = seconds(lambda: [p.detach().sum() for p in model.parameters()], device)
    rate = nbytes / check
    result = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "bytes": nbytes, "check_s": check, "baseline_s": baseline, "check_over_baseline": check / baseline,
              "check_gb_per_s": rate / 1e9, "target_fraction_of_step": TARGET, "models": []}
    print(f"{result['device']}: parameter_sums over {nbytes / 2**30:.2f} GiB in {check * 1e3:.1f} ms "
          f"({rate / 1e9:.0f} GB/s), {check / baseline:.2f} x a plain fp32 sum of the same tensors")
    for row in replicated_models(args.every):
        row["check_s"] = row["rank_bytes"] / rate
        row["fraction_of_step"] = row["check_s"] / (row["every"] * row["step_s"])
        result["models"].append(row)
        print(f"  {row['model']} ({row['preset']}, {row['layout']}, {row['world_size']} GPUs): "
              f"{row['rank_bytes'] / 2**30:.1f} GiB per rank, check {row['check_s'] * 1e3:.1f} ms every "
              f"{row['every']} steps of {row['step_s']:.1f} s: {100 * row['fraction_of_step']:.4f} % of step time")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    on_gpu = device.type == "cuda"
    met = all(row["fraction_of_step"] < TARGET for row in result["models"])
    print(f"target < {100 * TARGET:g} % of step time: {'met' if met else 'MISSED'}"
          f"{'' if on_gpu else ' (CPU read rate: the GPU reads several times faster)'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
