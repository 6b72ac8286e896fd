"""``pretrain_gpt.py``'s arguments for a model's job, NUL-separated on stdout (jobs/megatron_lm/pretrain.sh):

    python -m megatron_lm.args model8

The bundle's ``jobs/models/<model>.megatron.args`` (derived from the model's settings entry at synth:
shape, layout, precision, schedule, optimizer; cluster_config/megatron.py) plus this cluster's paths:
the data the model's preprocessing wrote (``<data.path>/megatron/``, megatron_lm/preprocess.py), its
tokenizer (``data.tokenizer`` of jobs/models/<model>.yaml, as the shards were tokenized with), and its
checkpoint and log folders (``$FSX_CHECKPOINTS/<model>``, ``$FSX_LOGS/<model>``). Refused (exit 2,
``error: ... — fix``) before any GPU is touched: a model without a Megatron entry, data not yet
preprocessed, a tokenizer folder transformers cannot load.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cli import ArgumentParser, fail
from training.config import load_config, model_config_file

from megatron_lm.preprocess import prefixes

ARGS_SUFFIX = ".megatron.args"


def args_file(model: str) -> Path:
    return model_config_file(model).with_suffix(ARGS_SUFFIX)


def read_args(path: Path) -> list[str]:
    """The file's arguments, one a line; ``#`` lines are comments."""
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def model_arguments(model: str) -> list[str]:
    """Every argument of the model's run; ValueError naming the fix."""
    path = args_file(model)
    if not path.is_file():
        raise ValueError(f"{path} does not exist: model {model} has no megatron: entry in the cluster's settings — "
                         f"add one (docs/megatron.md), or train it with sbatch jobs/train_{model}.sh")
    cfg = load_config(model_config_file(model), model=model)
    data = prefixes(cfg.data.path)
    if not data["train"].with_name(data["train"].name + ".idx").is_file():
        raise ValueError(f"no Megatron dataset at {data['train']}.idx — run: MODEL={model} sbatch "
                         f"jobs/megatron_lm/preprocess_megatron.sh (after MODEL={model} sbatch jobs/preprocess.sh)")
    tokenizer = Path(cfg.data.tokenizer)
    if not (tokenizer / "tokenizer_config.json").is_file():
        raise ValueError(f"tokenizer {tokenizer}: no tokenizer_config.json, which Megatron-LM's HuggingFaceTokenizer "
                         "(transformers' AutoTokenizer) needs beside tokenizer.json — save the tokenizer with "
                         "save_pretrained, or add one naming its class and eos_token")
    checkpoints = Path(os.environ.get("FSX_CHECKPOINTS", "/fsx/checkpoints")) / model  # env.sh's
    logs = Path(os.environ.get("FSX_LOGS", "/fsx/logs")) / model
    paths = ["--train-data-path", str(data["train"])]
    if data["valid"].with_name(data["valid"].name + ".idx").is_file():
        paths += ["--valid-data-path", str(data["valid"])]
    paths += ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tokenizer),
              "--save", str(checkpoints), "--load", str(checkpoints),
              # Megatron's sample indices, built once per dataset and layout: the model's own folder
              "--data-cache-path", str(checkpoints / "data_cache"),
              "--tensorboard-dir", str(logs / "tensorboard"), "--num-workers", str(cfg.data.num_workers)]
    return read_args(path) + paths


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m megatron_lm.args",
                       description="pretrain_gpt.py's arguments for a model's Megatron-LM run, NUL-separated.")
    p.add_argument("model", help="the model's name (its settings entry has megatron:)")
    a = p.parse_args(argv)
    try:
        arguments = model_arguments(a.model)
    except (ValueError, OSError) as e:  # ConfigError is a ValueError
        return fail(e)
    sys.stdout.write("".join(arg + "\0" for arg in arguments))
    return 0


if __name__ == "__main__":
    sys.exit(main())
