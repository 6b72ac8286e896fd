"""What happens when something goes wrong: stop requests, hangs, slow or corrupt nodes, and the job's next move.

  signals         SIGUSR1/SIGTERM stop requests, answered at a step boundary
  watchdog        no step in its window -> stacks and flight recorder dumped, exit for recovery
  stragglers      each rank's probe time gathered; a slow node named and evicted (the trainer's side)
  straggler_rule  the streak rule that decides a node is slow; torch-free (the simulation uses it too)
  replicas        the replica sentinel: digests of state that ranks must hold alike, compared
  node_suspect    the node a failure points at, written for the Slurm epilog to drain
  recovery        ``python -m training.resilience.recovery``: the batch script's decision after training
                  (complete, requeue within the retry budget, or stop)
"""
