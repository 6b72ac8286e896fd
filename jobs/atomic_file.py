"""The one way the job payloads write a file that readers may look at meanwhile: to a temporary
name beside it, flushed to disk, then renamed over it (``os.replace`` is atomic on POSIX file
systems, Lustre included). A reader sees the old file or the new one, never half of one.

    write_atomic(path, text_or_bytes)
    with atomic_open(path, "wb") as f:   # for files written in pieces (shards, raw text parts)
        ...
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def temporary_name(path: Path) -> Path:
    """A temporary name beside ``path``, unique per writer (array tasks may race on dataset.json)."""
    return path.with_name(f"{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success fsync it and rename it over ``path``.

    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
