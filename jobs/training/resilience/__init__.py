"""What happens when something goes wrong: stop requests, hangs, slow or corrupt nodes, and the job's next move.

  signals         SIGUSR1/SIGTERM stop requests, answered at a step boundary
  watchdog        no step in its window -> stacks and flight recorder dumped, exit for recovery
  heartbeat       each node's beats in the job's store: a node not heard for train.peer_timeout_s -> exit for recovery
  stragglers      each rank's probes, data wait and arrival gathered; a slow node named and evicted (the trainer's side)
  straggler_rule  the rule: one figure per node and cause, k of the last w intervals; torch-free (the study and
                  the simulation use it too)
  replicas        digests of parameters and optimizer state: unchanged at rest, alike across their copies
  replay          one micro-batch computed twice, compared: a transient compute error on one rank
  node_suspect    the node a failure points at, written for the Slurm epilog to drain
  recovery        ``python -m training.resilience.recovery``: the batch script's decision after training
                  (complete, requeue within the retry budget, or stop)
"""
