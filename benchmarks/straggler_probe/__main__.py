"""Noise of the straggler probe (training/resilience/stragglers.py), the figure its margin is chosen from.

    .venv/bin/python -m benchmarks.straggler_probe [--samples 400] [--out benchmarks/results/straggler_probe.json]

Runs the probe ``--samples`` times on this machine's GPU (or CPU), as a healthy rank runs it once per
log interval, and reports its spread: each sample over the median of all (what a healthy rank's
probe is over its peers' median, if every device were this one), the share of samples over each
margin, and from it a bound on the chance that one healthy rank alone is over in ``k`` of ``w`` intervals:
``C(w, k) p ** k`` per interval (samples taken as independent; the rule asks more of a rank alone, and judges
nodes by their ranks' median: benchmarks/straggler_study simulates it on the noise fitted to this), times
prod's 640 ranks and the two weeks' log intervals. The baseline is the probe's own median in the same run.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "jobs")]

import torch  # noqa: E402
from cli import ArgumentParser  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.resilience.stragglers import probe  # noqa: E402

RANKS, DAYS, INTERVAL_S = 640, 14, 100  # prod: 640 GPUs for two weeks, a log line every ~100 s


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/straggler_probe.json")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for _ in range(10):
        probe(device)  # warm-up: clocks, caches, kernels chosen
    samples = [probe(device) for _ in range(args.samples)]
    median = statistics.median(samples)
    ratios = sorted(s / median for s in samples)
    defaults = TrainConfig()
    intervals = RANKS * DAYS * 86400 / INTERVAL_S
    result = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "samples": args.samples, "median_ms": 1e3 * median,
              "p99_over_median": ratios[int(0.99 * (len(ratios) - 1))], "max_over_median": ratios[-1],
              "over_margin": {}, "default_margin": defaults.straggler_margin,
              "default_intervals": defaults.straggler_intervals, "default_window": defaults.straggler_window}
    print(f"{result['device']}: probe median {1e3 * median:.2f} ms over {args.samples} samples; p99 "
          f"{result['p99_over_median']:.3f} x, max {result['max_over_median']:.3f} x the median")
    for margin in (0.02, 0.05, 0.10, 0.20):
        share = sum(r > 1 + margin for r in ratios) / len(ratios)
        k, w = defaults.straggler_intervals, defaults.straggler_window
        expected = intervals * math.comb(w, k) * share ** k
        result["over_margin"][str(margin)] = {"share": share, "false_reports_in_two_weeks": expected}
        print(f"  over {margin:.0%}: {share:.2%} of samples; {k} of {w} intervals: at most "
              f"{expected:.3g} false reports of one rank alone over prod's {RANKS} ranks x {DAYS} days")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
