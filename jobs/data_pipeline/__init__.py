"""Data pipeline: raw text -> packed token shards on FSx -> resumable training loader.

Modules:
  prepare      dataset (Hugging Face hub or local text/JSONL) -> N raw text files
  upload       local folder <-> s3://bucket/prefix with a SHA-256 manifest (sync / verify)
  tokenize     raw file -> packed WebDataset token shards (one Slurm array task per file)
  shards       the shard format: dataset.json, shard tar layout, per-shard index, atomic writes
  validate     check a shard folder end to end
  loader       TokenLoader: deterministic, resumable training loader over the shards
  isolation    iterate the training loader with no model and report tokens/s and latency
  sample_data  small deterministic corpus + BPE tokenizer for tests and the demo
"""
