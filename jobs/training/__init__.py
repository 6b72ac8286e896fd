"""Training payload: a Llama-style causal LM over the packed token shards, under torchrun and Slurm.

Modules:
  train       the entry point and the training loop (``python -m training.train``)
  config      the typed config: YAML file + ``section.key=value`` overrides
  models      named model presets (tiny ... 310B, Llama-2 7B/13B/70B) and FLOP counts
  distributed process groups, FSDP2/DDP wrapping, rank agreement
  optim       AdamW and the cosine learning-rate schedule
  checkpoint  asynchronous DCP checkpoints, ``latest`` pointer, fallback on a bad checkpoint
  signals     SIGUSR1/SIGTERM stop requests
  watchdog    the progress watchdog: no step in its window -> stacks + flight recorder, exit for recovery
  recovery    the batch script's decision after training: complete, requeue (retry budget), stop
  metrics     loss, tokens/s, MFU, data wait, checkpoint blocking, memory -> log, JSONL, TensorBoard
  backup      copy the final checkpoint to S3 and verify it
  demo_data   the small CPU dataset for tests and the local cluster
  plot        loss curve PNG from a run's metrics.jsonl
  local_demo  the local two-node Slurm demo: train, interrupt, requeue, resume, plot
"""
