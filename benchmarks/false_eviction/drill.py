"""The eviction drill's run (tests/training/test_slurm_eviction.py and this benchmark): the tiny preset on 2
of the local cluster's 3 nodes, 40 steps logged every 2, eviction on, a straggler at 400 % over the
median of the others for 3 log intervals in a row.

The tiny recipe turns eviction off; on here, with a margin for two shared cores. Measured with this
benchmark: a rank of an unslowed run was at most 137 % over its peer on a quiet machine and 273 % beside
two CPU-bound processes at nice 10 (how `make test` runs its other half), where a 100 % margin evicted
a healthy node in 2 runs of 9; a rank given 10 % of a CPU is 655-1,390 % over.
"""

STEPS, INTERVAL, MARGIN, INTERVALS = 40, 2, 4.0, 3
RUN = (f"train.steps={STEPS}", "checkpoint.every=10", f"log.interval={INTERVAL}", "optim.warmup_steps=3",
       f"train.straggler_margin={MARGIN}", f"train.straggler_intervals={INTERVALS}", "train.straggler_evict=true",
       "train.watchdog_floor_s=60")
