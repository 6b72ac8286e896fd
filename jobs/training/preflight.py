"""Checks a model's training run on the head node before it takes any node.

    python -m training.preflight MODEL [--config FILE] [section.key=value ...]

What the job would otherwise find out only after Slurm allocated its nodes:
- the config (jobs/models/<MODEL>.yaml, derived from the model's settings, or TRAIN_CONFIG, or --config,
  with the overrides) parses and is the model's own, as the trainer loads it for the model's job
  (training/config.py ``load_config(..., model=MODEL)``): no identity key as an argument, no other model's
  config file or data, nothing of another model's read (eval.path, model.init_from) unless the settings
  share it; no second --model;
- the dataset at data.path exists and matches the config: seq_len, vocabulary (the model's
  vocab_size holds every token id), dtype (the smallest that holds the vocabulary);
- the tokenizer the dataset was made with still loads and is the same one (SHA-256), and is the
  model's own (data.tokenizer); with no dataset yet, the model's tokenizer loads (a missing one: the
  error says how to fetch a gated one and upload it to the data bucket);
- model.init_from, unless a checkpoint of the run makes it moot (said so): the folder's config.json is
  model.preset's architecture and it holds safetensors;
- the checkpoint and log folders can be written, or made where they do not exist yet (nothing is
  created: the node setup makes a model's folders, the job the rest);
- with WANDB_API_KEY set: wandb imports, and whether its host answers (a warning only: training
  goes on without W&B, see metrics.Tracker).
Prints one line per check; exit 0 when all pass, 2 with ``error: <what> — <fix>`` lines otherwise.
``jobs/submit.sh`` runs it before ``sbatch``.
"""

from __future__ import annotations

import os
import pwd
import re
import socket
import stat
import sys
from pathlib import Path
from urllib.parse import urlsplit

from cli import ArgumentParser
from data_pipeline.shards import DatasetError, check_compatible, read_dataset_meta, token_dtype_name
from data_pipeline.tokenizer import TokenizerError, load_tokenizer
from training.config import Config, ConfigError, cluster_models, load_config, model_config_file
from training.models.architecture import released_weights_problem
from training.models.presets import resolve

# How long preflight waits for the W&B host to accept a connection.
TRACKER_CONNECT_TIMEOUT_S = 5


def check(model: str, config: str | None, overrides: list[str]) -> list[str]:
    """Problems found (empty: ready to submit); prints what passed. ``config``: --config, else TRAIN_CONFIG, else
    the model's own, as jobs/train.sh picks it."""
    if not model_config_file(model).is_file():
        return [f"model {model!r} is not one of this cluster's models ({', '.join(cluster_models()) or 'none'}) — "
                "add it to models: in the settings and redeploy"]
    path = Path(config or os.environ.get("TRAIN_CONFIG") or model_config_file(model))
    try:
        cfg = load_config(path, overrides, model=model)  # as the trainer loads it in the model's job
    except (ConfigError, FileNotFoundError) as exc:
        return [f"config {path}: {exc} — fix the file or the override"]
    print(f"ok: config {path} ({cfg.model.preset}, seq_len {cfg.data.seq_len})")

    problems = []
    try:
        meta = read_dataset_meta(cfg.data.path)
    except DatasetError as exc:
        problems.append(f"dataset: {exc} — run jobs/preprocess.sh for {model} (seq_len {cfg.data.seq_len}), or "
                        "change dataset: in the model's settings entry (data.path is the model's own)")
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
            problems.append(f"{exc} — re-tokenize for this model, or fix data.seq_len (data.path is the model's "
                            "own: dataset: in its settings entry)")
        problems += _check_tokenizer(meta.tokenizer, cfg.data.tokenizer)
    elif cfg.data.tokenizer:  # no dataset yet: the tokenizer it will be made with must still be there
        problems += _check_own_tokenizer(cfg.data.tokenizer)
    problems += _check_released_weights(cfg)
    problems += check_writable(Path(cfg.checkpoint.dir), "checkpoint", model)
    problems += check_writable(Path(cfg.log.dir), "log", model)
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


