"""Cost of the corruption checks on one rank: the at-rest digest (training/resilience/replicas.py) and the
sampled replay (training/resilience/replay.py), against the training step they guard.

    .venv/bin/python -m benchmarks.replica_check.checks [--hidden 768] [--layers 8] [--rounds 7] [--read-gb-s 677] [--out FILE]

One gloo rank of this machine (its GPU, else its CPU) trains a Llama-shaped model with AdamW
(benchmarks/training/checkpoint.py's OneProcess: one micro-batch per step, so the replay's extra
forward and backward is as large a share of the step as it can be). Measured in ``--rounds`` rounds,
each timing all four side by side, so other work on a shared machine slows them alike; the medians, and
the shares of step time as medians of each round's ratio:

- ``step_s``: forward, backward and the optimizer step;
- ``digest_s``: the digest of parameters and optimizer state the trainer takes after every optimizer
  step and before the next (and again before every save, and every ``train.replica_check_every`` steps);
- ``forward_backward_s``: one micro-batch's forward and backward;
- ``replay_extra_s``: a replayed micro-batch (``Replay.check``: two runs, digests, comparison) less
  one plain forward and backward: what a replay adds to its step.

Reported as fractions of step time at the config's defaults: the digest twice a step, the replay every
``train.replay_every`` steps; then, for each prod model, the digest of its rank's share at this device's
rate against its step (FLOPs at the plan's MFU), and the replay's measured share over its interval.
Target: each under 1 % of prod's steps; exit 1 if a model misses it. Also counted: replays
whose two runs differed (bit-exact comparison; none on a CPU; on a GPU without deterministic kernels,
what ``train.replay_tolerance`` must allow for).
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "jobs")]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from cli import ArgumentParser  # noqa: E402
from cluster_config.model_jobs import bundled_cluster  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.dry_run import load_model_config, production_setup  # noqa: E402
from training.models.llama import count_parameters, flops_per_token, hf_config  # noqa: E402
from training.parallel import distributed  # noqa: E402
from training.resilience.replay import Replay  # noqa: E402
from training.resilience.replicas import ReplicaMismatch, state_sums  # noqa: E402

from benchmarks.replica_check.__main__ import PEAK_FLOPS, PLAN_MFU, elapsed  # noqa: E402
from benchmarks.training.checkpoint import OneProcess  # noqa: E402

TARGET = 0.01  # of step time, each check


def prod_shares(rate: float, replay_extra_over_step: float) -> list[dict]:
    """Each prod model's shares of its step at this device's digest rate: its rank's parameters and AdamW state
    (12 bytes a parameter over the ranks sharding them) digested every step, the step's seconds from the
    model's FLOPs at the plan's MFU; the replay as measured here (one micro-batch per step: an upper bound)."""
    cluster, rows = bundled_cluster("prod"), []
    for model in cluster.models:
        raw, world_size, _ = production_setup(model, cluster)
        cfg = load_model_config(raw)
        config = hf_config(cfg.model.preset, cfg.model.vocab_size or 32000, cfg.data.seq_len)
        params, _ = count_parameters(config)
        shards = {"ddp": 1, "hsdp": cfg.train.hsdp_shard_size}.get(cfg.train.parallelism, world_size)
        step_flops = flops_per_token(config, cfg.data.seq_len) * cfg.train.global_batch_size * cfg.data.seq_len
        step_s = step_flops / (world_size * PEAK_FLOPS["cuda"] * PLAN_MFU)
        digest_s = 12 * params / shards / rate
        rows.append({"model": model, "preset": cfg.model.preset, "layout": f"{cfg.train.parallelism} x tp "
                     f"{cfg.train.tensor_parallel}", "world_size": world_size, "step_s": step_s, "digest_s": digest_s,
                     "digest_fraction": digest_s * (2 + 1 / cfg.train.replica_check_every) / step_s,
                     "replay_fraction": replay_extra_over_step / cfg.train.replay_every})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=768, help="model width (default 768)")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers (default 8)")
    parser.add_argument("--rounds", type=int, default=7, help="measurement rounds (default 7)")
    parser.add_argument("--read-gb-s", type=float, help="prod's digest at this read rate, GB/s (e.g. 677: "
                        "benchmarks/results/replica_check_H200/), not this device's")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/corruption_checks.json")
    args = parser.parse_args(argv)
    one = OneProcess.build(args.hidden, args.layers)
    model, optimizer, device = one.model, one.optimizer, one.d.device
    inputs, labels = one.batch[:, :-1].to(device), one.batch[:, 1:].to(device)

    def forward_backward() -> torch.Tensor:
        loss = F.cross_entropy(model(input_ids=inputs).logits.flatten(0, 1), labels.flatten())
        loss.backward()
        return loss.detach()

    defaults = TrainConfig()
    replay = Replay(model, one.d, [socket.gethostname()], every=defaults.replay_every, tolerance=0.0)
    one.train_step()  # builds the optimizer state the digest reads; warms up
    rounds, mismatches = [], 0
    for _ in range(args.rounds):  # each round's four figures side by side: other work slows them alike
        step = elapsed(one.train_step, device)
        digest = elapsed(lambda: state_sums(model, optimizer)[1].cpu(), device)
        model.zero_grad(set_to_none=True)
        plain = elapsed(forward_backward, device)
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        try:
            replay.check(0, forward_backward)
        except ReplicaMismatch:  # a GPU without deterministic kernels: the two runs differ by rounding
            mismatches += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        rounds.append((step, digest, plain, time.perf_counter() - start))
    step_s, digest_s, plain_s, replay_s = (statistics.median(r[i] for r in rounds) for i in range(4))
    digest_share = statistics.median(r[1] / r[0] for r in rounds)
    replay_share = statistics.median((r[3] - r[2]) / r[0] for r in rounds)
    state_bytes = one.state_bytes
    result = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "hidden": args.hidden, "layers": args.layers, "state_bytes": state_bytes, "step_s": step_s,
        "digest_s": digest_s, "digest_gb_per_s": state_bytes / digest_s / 1e9, "forward_backward_s": plain_s,
        "replay_extra_s": replay_s - plain_s, "replica_check_every": defaults.replica_check_every,
        "replay_every": defaults.replay_every,
        # the digest after every step and before the next, again at every check; the replay's extra once per interval
        "digest_fraction": digest_share * (2 + 1 / defaults.replica_check_every),
        "replay_extra_over_step": replay_share, "replay_fraction": replay_share / defaults.replay_every,
        "rounds": args.rounds, "replays_differing": mismatches, "target_fraction": TARGET}
    print(f"{result['device']}: {state_bytes / 2**20:.0f} MiB of parameters and AdamW state, step "
          f"{step_s * 1e3:.1f} ms; digest {digest_s * 1e3:.2f} ms ({result['digest_gb_per_s']:.1f} GB/s): "
          f"{100 * result['digest_fraction']:.3f} % of step time; replay adds {result['replay_extra_s'] * 1e3:.1f} ms "
          f"({(replay_s - plain_s) / plain_s:.2f} x a forward and backward), every {defaults.replay_every} steps: "
          f"{100 * result['replay_fraction']:.3f} % of step time; {mismatches} of {args.rounds} replays differed "
          f"bit for bit from their first run")
    rate = args.read_gb_s * 1e9 if args.read_gb_s else state_bytes / digest_s
    result["prod_read_gb_s"] = rate / 1e9
    result["prod"] = prod_shares(rate, replay_share)
    for row in result["prod"]:
        print(f"  {row['model']} ({row['preset']}, {row['layout']}, {row['world_size']} GPUs): digest "
              f"{row['digest_s'] * 1e3:.1f} ms at {rate / 1e9:.0f} GB/s, {100 * row['digest_fraction']:.3f} % of its "
              f"{row['step_s']:.1f} s step; replay {100 * row['replay_fraction']:.3f} %")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    distributed.shutdown()
    # Judged on prod's steps: this model's step holds 256 tokens, so its digest share says little about them.
    met = all(row["digest_fraction"] < TARGET and row["replay_fraction"] < TARGET for row in result["prod"])
    print(f"target < {100 * TARGET:g} % of prod's step time each: {'met' if met else 'MISSED'}"
          f"{'' if device.type == 'cuda' or args.read_gb_s else ' (at a CPU read rate: a GPU reads 100s of times faster)'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
