"""TokenLoader: order, split by rank and worker, exact O(1) resume, bad data."""

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from data_pipeline import loader as loader_mod
from data_pipeline.loader import DatasetError, TokenLoader, check_compatible, read_dataset_meta
from dp_helpers import SEQ_LEN, record_shard_checksums, run_module

REPO = Path(__file__).resolve().parents[2]


def all_sequences(meta):
    """Every sequence of the dataset as a set of tuples, read without the loader."""
    out = []
    for s in meta.shards:
        raw = (meta.path / s.file).read_bytes()
        for m in range(-(-s.sequences // meta.sequences_per_member)):
            n = min(meta.sequences_per_member, s.sequences - m * meta.sequences_per_member)
            stride = 512 + -(-meta.sequences_per_member * meta.sample_bytes // 512) * 512
            start = m * stride + 512
            out += [tuple(r) for r in np.frombuffer(raw[start:start + n * meta.sample_bytes],
                                                    np.uint16).reshape(n, -1).tolist()]
    return out


def rows(batches):
    """Each sample of the batches as the full seq_len + 1 token tuple."""
    return [tuple(i) + (l[-1],) for b in batches
            for i, l in zip(b["input_ids"].tolist(), b["labels"].tolist())]


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def test_batches_are_int64_inputs_and_shifted_labels(dp_dataset):
    loader = TokenLoader(dp_dataset.path, batch_size=3, seq_len=SEQ_LEN, num_workers=0)
    batch = take(loader, 1)[0]
    assert set(batch) == {"input_ids", "labels"}
    assert batch["input_ids"].shape == batch["labels"].shape == (3, SEQ_LEN)
    assert batch["input_ids"].dtype == batch["labels"].dtype == torch.int64
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    assert (batch["input_ids"] == dp_dataset.eos_id).any()  # packed documents, no padding


def test_ranks_split_an_epoch_without_overlap(dp_dataset):
    world, bs = 3, 4
    every = all_sequences(dp_dataset)
    assert len(set(every)) == len(every)  # the sample corpus has no duplicate sequences
    seen = []
    for rank in range(world):
        loader = TokenLoader(dp_dataset.path, batch_size=bs, seq_len=SEQ_LEN, rank=rank,
                             world_size=world, num_workers=2, seed=7)
        seen += rows(take(loader, loader.batches_per_epoch))
    assert len(seen) == len(set(seen)) == world * loader.batches_per_epoch * bs
    assert set(seen) <= set(every)
    assert len(every) - len(seen) < world * bs + world  # only the per-epoch remainder is left


def test_each_epoch_is_reshuffled_and_seeded(dp_dataset):
    def epoch_rows(seed, epoch):
        loader = TokenLoader(dp_dataset.path, batch_size=4, seq_len=SEQ_LEN, num_workers=0,
                             seed=seed)
        return rows(take(loader, loader.batches_per_epoch * (epoch + 1))[-loader.batches_per_epoch:])

    e0, e1 = epoch_rows(1, 0), epoch_rows(1, 1)
    assert e0 != e1 and len(set(e0) & set(e1)) > 0.9 * len(e0)
    assert epoch_rows(1, 0) == e0  # same seed, same order
    assert epoch_rows(2, 0) != e0


def test_rank_order_does_not_depend_on_worker_count(dp_dataset):
    kw = dict(batch_size=2, seq_len=SEQ_LEN, rank=1, world_size=2, seed=3)
    ref = rows(take(TokenLoader(dp_dataset.path, num_workers=0, **kw), 25))
    assert rows(take(TokenLoader(dp_dataset.path, num_workers=3, **kw), 25)) == ref


@pytest.mark.parametrize("workers_before,workers_after", [(2, 2), (2, 3), (0, 2)])
def test_resume_continues_exactly_across_epochs_for_every_rank(dp_dataset, workers_before,
                                                                workers_after):
    world, bs = 2, 3
    for rank in range(world):
        kw = dict(batch_size=bs, seq_len=SEQ_LEN, rank=rank, world_size=world, seed=11)
        first = TokenLoader(dp_dataset.path, num_workers=workers_before, **kw)
        per_epoch = first.batches_per_epoch
        total, stop = per_epoch + 10, per_epoch - 5  # the restart falls before an epoch boundary
        uninterrupted = rows(take(TokenLoader(dp_dataset.path, num_workers=workers_before, **kw),
                                  total))
        before = rows(take(first, stop))
        state = json.loads(json.dumps(first.state_dict()))  # goes through a checkpoint
        resumed = TokenLoader(dp_dataset.path, num_workers=workers_after, **kw)
        resumed.load_state_dict(state)
        after = rows(take(resumed, total - stop))
        assert before + after == uninterrupted
        assert resumed.epoch == 1 and resumed.state_dict()["batches"] == total


def test_resume_reads_only_the_batches_it_delivers(dp_dataset, monkeypatch):
    kw = dict(batch_size=4, seq_len=SEQ_LEN, num_workers=0, seed=5)
    first = TokenLoader(dp_dataset.path, **kw)
    take(first, 30)
    resumed = TokenLoader(dp_dataset.path, **kw)
    resumed.load_state_dict(first.state_dict())
    reads = []
    real = os.preadv
    monkeypatch.setattr(loader_mod.os, "preadv", lambda fd, bufs, off: reads.append(off) or real(fd, bufs, off))
    take(resumed, 2)
    assert len(reads) == 2 * 4  # one read per delivered sequence, nothing replayed


def test_state_from_another_global_batch_is_refused(dp_dataset):
    a = TokenLoader(dp_dataset.path, batch_size=4, seq_len=SEQ_LEN, world_size=2, num_workers=0)
    b = TokenLoader(dp_dataset.path, batch_size=4, seq_len=SEQ_LEN, world_size=4, num_workers=0)
    with pytest.raises(ValueError, match="global_batch: checkpoint 8, now 16"):
        b.load_state_dict(a.state_dict())


def step_rows(dp_dataset, world: int, bs: int, global_batch: int, steps: int, start: dict | None = None):
    """The sequences each optimizer step consumes over all ranks (a set per step), and rank 0's state."""
    accum = global_batch // (world * bs)
    loaders = [TokenLoader(dp_dataset.path, batch_size=bs, seq_len=SEQ_LEN, rank=r, world_size=world,
                           num_workers=0, seed=5, global_batch_size=global_batch) for r in range(world)]
    for loader in loaders:
        if start is not None:
            loader.load_state_dict(start)
    per_rank = [rows(take(loader, steps * accum)) for loader in loaders]
    per_step = [set().union(*(rank[i * accum * bs:(i + 1) * accum * bs] for rank in per_rank)) for i in range(steps)]
    return per_step, loaders[0].state_dict()


@pytest.mark.parametrize("before, after", [((2, 4), (4, 2)), ((4, 2), (2, 4)), ((2, 4), (1, 8))])
def test_resume_on_another_world_size_consumes_the_same_sequences_per_step(dp_dataset, before, after):
    """Global batch 16: 2 ranks x 4 x 2 micro-batches -> 4 ranks x 2 (and back, and 1 rank x 8 x 2)."""
    global_batch = 16
    per_epoch = TokenLoader(dp_dataset.path, batch_size=4, seq_len=SEQ_LEN, world_size=4, num_workers=0,
                            global_batch_size=global_batch).batches_per_epoch  # optimizer steps per epoch
    steps, stop = per_epoch + 3, per_epoch - 2  # the change of world size falls before an epoch boundary
    uninterrupted, _ = step_rows(dp_dataset, *before, global_batch, steps)
    first, state = step_rows(dp_dataset, *before, global_batch, stop)
    state = json.loads(json.dumps(state))  # goes through a checkpoint
    resumed, _ = step_rows(dp_dataset, *after, global_batch, steps - stop, start=state)
    assert first + resumed == uninterrupted
    assert all(len(s) == global_batch for s in uninterrupted)  # nothing read twice within a step


def test_position_between_batches_of_the_new_layout_is_refused(dp_dataset):
    a = TokenLoader(dp_dataset.path, batch_size=2, seq_len=SEQ_LEN, world_size=2, num_workers=0,
                    global_batch_size=8)
    take(a, 1)  # mid-step: 4 sequences consumed; 2 ranks x 4 would need a multiple of 8
    b = TokenLoader(dp_dataset.path, batch_size=4, seq_len=SEQ_LEN, world_size=2, num_workers=0,
                    global_batch_size=8)
    with pytest.raises(ValueError, match="4 sequences were consumed, not a whole number of batches"):
        b.load_state_dict(a.state_dict())


def test_mismatched_training_config_is_refused_with_both_values(dp_dataset):
    meta = read_dataset_meta(dp_dataset.path)
    with pytest.raises(DatasetError, match="seq_len: dataset has 64, training config has 128"):
        check_compatible(meta, seq_len=128)
    with pytest.raises(DatasetError, match="dtype: dataset stores uint16, training config expects uint32"):
        check_compatible(meta, seq_len=64, dtype="uint32")
    with pytest.raises(DatasetError, match="vocab_size: dataset tokenizer has 512 ids, model has 256"):
        check_compatible(meta, seq_len=64, vocab_size=256)
    check_compatible(meta, seq_len=64, vocab_size=1024, dtype="uint16")
    with pytest.raises(DatasetError, match="training config has 32"):
        TokenLoader(dp_dataset.path, batch_size=2, seq_len=32)


def test_missing_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match=f"no dataset.json in {tmp_path}.*preprocess.sh"):
        TokenLoader(tmp_path, batch_size=2, seq_len=SEQ_LEN)


def test_truncated_shard_is_named_or_skipped_and_counted(dp_copy):
    meta = read_dataset_meta(dp_copy)
    victim = meta.shards[1]
    with open(dp_copy / victim.file, "r+b") as f:
        f.truncate(victim.bytes // 2)
    with pytest.raises(DatasetError, match=f"1 bad shard.*{victim.file}: .*truncated.*skip_bad_shards"):
        TokenLoader(dp_copy, batch_size=2, seq_len=SEQ_LEN)
    loader = TokenLoader(dp_copy, batch_size=2, seq_len=SEQ_LEN, skip_bad_shards=True,
                         num_workers=0)
    assert loader.skipped_shards == [victim.file]
    assert sum(loader.plan.counts) == meta.total_sequences - victim.sequences
    assert len(take(loader, loader.batches_per_epoch + 1)) == loader.batches_per_epoch + 1


def test_corrupt_member_header_names_the_shard(dp_copy):
    meta = read_dataset_meta(dp_copy)
    for s in meta.shards:  # garble every member header; the data stays in place
        with open(dp_copy / s.file, "r+b") as f:
            for m in range(-(-s.sequences // meta.sequences_per_member)):
                stride = 512 + -(-meta.sequences_per_member * meta.sample_bytes // 512) * 512
                f.seek(m * stride)
                f.write(b"garbage!" * 4)
    record_shard_checksums(dp_copy)
    loader = TokenLoader(dp_copy, batch_size=2, seq_len=SEQ_LEN, num_workers=1)
    with pytest.raises(DatasetError, match=r"shard .*corpus-0000\d-\d{5}\.tar: member \d+"):
        take(loader, 1)


def test_out_of_range_token_ids_are_refused(dp_copy):
    meta = read_dataset_meta(dp_copy)
    for s in meta.shards:
        with open(dp_copy / s.file, "r+b") as f:
            f.seek(512)
            f.write(np.full(meta.sequences_per_member * meta.sample_tokens, 60000, np.uint16).tobytes())
    record_shard_checksums(dp_copy)
    loader = TokenLoader(dp_copy, batch_size=meta.total_sequences // 2, seq_len=SEQ_LEN, num_workers=0)
    with pytest.raises(DatasetError, match="token id 60000 >= vocab_size 512 in shard"):
        take(loader, 1)


def test_isolation_mode_reports_throughput_and_latency(dp_dataset):
    r = run_module("data_pipeline.isolation", dp_dataset.path, "--seq-len", SEQ_LEN,
                   "--batch-size", 4, "--batches", 40, "--num-workers", 1, "--no-pin-memory")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["batches"] == 40 and report["tokens"] == 40 * 4 * SEQ_LEN and report["pin_memory"] is False
    assert report["tokens_per_s"] > 0 and 0 < report["fetch_ms_p50"] <= report["fetch_ms_p99"]
    assert report["padding_fraction"] == 0.0


def test_validate_names_each_bad_shard_and_shows_progress(dp_copy):
    meta = read_dataset_meta(dp_copy)
    r = run_module("data_pipeline.validate", dp_copy, "--seq-len", SEQ_LEN)
    assert r.returncode == 0 and json.loads(r.stdout)["ok"], r.stderr
    assert f"validate {meta.path}: 100.0% (" in r.stderr and ", eta 0:00:00" in r.stderr  # the log line at the end
    victim = meta.shards[1]
    with open(dp_copy / victim.file, "r+b") as f:
        f.truncate(victim.bytes // 2)
    r = run_module("data_pipeline.validate", dp_copy)
    assert r.returncode == 1 and json.loads(r.stdout)["bad_shards"] == [victim.file]
    assert f"problem: {victim.file}: {victim.bytes // 2} bytes, dataset.json says {victim.bytes}" in r.stderr
    (dp_copy / "dataset.json").unlink()
    r = run_module("data_pipeline.validate", dp_copy)
    assert r.returncode == 2 and r.stderr.startswith(f"error: no dataset.json in {dp_copy}")


def test_a_stalled_worker_is_an_error_after_the_timeout_not_a_silent_wait(dp_dataset):
    """A worker stopped mid-run (what a hung file system read looks like) ends in the loop's next()."""
    import gc
    import signal
    import time
    from pathlib import Path

    loader = TokenLoader(dp_dataset.path, batch_size=2, seq_len=SEQ_LEN, num_workers=1, prefetch_factor=1,
                         timeout_s=1)
    batches = iter(loader)
    next(batches)
    me = str(os.getpid())
    workers = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat")
               if p.read_text().rsplit(")", 1)[1].split()[1] == me]
    assert workers, "no DataLoader worker found"
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
            for _ in range(10):
                next(batches)
        # The error arrives after the 1 s timeout plus the DataLoader's shutdown of the stopped
        # worker (joins of up to 5 s each), not never.
        assert time.monotonic() - start < 30
    finally:
        # Let the stopped worker run again so the DataLoader shuts it down itself: a worker killed
        # here would reach the DataLoader's SIGCHLD handler and fail whatever test runs next.
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
        batches.close()
        del batches
        gc.collect()


def test_workers_die_with_the_trainer(dp_dataset, tmp_path):
    """A trainer that fails leaves at once (os._exit, or SIGKILL here): its loader workers go with it, so the
    node's launcher sees the failure without waiting for torch's 5-second check of the parent."""
    trainer = subprocess.Popen([sys.executable, "-c", f"""
import sys
sys.path.insert(0, {str(REPO / "jobs")!r})
from data_pipeline.loader import TokenLoader
batches = iter(TokenLoader({str(dp_dataset.path)!r}, batch_size=2, seq_len={SEQ_LEN}, num_workers=2))
next(batches)
print("ready", flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert trainer.stdout.readline() == "ready\n"
    workers = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat")
               if _parent(p) == trainer.pid]
    assert len(workers) == 2
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 2  # torch's own check of the parent comes every 5 s
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers)


def _parent(stat: Path) -> int:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
