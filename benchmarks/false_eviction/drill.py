"""The eviction drill's run (tests/training/test_slurm_eviction.py and this benchmark): the tiny preset on 2
of the local cluster's 3 nodes, 2 ranks on each (a node judged by its ranks' median, as a GPU node's 8),
40 steps logged every 2, eviction on, a straggler at 400 % over the other node in 2 of the last 5 log
intervals (the rule: training/resilience/straggler_rule.py).

Deterministic (train.deterministic): DDP on 4 ranks reduces each parameter alone. Otherwise the resumed
run's first step sums its gradients in DDP's first bucket layout where the uninterrupted run had
re-laid its buckets, and more than two ranks sum an element in an order that depends on where it sits
in its bucket (training/parallel/distributed.py, reduce_each_parameter). Measured without it: two unslowed
runs repeated each other bit for bit, and a run evicted at step 14 parted from them in the 7th digit from
step 18 on (one evicted at 12: from step 34).

2 intervals, not 3 (measured with one rank per node): the CPU quota that slows a rank
(local_cluster/cpu_limit.py, 1 ms per 10 ms) is enforced at the kernel's scheduler ticks, so a 2.5 ms
probe sometimes runs whole at full speed (measured: 2.5, 11 and 21 ms in turn for the same work). A
limited rank then measured 1,621, 544, 3, 922, ..., 666, 659, 1, 697, 1,871 % over its peer (CI at
2ab3896): streaks of 2, never 3, and no eviction. The runs below had no
unslowed interval over 400 % at all, so asking 2 in a row changes none of their outcomes.

The tiny recipe turns eviction off; on here, with a margin for two shared cores. Measured with this
benchmark at one rank per node: a rank of an unslowed run was at most 137 % over its peer on a quiet
machine and 273 % beside two CPU-bound processes at nice 10 (how `make test` runs its other half), where
a 100 % margin evicted a healthy node in 2 runs of 9; a rank given 10 % of a CPU is 655-1,390 % over.
At 2 ranks per node the unslowed node was at most 134-263 % over the other (8 runs beside other work),
the slowed one 731-1,305 %.
"""

STEPS, INTERVAL, MARGIN, INTERVALS, WINDOW = 40, 2, 4.0, 2, 5
# The cluster keeps a spare node free for the requeue: an eviction waits for no replacement, so it is worth it
# however little of the run is left (train.straggler_evict_cost_s 0; the plan sets dev's models' to a real wait).
RUN = (f"train.steps={STEPS}", "checkpoint.every=10", f"log.interval={INTERVAL}", "optim.warmup_steps=3",
       "train.micro_batch_size=8", "train.deterministic=true",  # 4 ranks x 8: the global batch of 32
       f"train.straggler_margin={MARGIN}", f"train.straggler_intervals={INTERVALS}",
       f"train.straggler_window={WINDOW}", "train.straggler_evict=true", "train.straggler_evict_cost_s=0",
       "train.watchdog_floor_s=60")
RANKS = {"NPROC_PER_NODE": "2"}  # the job's environment: 2 workers per (CPU-only) node
