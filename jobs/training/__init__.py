"""Training payload: a Llama-style causal LM over the packed token shards, under torchrun and Slurm.

Modules:
  train       the entry point and the training loop (``python -m training.train``)
  config      the typed config: YAML file + ``section.key=value`` overrides
  models      the Llama model built from a preset, depth-scaled weight initialization, FLOP counts
  presets     named model shapes (tiny ... 310B, Llama-2 7B/13B/70B), parameters and FLOPs; torch-free
  sizing      analytic per-GPU memory and checkpoint size (the cluster plan uses it); torch-free
  communication  the least collective traffic per layer and per step of a layout (counts, bytes); torch-free
  throughput  a step's time on the target (compute, exposed communication) and the MFU that follows; torch-free
  evaluate    validation loss on the held-out split every ``eval.every`` steps
  status      ``python -m training.status``: every model's job, progress, losses, checkpoint, cost
  cluster     the bundle's models/cluster.json: its environment's models, GPU and price, generated from
              the settings so that the bundle never needs cluster_config
  export_hf   ``python -m training.export_hf``: a checkpoint to Hugging Face format
  distributed process groups, device mesh, FSDP2/HSDP/DDP x tensor parallel, compile, rank agreement
  optim       AdamW and the cosine learning-rate schedule
  checkpoint  asynchronous DCP checkpoints, ``latest`` pointer, fallback, never a silent restart
  signals     SIGUSR1/SIGTERM stop requests
  watchdog    the progress watchdog: no step in its window -> stacks + flight recorder, exit for recovery
  recovery    the batch script's decision after training: complete, requeue (retry budget), stop
  metrics     loss, tokens/s, MFU, data wait, checkpoint blocking, memory -> log, JSONL, TensorBoard
  backup      copy the final checkpoint to S3 and verify it
  plot        loss curve PNG from a run's metrics.jsonl
  dry_run     one rank of the production job on the fake process group: memory by category
  layout_check  one production layout shrunk (its widths, 2 layers) on the ranks at hand: init, loss, memory,
              MFU, compile vs eager, as numbers for the acceptance report

The local-cluster demo and its dataset live beside the local cluster (local_cluster/), not here:
this package ships to the real cluster.
"""
