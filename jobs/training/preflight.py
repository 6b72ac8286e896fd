"""Checks a model's training run on the head node before it takes any node.

    python -m training.preflight MODEL [--config FILE] [section.key=value ...]

What the job would otherwise find out only after Slurm allocated its nodes:
- the config (jobs/models/<MODEL>.yaml, derived from the model's settings, or --config, with the
  overrides) parses;
- the dataset at data.path exists and matches the config: seq_len, vocabulary (the model's
  vocab_size holds every token id), dtype (the smallest that holds the vocabulary);
- the tokenizer the dataset was made with still loads and is the same one (SHA-256), and is the
  model's own (data.tokenizer); with no dataset yet, the model's tokenizer loads (a missing one: the
  error says how to fetch a gated one and upload it to the data bucket);
- the checkpoint folder can be created and written;
- with WANDB_API_KEY set: wandb imports, and whether its host answers (a warning only: training
  goes on without W&B, see metrics.Tracker).
Prints one line per check; exit 0 when all pass, 2 with ``error: <what> — <fix>`` lines otherwise.
``jobs/submit.sh`` runs it before ``sbatch``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from data_pipeline.loader import DatasetError, check_compatible, read_dataset_meta
from data_pipeline.shards import token_dtype_name
from data_pipeline.tokenizer import TokenizerError, load_tokenizer
from training.config import MODEL_CONFIGS, ConfigError, load_config
from training.models.presets import resolve

# How long preflight waits for the W&B host to accept a connection.
TRACKER_CONNECT_TIMEOUT_S = 5


def check(model: str, config: str | None, overrides: list[str]) -> list[str]:
    """Problems found (empty: ready to submit); prints what passed."""
    path = Path(config) if config else MODEL_CONFIGS / f"{model}.yaml"
    if not path.is_file() and not config:
        known = ", ".join(sorted(p.stem for p in MODEL_CONFIGS.glob("*.yaml"))) or "none"
        return [f"model {model!r} is not one of this cluster's models ({known}) — add it to models: in the "
                "settings and redeploy, or pass --config FILE"]
    try:
        cfg = load_config(path, overrides)
    except (ConfigError, FileNotFoundError) as exc:
        return [f"config {path}: {exc} — fix the file or the override"]
    print(f"ok: config {path} ({cfg.model.preset}, seq_len {cfg.data.seq_len})")

    problems = []
    try:
        meta = read_dataset_meta(cfg.data.path)
    except DatasetError as exc:
        problems.append(f"dataset: {exc} — run jobs/preprocess.sh for {model} (seq_len {cfg.data.seq_len}) "
                        "or point data.path at the right folder")
        meta = None
    if meta is not None:
        # As train.py sizes it: the architecture's (its config.json fixes it), else the config's, else the dataset's.
        vocab_size = resolve(cfg.model.preset).vocab or cfg.model.vocab_size or -(-meta.vocab_size // 64) * 64
        try:
            check_compatible(meta, seq_len=cfg.data.seq_len, vocab_size=vocab_size,
                             dtype=token_dtype_name(meta.vocab_size))
            print(f"ok: dataset {meta.path} (seq_len {meta.seq_len}, vocab {meta.vocab_size}, {meta.dtype}, "
                  f"{meta.total_tokens:,} tokens)")
        except DatasetError as exc:
            problems.append(f"{exc} — re-tokenize for this model, or fix data.path / data.seq_len")
        problems += _check_tokenizer(meta.tokenizer, cfg.data.tokenizer)
    elif cfg.data.tokenizer:  # no dataset yet: the tokenizer it will be made with must still be there
        problems += _check_own_tokenizer(cfg.data.tokenizer)
    problems += _check_writable(Path(cfg.checkpoint.dir))
    problems += _check_tracker()
    return problems


def _check_tokenizer(identity: dict, wanted: str) -> list[str]:
    """The dataset's tokenizer loads, is unchanged, and is the model's (``wanted``; '' = any)."""
    name = identity.get("name", "")
    try:
        tokenizer = load_tokenizer(name)
    except (TokenizerError, OSError, ValueError) as exc:
        return [f"tokenizer {name!r} of the dataset does not load: {exc} — make it available on the head node"]
    if identity.get("sha256") and tokenizer.identity["sha256"] != identity["sha256"]:
        return [f"tokenizer {name!r} changed since the dataset was made (SHA-256 differs) — "
                "re-tokenize, or restore the tokenizer the dataset names"]
    if wanted:
        try:
            own = load_tokenizer(wanted)
        except (TokenizerError, OSError, ValueError) as exc:
            return [_missing_tokenizer(wanted, exc)]
        if own.identity["sha256"] != tokenizer.identity["sha256"]:
            return [f"the dataset was made with tokenizer {name!r}, not the model's {wanted!r} (data.tokenizer) — "
                    "re-tokenize with MODEL=<model> sbatch jobs/preprocess.sh, or fix dataset:/tokenizer: "
                    "in the model's settings"]
    print(f"ok: tokenizer {name}")
    return []


def _check_own_tokenizer(wanted: str) -> list[str]:
    try:
        load_tokenizer(wanted)
    except (TokenizerError, OSError, ValueError) as exc:
        return [_missing_tokenizer(wanted, exc)]
    print(f"ok: tokenizer {wanted} (data.tokenizer; no dataset made with it yet)")
    return []


def _missing_tokenizer(wanted: str, exc: Exception) -> str:
    """The model's tokenizer does not load: where it comes from, gated ones (Llama 3.1) included."""
    name = Path(wanted).name or "<name>"
    return (f"the model's tokenizer {wanted!r} (data.tokenizer) does not load: {exc} — put it there or fix "
            "tokenizer: in the model's settings. A gated tokenizer (Llama 3.x): on a workstation with a "
            "Hugging Face token that was granted access, `hf download meta-llama/Llama-3.1-8B "
            f"--include \"tokenizer*\" --local-dir {name}`, then `aws s3 cp --recursive {name} "
            f"s3://<data bucket>/tokenizers/{name}/`: it appears as /fsx/data/tokenizers/{name} through the "
            "data link (docs/training.md, Your own model)")


