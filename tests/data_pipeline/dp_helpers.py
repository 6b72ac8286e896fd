"""Helpers shared by the data pipeline tests."""

import hashlib
import json
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


def record_shard_checksums(dataset_dir: Path) -> None:
    """Write each shard's current SHA-256 into dataset.json: for tests of data that is bad as it was
    written (a tokenizer bug), which the loader's checksum check cannot tell from good data."""
    meta_file = Path(dataset_dir) / "dataset.json"
    meta = json.loads(meta_file.read_text())
    for shard in meta["shards"]:
        shard["sha256"] = hashlib.sha256((meta_file.parent / shard["file"]).read_bytes()).hexdigest()
    meta_file.write_text(json.dumps(meta))
