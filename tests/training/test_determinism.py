"""train.deterministic: what training/components/determinism.py sets (in this process, restored after each test)."""

from __future__ import annotations

import os

import pytest
import torch

from training.components.determinism import CUBLAS_WORKSPACE, set_determinism


@pytest.fixture(autouse=True)
def torch_defaults(monkeypatch):
    """Every test starts from torch's defaults, with no cuBLAS setting, and leaves them so."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = torch.backends.cudnn.benchmark = False
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2:]


def test_on_asks_for_every_deterministic_kernel_strictly():
    torch.backends.cudnn.benchmark = True
    set_determinism(True)
    assert torch.are_deterministic_algorithms_enabled()
    # Strict: warn_only would keep cuDNN attention and the non-deterministic flash backward.
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE


def test_a_cublas_setting_already_made_is_kept(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the smaller workspace torch also accepts
    set_determinism(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_off_leaves_torch_s_fast_defaults():
    set_determinism(False)
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_an_op_without_a_deterministic_version_fails_naming_itself():
    """On: a non-deterministic kernel is an error, not a silent difference after the resume."""
    set_determinism(True)
    with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
        torch.zeros(4).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))  # CPU put_ without accumulate
