"""Export a training checkpoint to Hugging Face format: config.json, safetensors shards, the tokenizer.

    python -m training.export_hf /fsx/checkpoints/model1 /fsx/export/model1 --dataset /fsx/data/tokenized
    python -m training.export_hf CKPT_DIR OUT --tokenizer /fsx/data/tokenizer --step 60000 --dtype bfloat16

Then ``transformers.AutoModelForCausalLM.from_pretrained(OUT)`` and ``AutoTokenizer.from_pretrained(OUT)``
load it. The checkpoint is the DCP folder training writes (``latest`` by default), whether it was
saved under DDP or FSDP2: both store the unsharded parameter names of ``LlamaForCausalLM``
(``get_state_dict`` strips the wrappers), so one process reads every shard back into the whole
model. The shape comes from the checkpoint's ``train_meta.json``; the optimizer state is not read.

The tokenizer is the one the dataset was tokenized with: ``--dataset`` reads its name from
``dataset.json`` (and refuses a tokenizer whose SHA-256 differs from the one recorded there), or
``--tokenizer`` names it. Memory: the whole model in fp32 on the CPU (4 bytes per parameter, 280 GB
for 70B), so run it on a node with that much memory (a GPU node, or ``sbatch -p cpu --mem=0`` on a
large enough instance).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from data_pipeline.shards import DatasetError, read_dataset_meta
from data_pipeline.tokenizer import TokenizerError, load_tokenizer
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from .checkpoint import LATEST, META, STEP_DIR
from .models import llama_config

log = logging.getLogger("training.export_hf")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ExportError(ValueError):
    """The checkpoint or tokenizer cannot be exported; the message says which and what to do."""


def find_checkpoint(directory: Path, step: int | None = None) -> Path:
    """The complete step folder to export: ``step_<step>``, or the one ``latest`` names."""
    if step is None:
        try:
            name = (directory / LATEST).read_text().strip()
        except OSError:
            raise ExportError(f"{directory} has no '{LATEST}' file: no complete checkpoint to export "
                              "(pass --step N to pick a step folder)") from None
        if not STEP_DIR.fullmatch(name):
            raise ExportError(f"{directory / LATEST} names {name!r}, not a step folder")
        path = directory / name
    else:
        path = directory / f"step_{step:08d}"
    if not ((path / ".metadata").is_file() and (path / META).is_file()):
        raise ExportError(f"{path} is not a complete checkpoint (needs .metadata and {META}); "
                          f"pick another with --step (present: {sorted(p.name for p in directory.glob('step_*'))})")
    return path


def load_model(checkpoint: Path) -> tuple[LlamaForCausalLM, dict]:
    """The whole model on the CPU in fp32, with the weights of ``checkpoint``; and its train_meta.json."""
    meta = json.loads((checkpoint / META).read_text())
    config = llama_config(meta["preset"], meta["vocab_size"], meta["seq_len"])
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.to_empty(device="cpu")
    state = {"model": model.state_dict()}
    # No process group: DCP reads every rank's shard in this one process.
    dcp.load(state, checkpoint_id=checkpoint, no_dist=True)
    model.model.rotary_emb = LlamaRotaryEmbedding(config)  # computed, not saved: to_empty left garbage
    return model, meta


def export(checkpoint_dir: str | Path, out: str | Path, *, tokenizer: str, step: int | None = None,
           dtype: str = "float32", max_shard_size: str = "5GB", expected_sha256: str | None = None) -> Path:
    checkpoint = find_checkpoint(Path(checkpoint_dir), step)
    tok = load_tokenizer(tokenizer)
    sha = tok.identity["sha256"]
    if expected_sha256 and sha != expected_sha256:
        raise ExportError(f"tokenizer {tokenizer} (sha256 {sha[:12]}) is not the one the dataset was "
                          f"tokenized with (sha256 {expected_sha256[:12]}); pass that tokenizer")
    model, meta = load_model(checkpoint)
    if tok.vocab_size > meta["vocab_size"]:
        raise ExportError(f"tokenizer {tokenizer} has {tok.vocab_size} ids, the model only {meta['vocab_size']}")
    model.config.eos_token_id = tok.eos_id
    model.config.use_cache = True  # training turned the KV cache off; generation wants it
    model.to(DTYPES[dtype])
    out = Path(out)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=max_shard_size)
    eos = tok.backend.id_to_token(tok.eos_id)
    PreTrainedTokenizerFast(tokenizer_object=tok.backend, eos_token=eos).save_pretrained(out)
    log.info("exported %s (step %d, %s, %s) to %s", checkpoint, meta["step"], meta["preset"], dtype, out)
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m training.export_hf", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir", help="a model's checkpoint folder, e.g. /fsx/checkpoints/model1")
    parser.add_argument("out", help="folder to write the Hugging Face model to")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", help="tokenized dataset folder: use (and check) the tokenizer it was made with")
    source.add_argument("--tokenizer", help="tokenizer folder, tokenizer.json or hub id")
    parser.add_argument("--step", type=int, help="export step_<N> instead of the one 'latest' names")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--max-shard-size", default="5GB")
    args = parser.parse_args(argv)
    try:
        expected = None
        tokenizer = args.tokenizer
        if args.dataset:
            meta = read_dataset_meta(args.dataset)
            tokenizer, expected = meta.tokenizer["name"], meta.tokenizer["sha256"]
        export(args.checkpoint_dir, args.out, tokenizer=tokenizer, step=args.step, dtype=args.dtype,
               max_shard_size=args.max_shard_size, expected_sha256=expected)
    except (ExportError, DatasetError, TokenizerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
