"""Megatron-LM's pretrain_gpt.py as jobs/megatron_lm/pretrain.sh sees it, for nodes without a GPU (Megatron-LM
trains on CUDA only): the stand-in of the GPU step, as the local cluster's nodes stand in for nvidia-smi.

It keeps Megatron-LM's contract with the job: its rank from RANK / WORLD_SIZE, a checkpoint every
--save-interval iterations in --save (iter_NNNNNNN/, then latest_checkpointed_iteration.txt), a start from
the iteration --load names, and with --exit-signal-handler a save at the next iteration and exit 0 on SIGTERM.
Rank 0 writes the arguments it was given to <save>/argv.<restart>.json. A file <save>/fail-at holding N
makes rank 0 fail at iteration N once (the file is removed): a rank dying mid-run.
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
for flag in ("--train-iters", "--save-interval"):
    parser.add_argument(flag, type=int, required=True)
parser.add_argument("--save", type=Path, required=True)
parser.add_argument("--load", type=Path, required=True)
parser.add_argument("--exit-signal-handler", action="store_true")
args, _ = parser.parse_known_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
tracker = args.load / "latest_checkpointed_iteration.txt"
start = int(tracker.read_text()) if tracker.is_file() else 0
stop = []
if args.exit_signal_handler:
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))


def save(iteration: int) -> None:
    if rank == 0:
        (args.save / f"iter_{iteration:07d}").mkdir(parents=True, exist_ok=True)
        tracker.write_text(f"{iteration}\n")  # after the checkpoint, as Megatron-LM writes it


if rank == 0:
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    (args.save / f"argv.{restart}.json").write_text(json.dumps(sys.argv[1:]))
print(f"rank {rank} of {world}: starting at iteration {start + 1}", flush=True)
fail_at = args.save / "fail-at"
for iteration in range(start + 1, args.train_iters + 1):
    time.sleep(0.05)
    if rank == 0 and fail_at.is_file() and int(fail_at.read_text()) == iteration:
        fail_at.unlink()
        sys.exit(f"rank 0 failed at iteration {iteration}")
    if iteration % args.save_interval == 0 or stop:
        save(iteration)
    if stop:
        print(f"rank {rank}: exiting program after receiving SIGTERM at iteration {iteration}", flush=True)
        sys.exit(0)
save(args.train_iters)
print(f"rank {rank}: done at iteration {args.train_iters}", flush=True)
