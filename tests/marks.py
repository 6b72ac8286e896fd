"""Marks for tests that need root: each adds ``root`` (which `make test-fast` leaves out) and skips
where the machine cannot give what the test needs."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


def needs_root(test):
    """For tests that mount (a tmpfs) or chown as root."""
    return pytest.mark.root(pytest.mark.skipif(os.geteuid() != 0, reason="needs root")(test))


def needs_mount_namespace(test):
    """For tests that run node scripts in a private mount namespace (unshare)."""
    skip = pytest.mark.skipif(not _can_unshare(), reason="needs root and mount namespaces (unshare)")
    return pytest.mark.root(skip(test))
