"""The eviction drill's run (tests/training/test_slurm_eviction.py and this benchmark): the tiny preset on 2
of the local cluster's 3 nodes, 40 steps logged every 2, eviction on, a straggler at 100 % over the
median of the others for 3 log intervals in a row.

The tiny recipe turns eviction off; on here, with a margin for two shared cores: an unslowed rank was
seen 227 % over the other for one interval, never three in a row; a rank given 10 % of a CPU is ~10x.
"""

STEPS, INTERVAL, MARGIN, INTERVALS = 40, 2, 1.0, 3
RUN = (f"train.steps={STEPS}", "checkpoint.every=10", f"log.interval={INTERVAL}", "optim.warmup_steps=3",
       f"train.straggler_margin={MARGIN}", f"train.straggler_intervals={INTERVALS}", "train.straggler_evict=true",
       "train.watchdog_floor_s=60")
