"""The shared file systems as the head node sees them: size and free bytes (statvfs), and which holds a path."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Usage:
    path: str  # the mount point as given, e.g. /fsx/checkpoints
    size: int
    free: int  # bytes available to users (not root's reserve)


def usage(path: str) -> Usage:
    """OSError if it is not there."""
    st = os.statvfs(path)
    return Usage(path, st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)


def holding(mounts: list[str], path: str | Path) -> str | None:
    """The one of ``mounts`` that ``path`` lies under (the deepest), else None."""
    path = Path(path)
    under = [m for m in mounts if path == Path(m) or Path(m) in path.parents]
    return max(under, key=lambda m: len(Path(m).parts), default=None)


def folder_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (a checkpoint: one file per rank and a little metadata)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
