"""Shared fixtures: the sample corpus, its tokenizer and a small shard set (built once per session)."""

import shutil

import pytest

from data_pipeline.sample_data import make_sample
from data_pipeline.tokenize import tokenize_files

from dp_helpers import SEQ_LEN, SMALL


@pytest.fixture(scope="session")
def dp_sample(tmp_path_factory):
    """(raw files, tokenizer folder) of the sample corpus: 4 files, ~200 KB, 512-id BPE."""
    return make_sample(tmp_path_factory.mktemp("sample"), num_files=4, total_bytes=200_000)


@pytest.fixture(scope="session")
def dp_dataset(dp_sample, tmp_path_factory):
    """A dataset of several small shards per file (1 KiB members), seq_len 64. Read-only."""
    files, tok = dp_sample
    out = tmp_path_factory.mktemp("shards")
    return tokenize_files(files, tok, out, SEQ_LEN, **SMALL)


@pytest.fixture
def dp_copy(dp_dataset, tmp_path):
    """A private copy of dp_dataset that a test may damage."""
    dst = tmp_path / "shards"
    shutil.copytree(dp_dataset.path, dst)
    return dst

