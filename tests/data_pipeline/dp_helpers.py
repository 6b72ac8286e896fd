"""Helpers shared by the data pipeline tests."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SEQ_LEN = 64
# Tiny shards, members and tokenizer batches, so the small corpus spans many of each.
SMALL = dict(shard_bytes=8 << 10, member_bytes=1 << 10, batch_bytes=4 << 10)


def run_module(module, *args, env=None, timeout=120):
    """Run ``python -m module args`` from the repo like a job would; returns CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO / "jobs"), **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