CHECKPOINT_STEP = re.compile(r"step_\d{8}")  # a complete checkpoint's folder (training/checkpoints/checkpointer.py)


def _check_released_weights(cfg: Config) -> list[str]:
    """model.init_from starts only a run without checkpoints (train.py): say when one makes it moot, else check
    the folder as the trainer will, before it reads a tensor."""
    folder = cfg.model.init_from
    if not folder:
        return []
    checkpoints = Path(cfg.checkpoint.dir)
    latest = checkpoints / "latest"
    held = latest.read_text().strip() if latest.is_file() else \
        max((p.name for p in checkpoints.glob("step_*") if CHECKPOINT_STEP.fullmatch(p.name)), default="")
    if held:
        print(f"note: model.init_from {folder} is ignored: {checkpoints} already holds this run's checkpoint {held}, "
              "which it resumes from (released weights start a run only once, as its step 0); to start from them "
              "again, the model's checkpoints must be moved away first")
        return []
    if not Path(folder).is_dir():
        return [f"model.init_from {folder}: no such folder — upload the checkpoint to the data bucket's weights/ "
                "(it appears under /fsx/data/weights/), or fix model.init_from (docs/training.md, Continue from "
                "released weights)"]
    problem = released_weights_problem(folder, resolve(cfg.model.preset), cfg.model.preset)
    if problem:
        return [problem]
    files = len(list(Path(folder).glob("*.safetensors")))
    print(f"ok: model.init_from {folder} (its config.json is model.preset {cfg.model.preset}; {files} file"
          f"{'s' if files != 1 else ''})")
    return []


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no user on this node
        return str(uid)


def current_user() -> str:
    return _user_name(os.geteuid())


def check_writable(folder: Path, what: str, model: str) -> list[str]:
    """The job can write ``folder``, or make it: the nearest folder that exists is writable. Nothing is created.
    The folders are the model's own (identity keys), so the fix is never another folder: it is the user who
    submits, or the folder's owner, which the node setup makes the model's user."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    me = current_user()
    if not existing.is_dir():
        return [f"{what} folder {folder} cannot be made: {existing} is not a folder — ask the cluster's admin to "
                f"remove it (the node setup, node_scripts/directory_setup.sh, makes {model}'s folders)"]
    if not os.access(existing, os.W_OK | os.X_OK):
        info = existing.stat()
        whose = f"owner {_user_name(info.st_uid)}, mode {stat.filemode(info.st_mode)}"
        if existing == folder:
            return [f"{what} folder {folder} is not writable by {me} ({whose}) — a model's folders are its user's "
                    f"(node_scripts/directory_setup.sh makes them {model}'s, mode 2755): submit as {model} (sudo su - "
                    f"{model}), or ask the cluster's admin to give the folder back to {model} (chown -R "
                    f"{model}:{model} {folder})"]
        return [f"{what} folder {folder} does not exist and {existing} is not writable by {me} ({whose}) — the node "
                f"setup (node_scripts/directory_setup.sh) makes each model's folders for the models of the settings: "
                f"ask the cluster's admin to run it for {model} (a cluster update does), or submit as {model}"]
    if existing == folder:
        print(f"ok: {what} folder {folder} writable")
    else:
        print(f"ok: {what} folder {folder} can be made (it does not exist yet)")
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
    parser = ArgumentParser(prog="python -m training.preflight", description=__doc__.split("\n")[0])
    parser.add_argument("model", help="model name, e.g. model1")
    parser.add_argument("--config", help="config file (default: TRAIN_CONFIG, else jobs/models/MODEL.yaml)")
    parser.add_argument("--model", dest="more_models", action="append", default=[],
                        help="refused: the model is the first argument (the trainer would refuse a second --model)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_intermixed_args(argv)  # as the trainer parses the same arguments
    if args.more_models:
        problems = [f"--model {other}: the model is submit.sh's first argument ({args.model}), and its job would "
                    f"refuse a second one — remove --model; to submit {other}, run bash jobs/submit.sh {other}"
                    for other in args.more_models]
    else:
        problems = check(args.model, args.config, args.overrides)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print(f"preflight: {args.model} NOT submitted: {len(problems)} problem(s); no nodes were taken", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