def _check_writable(folder: Path) -> list[str]:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".preflight-"):
            pass
    except OSError as exc:
        return [f"checkpoint folder {folder} is not writable: {exc.strerror} — fix its owner or checkpoint.dir"]
    print(f"ok: checkpoint folder {folder} writable")
    return []


def _check_tracker() -> list[str]:
    """With WANDB_API_KEY set: wandb must import (the key says W&B is wanted); an unreachable host is
    only a warning, since the run trains on without W&B (metrics.Tracker)."""
    if not os.environ.get("WANDB_API_KEY"):
        return []
    try:
        import wandb
    except ImportError as exc:
        return [f"WANDB_API_KEY is set but wandb does not import: {exc} — pip install -r requirements-jobs.txt "
                "in the jobs venv, or unset WANDB_API_KEY"]
    print(f"ok: wandb {wandb.__version__}")
    url = urlsplit(os.environ.get("WANDB_BASE_URL") or wandb.Settings().base_url)
    address = (url.hostname, url.port or (443 if url.scheme == "https" else 80))
    try:
        socket.create_connection(address, timeout=TRACKER_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        print(f"warning: W&B host {address[0]}:{address[1]} not reachable within {TRACKER_CONNECT_TIMEOUT_S} s "
              f"({exc}) — the run will train without W&B (TensorBoard and metrics.jsonl as usual)")
        return []
    print(f"ok: W&B host {address[0]}:{address[1]} reachable")
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.preflight", description=__doc__.split("\n")[0])
    parser.add_argument("model", help="model name, e.g. model1")
    parser.add_argument("--config", help="config file (default: jobs/models/MODEL.yaml)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args(argv)
    problems = check(args.model, args.config, args.overrides)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print(f"preflight: {args.model} NOT submitted: {len(problems)} problem(s); no nodes were taken", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
