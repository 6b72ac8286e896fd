"""The straggler probe's noise on a healthy GPU, fitted to its measurement on an H200, for the stand-ins and the
straggler study (benchmarks/straggler_study) to draw from.

The measurement (``python -m benchmarks.straggler_probe`` on one H200, 400 samples:
benchmarks/results/straggler_probe_H200/straggler_probe_H200.json) gives each sample over the median: 13.75 %
over 1.02, p99 1.040, 0.25 % (one sample) over 1.05, the largest 1.113. Fitted:

- the body: lognormal with median 1 and ``SIGMA`` chosen so that 13.75 % lie over 1.02 (its p99 comes out
  1.043 against the measured 1.040);
- the tail: ``TAIL_SHARE`` of the samples land ``TAIL_LOW``-``TAIL_HIGH`` over (the measured outlier was 1.113).

One GPU was measured, so the samples are drawn independently per rank and interval: nothing here is known of
what the GPUs of one node share, which the study adds as checkpoint jitter (whole nodes at once).

Pure Python (``ratio``) for the stand-in trainer, which runs without numpy; ``ratios`` draws many at once
for the study.
"""

from __future__ import annotations

import math
import random
from statistics import NormalDist

MEASURED_OVER_2PCT, MEASURED_P99, MEASURED_MAX = 0.1375, 1.0399875349773562, 1.1131468738710035
SIGMA = math.log(1.02) / NormalDist().inv_cdf(1 - MEASURED_OVER_2PCT)  # 0.0181
TAIL_SHARE, TAIL_LOW, TAIL_HIGH = 0.0025, 1.05, 1.12


def ratio(rng: random.Random) -> float:
    """One healthy probe over the median of healthy probes."""
    if rng.random() < TAIL_SHARE:
        return rng.uniform(TAIL_LOW, TAIL_HIGH)
    return math.exp(rng.gauss(0.0, SIGMA))


def ratios(rng, shape):
    """Many at once (``rng``: a numpy Generator)."""
    body = rng.lognormal(0.0, SIGMA, shape)
    tail = rng.random(shape) < TAIL_SHARE
    body[tail] = rng.uniform(TAIL_LOW, TAIL_HIGH, int(tail.sum()))
    return body
