"""Stop requests from Slurm, acted on at the next step boundary.

``#SBATCH --signal=USR1@<lead>`` sends SIGUSR1 ahead of the time limit; ``scancel`` and the time
limit itself send SIGTERM. A handler only records the request: ranks agree on it together at a
step boundary (distributed.any_rank), save, and exit, so no rank stops in the middle of a
collective.
"""

from __future__ import annotations

import signal


class StopRequest:
    def __init__(self, signals=(signal.SIGUSR1, signal.SIGTERM)):
        self.signal_name: str | None = None
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        return self.signal_name is not None
