"""Progress of a long step: a tqdm bar on a terminal, otherwise a line every ``every`` seconds with
the percent done, the rate and the ETA (what a Slurm log or a CI log can show).

    with Progress(total_bytes, "upload", unit="B") as progress:
        for f in files:
            ...
            progress.update(f.stat().st_size)

``update`` may be called from several threads (the upload and hashing pools do).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable


class Progress:
    def __init__(self, total: float, label: str, *, unit: str = "B", every: float = 30.0,
                 write: Callable[[str], None] | None = None, tty: bool | None = None):
        self.total, self.label, self.unit, self.every = total, label, unit, every
        self.done = 0.0
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._lock = threading.Lock()
        self.start = self._last = time.monotonic()
        self._bar = None
        if self.tty:
            from tqdm import tqdm
            self._bar = tqdm(total=total, desc=label, unit=unit, unit_scale=True)

    def update(self, n: float) -> None:
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(n)
                return
            now = time.monotonic()
            if now - self._last >= self.every:
                self._last = now
                self.write(self.line(now))

    def line(self, now: float | None = None) -> str:
        """``upload: 42.0% (4.2 GB of 10.0 GB), 120.0 MB/s, eta 0:00:48``; counts: ``(3 of 12 shards)``."""
        elapsed = max((now or time.monotonic()) - self.start, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 else None
        pct = 100 * self.done / self.total if self.total else 100.0
        if self.unit == "B":
            done = f"{_bytes(self.done)} of {_bytes(self.total)}), {_bytes(rate)}/s"
        else:
            done = f"{self.done:,.0f} of {self.total:,.0f} {self.unit}), {rate:.3g} {self.unit}/s"
        return f"{self.label}: {pct:.1f}% ({done}, eta {_duration(left)}"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            self.write(self.line())  # the last line says 100% and how long it took

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _bytes(value: float) -> str:
    for prefix in ("", "k", "M", "G", "T"):
        if abs(value) < 1000 or prefix == "T":
            return f"{value:.1f} {prefix}B"
        value /= 1000
    return f"{value:.1f} TB"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
