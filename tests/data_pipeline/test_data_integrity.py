"""Bad data the cheap checks cannot see: a shard rewritten in place, a dataset.json field of the wrong kind."""

import hashlib
import itertools
import json
import logging
import re

import numpy as np
import pytest

from data_pipeline.loader import DatasetError, TokenLoader, read_dataset_meta
from dp_helpers import SEQ_LEN, run_module


def test_shard_rewritten_in_place_with_valid_ids_is_refused_before_the_first_batch(dp_copy):
    meta = read_dataset_meta(dp_copy)
    loader = TokenLoader(dp_copy, batch_size=2, seq_len=SEQ_LEN, num_workers=1)
    first_batch = set(loader.plan.locate(0)[0].tolist())
    victim = next(s for i, s in enumerate(meta.shards) if i not in first_batch)  # one reader owns every shard
    path = dp_copy / victim.file
    with open(path, "r+b") as f:  # same size, every id in range: only the checksum can tell
        f.seek(512)
        f.write(np.full(meta.sample_tokens, meta.eos_id, np.uint16).tobytes())
    assert path.stat().st_size == victim.bytes
    actual = hashlib.sha256(path.read_bytes()).hexdigest()

    loader = TokenLoader(dp_copy, batch_size=2, seq_len=SEQ_LEN, num_workers=1)  # the startup check passes
    with pytest.raises(DatasetError) as refused:
        next(iter(loader))
    message = str(refused.value)
    assert message.startswith(f"shard {path}: SHA-256 is {actual}, dataset.json says {victim.sha256}")
    assert "jobs/preprocess.sh" in message and "data_pipeline.upload restore" in message
    assert "Traceback" not in message  # the worker's own message, not torch's re-raise around it


def test_each_shard_is_hashed_once_per_process(dp_copy, caplog):
    """However often the readers reopen a shard (every epoch, every new loader), it is hashed once."""
    caplog.set_level(logging.DEBUG, logger="data_pipeline.loader")
    meta = read_dataset_meta(dp_copy)
    for _ in range(2):
        loader = TokenLoader(dp_copy, batch_size=4, seq_len=SEQ_LEN, num_workers=0)
        for _ in range(2):  # a new reader per iteration
            list(itertools.islice(iter(loader), 2 * loader.batches_per_epoch))
    hashed = [r.getMessage() for r in caplog.records if "SHA-256 verified" in r.getMessage()]
    assert sorted(hashed) == sorted(f"shard {dp_copy / s.file}: SHA-256 verified" for s in meta.shards)


@pytest.mark.parametrize("field, value, name", [
    ("seq_len", "64x", "seq_len"),
    ("seq_len", 64.5, "seq_len"),
    ("sequences_per_member", 0, "sequences_per_member"),
    ("shards", None, "shards"),
])
def test_dataset_json_field_of_the_wrong_kind_names_the_file_and_field(dp_copy, field, value, name):
    meta_file = dp_copy / "dataset.json"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), field: value}))
    with pytest.raises(DatasetError, match=rf"^{re.escape(f'{meta_file}: field {name} is {value!r}, not ')}.*"
                                           rf"{re.escape(f'python -m data_pipeline.tokenize finalize {dp_copy}')}"):
        TokenLoader(dp_copy, batch_size=2, seq_len=SEQ_LEN)


def test_shard_entry_of_the_wrong_kind_exits_2_naming_it(dp_copy):
    meta_file = dp_copy / "dataset.json"
    raw = json.loads(meta_file.read_text())
    raw["shards"][1]["bytes"] = "8 KiB"
    meta_file.write_text(json.dumps(raw))
    r = run_module("data_pipeline.validate", dp_copy)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"error: {meta_file}: field shards[1].bytes is '8 KiB', not an integer")


def test_each_shard_is_hashed_by_one_reader_of_the_job_before_its_first_batch(dp_copy, caplog):
    """Ranks x workers readers split the shards: the dataset is read once more per job start, not once
    per reader (each reader opens nearly every shard: the order is a global shuffle)."""
    caplog.set_level(logging.DEBUG, logger="data_pipeline.loader")
    meta = read_dataset_meta(dp_copy)
    world_size = 2
    hashed_by_rank = []
    for rank in range(world_size):
        caplog.clear()
        loader = TokenLoader(dp_copy, batch_size=2, seq_len=SEQ_LEN, rank=rank, world_size=world_size,
                             num_workers=0)
        next(iter(loader))  # one batch: its owned shards are hashed before it, whichever it reads
        hashed_by_rank.append({r.getMessage() for r in caplog.records if "SHA-256 verified" in r.getMessage()})
    assert all(hashed_by_rank) and not hashed_by_rank[0] & hashed_by_rank[1]
    assert hashed_by_rank[0] | hashed_by_rank[1] == {f"shard {dp_copy / s.file}: SHA-256 verified"
                                                     for s in meta.shards}
