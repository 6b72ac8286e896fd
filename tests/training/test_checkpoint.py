"""Checkpointer: commit rule, keep-K on the cleaner thread, fallback past partial or corrupt checkpoints, wrong model."""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path

import pytest
import torch

from training.checkpoints.checkpointer import CheckpointMismatch, Checkpointer, NothingLoadable

IDENTITY = {"preset": "tiny", "vocab_size": 512}


def state(value: float, step: int) -> dict:
    return {"model": {"w": torch.full((64, 64), value)}, "step": step}


def saved_checkpointer(tmp_path, d, steps, *, keep=5, async_save=True) -> Checkpointer:
    ckpt = Checkpointer(tmp_path, keep=keep, async_save=async_save, d=d, identity=IDENTITY)
    for step in steps:
        ckpt.save(step, state(float(step), step))
    ckpt.close()
    return ckpt


def load(ckpt: Checkpointer):
    target = state(0.0, 0)
    step = ckpt.load(target)
    return step, target["model"]["w"][0, 0].item(), target["step"]


def test_async_save_commits_latest_last_and_keeps_k(tmp_path, d):
    ckpt = Checkpointer(tmp_path, keep=2, async_save=True, d=d, identity=IDENTITY)
    ckpt.save(10, state(10.0, 10))
    live = state(20.0, 20)
    ckpt.save(20, live)
    live["model"]["w"].fill_(-1.0)  # training goes on: the save holds its own copy
    ckpt.save(30, state(30.0, 30))
    ckpt.close()
    assert (tmp_path / "latest").read_text() == "step_00000030\n"
    assert ckpt.steps() == [20, 30]  # keep=2
    meta = json.loads((tmp_path / "step_00000030/train_meta.json").read_text())
    assert meta == {"step": 30, "world_size": 1, **IDENTITY}
    assert load(ckpt) == (30, 30.0, 30)
    ckpt.latest_step()
    target = state(0.0, 0)
    Checkpointer(tmp_path, keep=2, async_save=False, d=d, identity=IDENTITY)
    assert torch.equal(target["model"]["w"], torch.zeros(64, 64))


def test_unfinished_newer_save_is_ignored(tmp_path, d):
    ckpt = saved_checkpointer(tmp_path, d, [10, 20])
    (tmp_path / "step_00000030").mkdir()  # a save that never finished: no metadata, not in latest
    (tmp_path / "step_00000030/__0_0.distcp").write_bytes(b"partial")
    assert load(ckpt) == (20, 20.0, 20)


def test_incomplete_latest_falls_back_with_a_warning(tmp_path, d, caplog):
    ckpt = saved_checkpointer(tmp_path, d, [10, 20])
    (tmp_path / "step_00000020/.metadata").unlink()
    with caplog.at_level(logging.WARNING):
        assert load(ckpt) == (10, 10.0, 10)
    assert "step_00000020 is incomplete" in caplog.text and "trying the previous one" in caplog.text


def test_corrupt_latest_falls_back_with_a_warning(tmp_path, d, caplog):
    ckpt = saved_checkpointer(tmp_path, d, [10, 20])
    for shard in (tmp_path / "step_00000020").glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:100])  # truncated by a full disk or a crash
    with caplog.at_level(logging.WARNING):
        assert load(ckpt) == (10, 10.0, 10)
    assert "step_00000020 could not be read" in caplog.text


def test_no_checkpoint_starts_fresh_and_says_so(tmp_path, d, caplog):
    ckpt = Checkpointer(tmp_path, keep=2, async_save=False, d=d, identity=IDENTITY)
    with caplog.at_level(logging.INFO):
        assert ckpt.load(state(0.0, 0)) is None
    assert "no checkpoint in" in caplog.text and "starting from step 0" in caplog.text


def test_nothing_loadable_stops_naming_each_checkpoint_and_changes_nothing(tmp_path, d):
    ckpt = saved_checkpointer(tmp_path, d, [10, 20, 30])
    (tmp_path / "step_00000030/.metadata").unlink()
    (tmp_path / "step_00000020/train_meta.json").write_text("{not json")
    for shard in (tmp_path / "step_00000010").glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:100])
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(NothingLoadable) as err:
        ckpt.load(state(0.0, 0))
    message = str(err.value)
    assert "'latest' in" in message and "names step 30 but no checkpoint loads" in message
    assert "step_00000030: is incomplete" in message
    assert "step_00000020: has an unreadable train_meta.json" in message
    assert "step_00000010: could not be read" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_complete_checkpoints_without_latest_are_not_ignored(tmp_path, d):
    ckpt = saved_checkpointer(tmp_path, d, [10])
    (tmp_path / "latest").unlink()
    with pytest.raises(NothingLoadable, match="holds complete checkpoints \\(step_00000010\\) but no readable 'latest'"):
        ckpt.load(state(0.0, 0))


