"""The straggler rule on one figure per rank, without torch: the trainer's Detector (training/resilience/stragglers.py)
and the goodput simulation's stand-in trainer (local_cluster/stand_ins/trainer.py) both follow it.

The slowest rank's excess is its figure over the median of the other ranks', minus one; the same rank over
``margin`` for ``intervals`` intervals in a row is a straggler, reported once until it falls back or
another rank takes its place.
"""

from __future__ import annotations

import statistics


class Streak:
    def __init__(self, margin: float, intervals: int):
        self.margin, self.intervals = margin, intervals
        self.suspect, self.over, self.reported = -1, 0, False

    def update(self, figures: list[float]) -> tuple[int, float, bool]:
        """(slowest rank, its excess, whether this interval makes it a straggler)."""
        slowest = max(range(len(figures)), key=figures.__getitem__)
        median = statistics.median([f for i, f in enumerate(figures) if i != slowest] or figures)
        excess = figures[slowest] / median - 1 if median > 0 else 0.0
        if excess > self.margin and slowest == self.suspect:
            self.over += 1
        elif excess > self.margin:
            self.suspect, self.over, self.reported = slowest, 1, False
        else:
            self.suspect, self.over, self.reported = -1, 0, False
        new = self.over >= self.intervals and not self.reported
        self.reported |= new
        return slowest, excess, new
