"""Where a model's Megatron-LM run stands, from its checkpoint folder:

    python -m megatron_lm.status model8          model8: iteration 1200 of 50000 (2.4 %), job ended: stopped
    python -m megatron_lm.status model8 --verdict     complete | stopped   (pretrain.sh decides on it)

Megatron-LM records its last complete checkpoint in ``latest_checkpointed_iteration.txt`` (written
after the checkpoint itself); the run is complete once that reaches ``--train-iters`` of the model's
arguments. ``STATUS`` is what the last job ended with (pretrain.sh writes it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cli import ArgumentParser, fail

from megatron_lm.args import args_file, read_args

LATEST = "latest_checkpointed_iteration.txt"  # Megatron-LM's tracker file


def checkpointed_iteration(checkpoints: Path) -> int:
    """The iteration of the last complete checkpoint; 0 before the first."""
    tracker = checkpoints / LATEST
    text = tracker.read_text().strip() if tracker.is_file() else "0"
    return int(text) if text.isdigit() else 0  # "release": a converted checkpoint, not a run of ours


def train_iters(model: str) -> int:
    args = read_args(args_file(model))
    return int(args[args.index("--train-iters") + 1])


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m megatron_lm.status", description="Where a model's Megatron-LM run stands.")
    p.add_argument("model")
    p.add_argument("--verdict", action="store_true", help="print only complete or stopped")
    a = p.parse_args(argv)
    checkpoints = Path(os.environ.get("FSX_CHECKPOINTS", "/fsx/checkpoints")) / a.model
    try:
        total = train_iters(a.model)
    except (OSError, ValueError):
        return fail(f"model {a.model}: no Megatron-LM arguments in {args_file(a.model)}",
                    "its settings entry needs a megatron: section (docs/megatron.md)")
    done = checkpointed_iteration(checkpoints)
    if a.verdict:
        print("complete" if done >= total else "stopped")
        return 0
    status = (checkpoints / "STATUS").read_text().strip() if (checkpoints / "STATUS").is_file() else "none yet"
    print(f"{a.model}: iteration {done} of {total} ({done / total:.1%}) in {checkpoints}, job ended: {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
