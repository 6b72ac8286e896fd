"""Hang detection: a rank that stops making progress leaves evidence and exits, so the job recovers.

A daemon thread watches the training loop's heartbeat (``step_done()`` after every optimizer step).
When no step completes within the window, the rank

  1. writes ``hang_<job>_rank<r>.txt`` in the model's log folder: what it waited for and the Python
     stack of every thread (faulthandler), which shows where it hung: a collective, the data
     loader, a checkpoint write;
  2. dumps the flight recorders (the last collectives this rank issued and their state; on when
     TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE > 0, as jobs/train.sh sets) beside it. NCCL
     and gloo record into two separate recorders: the training collectives' one (NCCL on GPUs, where
     FSDP and tensor parallel hang; gloo on CPUs) goes to ``fr_trace_<job>_rank<r>.pkl``, and on GPUs
     gloo's (the stop vote, the loss mean, the checkpoint writer) to ``fr_control_<job>_rank<r>.pkl``.
     Compare the ranks' last collectives with
     ``python -m torch.distributed.flight_recorder.fr_trace --prefix fr_trace_<job>_rank <log folder>``;
  3. names the cause in the job's failure file (``hang: ...``) and exits with ``EXIT_HANG``: the
     step ends, jobs/train.sh requeues it, and the run resumes from ``latest``.

The window is ``init_timeout_s`` until the first step (start-up, compilation, the first
collectives), then ``max(floor_s, factor x the median step time)`` measured over recent steps:
long enough for a slow step, short enough not to leave a 14-node job idle for the collective
timeout. A known long pause (a synchronous save) is covered with ``allow(seconds)``.
Every rank that is waiting fires (the stuck one cannot if it is stopped); each lingers a few
seconds after its dump so its peers' dumps are written before the job step is torn down.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import statistics
import threading
import time
from collections import deque
from pathlib import Path

log = logging.getLogger(__name__)

EXIT_HANG = 3  # any non-zero code recovers; a distinct one reads clearly in the logs


class ProgressWatchdog:
    def __init__(self, *, log_dir: str | os.PathLike, rank: int, init_timeout_s: float, floor_s: float,
                 factor: float = 10.0, failure_file: str | None = None, linger_s: float = 3.0, exit=os._exit,
                 on_gpu: bool = False):
        self.log_dir, self.rank, self.on_gpu = Path(log_dir), rank, on_gpu
        self.init_timeout_s, self.floor_s, self.factor = init_timeout_s, floor_s, factor
        self.failure_file, self.linger_s, self._exit = failure_file, linger_s, exit
        self.job = os.environ.get("SLURM_JOB_ID", "local")
        self._durations: deque[float] = deque(maxlen=50)
        self._last = time.monotonic()
        self._steps = 0
        self._allowance = 0.0  # extra seconds granted for the current wait (a known long pause)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress-watchdog", daemon=True)
        self.fired_path: Path | None = None

    def start(self) -> "ProgressWatchdog":
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()

    def step_done(self, step: int) -> None:
        now = time.monotonic()
        with self._lock:
            if self._steps:
                self._durations.append(now - self._last)
            self._steps, self._last, self._allowance = step, now, 0.0

    @contextlib.contextmanager
    def allow(self, seconds: float):
        """Grant ``seconds`` more for what runs inside (a synchronous save), then count from its end."""
        with self._lock:
            self._allowance += seconds
        try:
            yield
        finally:
            with self._lock:
                self._allowance = 0.0
                self._last = time.monotonic()

    def window(self) -> float:
        """Seconds without a step after which this rank is considered hung."""
        with self._lock:
            if len(self._durations) < 1:
                base = self.init_timeout_s
            else:
                base = max(self.floor_s, self.factor * statistics.median(self._durations))
            return base + self._allowance

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.floor_s / 4)):
            waited = time.monotonic() - self._last
            window = self.window()
            if waited > window:
                self._fire(waited, window)
                return

    def _fire(self, waited: float, window: float) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"hang_{self.job}_rank{self.rank}.txt"
        what = (f"rank {self.rank} of job {self.job}: no training step completed for {waited:.1f} s "
                f"(window {window:.1f} s; last completed step {self._steps})")
        with open(path, "w") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {what}\n"
                    "Python stacks of every thread, most recent call first:\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        traces = dump_flight_recorders(self.log_dir, f"{self.job}_rank{self.rank}", self.on_gpu)
        self.fired_path = path
        log.error("progress watchdog: %s; stacks in %s%s; exiting for recovery", what, path,
                  f", flight recorders in {', '.join(map(str, traces))}" if traces else "")
        if self.failure_file:  # the first rank to report names the cause (a rank woken later must not)
            with contextlib.suppress(OSError), open(self.failure_file, "x") as f:
                f.write(f"hang: {what}; stacks in {path}\n")
        time.sleep(self.linger_s)  # let the other waiting ranks write their dumps before the step is torn down
        self._exit(EXIT_HANG)


def flight_recorders(on_gpu: bool) -> dict[str, str]:
    """File prefix -> the torch function that dumps that recorder: the training collectives' first."""
    from torch._C import _distributed_c10d as c10d

    if on_gpu and hasattr(c10d, "_dump_nccl_trace"):  # CUDA builds only
        return {"fr_trace": "_dump_nccl_trace", "fr_control": "_dump_fr_trace"}
    return {"fr_trace": "_dump_fr_trace"}


def dump_flight_recorders(folder: Path, suffix: str, on_gpu: bool) -> list[Path]:
    """Each recorder's entries to ``<folder>/<prefix>_<suffix>.pkl``; none when they are off (buffer size 0)."""
    if not int(os.environ.get("TORCH_FR_BUFFER_SIZE", os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0")) or 0):
        return []
    from torch._C import _distributed_c10d as c10d

    written = []
    for prefix, function in flight_recorders(on_gpu).items():
        path = folder / f"{prefix}_{suffix}.pkl"
        try:
            path.write_bytes(getattr(c10d, function)())
            written.append(path)
        except Exception as exc:  # evidence is best effort: never let it block the exit
            log.warning("could not dump the flight recorder (%s): %s", function, exc)
    return written
