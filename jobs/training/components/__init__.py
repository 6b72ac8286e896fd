"""The trainer's parts beside the model: optimizer, metrics, evaluation, determinism.

  optim        AdamW and the cosine learning-rate schedule
  metrics      loss, tokens/s, MFU, data wait, checkpoint blocking, memory -> log, JSONL, TensorBoard
  evaluate     validation loss on the held-out split every ``eval.every`` steps
  determinism  seeds and deterministic kernels, so that a resumed run repeats the same losses
"""