def test_skipped_newer_checkpoint_is_moved_aside_not_overwritten(tmp_path, d):
    ckpt = saved_checkpointer(tmp_path, d, [10, 20])
    for shard in (tmp_path / "step_00000020").glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:100])
    assert load(ckpt) == (10, 10.0, 10)
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith("unreadable_step_00000020_")]
    assert len(aside) == 1 and not (tmp_path / "step_00000020").exists()
    resumed = Checkpointer(tmp_path, keep=5, async_save=False, d=d, identity=IDENTITY)
    resumed.save(20, state(21.0, 20))  # the resumed run reaches step 20 again: a new folder
    resumed.close()
    assert (tmp_path / aside[0]).is_dir() and load(ckpt) == (20, 21.0, 20)


def test_checkpoint_of_another_model_is_refused(tmp_path, d):
    saved_checkpointer(tmp_path, d, [10])
    other = Checkpointer(tmp_path, keep=2, async_save=False, d=d, identity={"preset": "llama2-7b", "vocab_size": 512})
    with pytest.raises(CheckpointMismatch, match="preset: checkpoint has 'tiny', config has 'llama2-7b'"):
        other.load(state(0.0, 0))


def test_pruning_runs_on_a_cleaner_thread_and_spares_the_loaded_and_newer(tmp_path, d, monkeypatch):
    saved_checkpointer(tmp_path, d, [10, 20])  # an earlier run's checkpoints
    release, calls = threading.Event(), []
    real_rmtree = shutil.rmtree

    def slow_rmtree(path, **kwargs):  # deleting a big checkpoint on Lustre takes minutes
        step_name = Path(path).name.split(".deleting-")[0]  # renamed before it is deleted
        calls.append((step_name, threading.current_thread() is threading.main_thread()))
        release.wait(timeout=60)
        real_rmtree(path, **kwargs)

    monkeypatch.setattr("training.checkpoints.checkpointer.shutil.rmtree", slow_rmtree)
    ckpt = Checkpointer(tmp_path, keep=2, async_save=False, d=d, identity=IDENTITY)
    assert load(ckpt)[0] == 20
    ckpt.save(25, state(25.0, 25))  # keep=2: step 10 goes, the loaded step 20 stays
    ckpt.save(30, state(30.0, 30))  # returns while the first deletion is still blocked
    assert not release.is_set() and ckpt.latest_step() == 30
    (tmp_path / "step_00000040").mkdir()  # a newer save in flight: never a candidate
    release.set()
    ckpt.close()
    assert ckpt.steps() == [25, 30, 40]
    assert calls == [("step_00000010", False), ("step_00000020", False)]  # never on the training thread


@pytest.mark.parametrize("async_save", [True, False], ids=["periodic", "final"])
def test_a_save_refused_for_the_models_quota_names_the_quota_and_the_fix(tmp_path, d, monkeypatch, caplog, async_save):
    """Lustre answers EDQUOT when the model's project quota is full (node_scripts/fsx_quotas.sh); the free-space check
    before a save cannot see it. The errno is injected where DCP's writer syncs each file (os.fsync): a periodic
    save is logged naming the quota and the fix and training goes on, a final one stops the run with the same."""
    import errno
    import os

    from training.checkpoints.checkpointer import NoRoomForCheckpoint

    ckpt = saved_checkpointer(tmp_path, d, [10])

    def over_quota(fd):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    ckpt = Checkpointer(tmp_path, keep=5, async_save=async_save, d=d, identity=IDENTITY)
    monkeypatch.setattr(os, "fsync", over_quota)
    quota = (f"{tmp_path} is over its model's quota (Disk quota exceeded): project {tmp_path.stat().st_uid}'s quota on "
             "the checkpoint file system")
    fix = f"`lfs quota -h -p {tmp_path.stat().st_uid} {tmp_path}`; make room"
    with caplog.at_level(logging.ERROR):
        if async_save:
            ckpt.save(20, state(20.0, 20))
            ckpt.close()
            assert quota in caplog.text and fix in caplog.text, caplog.text
        else:
            with pytest.raises(NoRoomForCheckpoint) as stopped:
                ckpt.save(20, state(20.0, 20), wait=True)
            assert quota in str(stopped.value) and fix in str(stopped.value)
            assert "`latest` still names step 10" in str(stopped.value)
            ckpt.close()
    assert (tmp_path / "latest").read_text() == "step_00000010\n" and ckpt.steps() == [10]
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name] == []
