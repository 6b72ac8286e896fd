"""Training benchmarks: async vs sync checkpoint blocking, and tokens/s + data wait on two nodes.

    .venv/bin/python -m benchmarks.training [--saves 5] [--hidden 768 --layers 8] [--steps 120] [--out FILE]

Targets: async blocking per save <= 10% of a synchronous save of the same state; data wait
<= 2% of step time in the local 2-node run. Prints both with their baselines and writes JSON
(default benchmarks/results/training.json). The smoke test in `make test` runs it small.
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "jobs"))

from cli import ArgumentParser  # noqa: E402

from . import checkpoint, throughput  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.training", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/training.json"))
    parser.add_argument("--saves", type=int, default=5, help="checkpoints saved each way (default 5)")
    parser.add_argument("--hidden", type=int, default=768, help="the checkpointed model's width (default 768)")
    parser.add_argument("--layers", type=int, default=8, help="its decoder layers (default 8: 57M parameters)")
    parser.add_argument("--steps", type=int, default=120,
                        help=f"training steps of the two-node run (default 120, at least {throughput.MIN_STEPS})")
    args = parser.parse_args(argv)
    if args.saves < 1 or args.hidden < 64 or args.hidden % 64 or args.layers < 1 or args.steps < throughput.MIN_STEPS:
        parser.error(f"--saves >= 1, --hidden a multiple of 64, --layers >= 1, --steps >= {throughput.MIN_STEPS}")

    ckpt = checkpoint.run(hidden=args.hidden, layers=args.layers, saves=args.saves)
    with tempfile.TemporaryDirectory() as tmp:
        tput = throughput.run(Path(tmp), args.steps)
    result = {"machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(),
                          "device": "cpu (no GPU here: GPU figures are not measured)"},
              "checkpoint": ckpt, "throughput": tput}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")

    print(f"checkpoint state {ckpt['state_gib']} GiB ({ckpt['parameters'] / 1e6:.0f}M parameters + AdamW moments)")
    print(f"  synchronous save, blocking  {ckpt['sync_blocking_median_s']:8.3f} s  (baseline)")
    print(f"  async save, blocking        {ckpt['async_blocking_median_s']:8.3f} s  "
          f"ratio {ckpt['async_over_sync_ratio']:.3f} (target <= 0.10: {'met' if ckpt['meets_target'] else 'NOT met'})")
    print(f"  step time {ckpt['step_time_s_without_save']} s alone, "
          f"{ckpt['step_time_s_during_background_write']} s while the write runs")
    print(f"throughput ({tput['setup']})")
    print(f"  {tput['tokens_per_s_total']} tokens/s total, {tput['tokens_per_s_per_device']} per device, "
          f"step {tput['step_time_s']} s, loss {tput['first_loss']:.3f} -> {tput['last_loss']:.3f}")
    print(f"  data wait {tput['data_wait_pct_median']}% of step time (max {tput['data_wait_pct_max']}%; "
          f"target <= 2%: {'met' if tput['meets_target'] else 'NOT met'})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
