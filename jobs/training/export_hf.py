"""Export a training checkpoint to Hugging Face format: config.json, safetensors shards, the tokenizer.

    sbatch jobs/export.sh MODEL [--step N]        # on the CPU queue; the usual way
    python -m training.export_hf /fsx/checkpoints/MODEL --dataset DATASET [--step N] [--dtype float32]
    python -m training.export_hf CKPT_DIR --tokenizer TOKENIZER --out FOLDER [--max-shard-size 5GB]

Writes ``<checkpoint dir>/export/step_<N>`` by default (on FSx beside the checkpoint, so it is
shared by every node and outlives the job): first into a ``.partial-*`` folder beside it, renamed
to ``step_<N>`` once every file is written, so a folder of that name is always a whole export.
``transformers.AutoModelForCausalLM.from_pretrained(OUT)`` and ``AutoTokenizer.from_pretrained(OUT)``
load it. The checkpoint is the DCP folder training writes (``latest`` by default), whatever the
layout (DDP, FSDP, HSDP, FSDP x TP): DCP stores every parameter as one global tensor under its
unsharded transformers name, whichever ranks held its pieces. The architecture is the one the
checkpoint's ``train_meta.json`` names (``model.preset``: a shorthand, a shipped config.json or the
absolute path of one), of any family training builds (Llama, Mistral, Qwen2 with its q/k/v biases);
``config.json`` is that family's, in the export's dtype. A tied output projection (Llama 3.2 1B/3B) is
written once, as the embedding, like transformers' own ``save_pretrained``. The optimizer state is
not read.

Memory: the weights are streamed, one tensor at a time, from the checkpoint into the shard files,
never the whole model: the peak above the interpreter is 1.5 (bf16) to 2 (fp32) times the largest
tensor in fp32 (llama3.1-70b: its 128256 x 8192 embedding, 3.9 GiB), docs/training.md gives the
measured figures.

The tokenizer is the one the dataset was tokenized with: ``--dataset`` reads its name from
``dataset.json`` (and refuses a tokenizer whose SHA-256 differs from the one recorded there), or
``--tokenizer`` names it.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from data_pipeline.shards import DatasetError, read_dataset_meta
from data_pipeline.tokenizer import TokenizerError, load_tokenizer
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from transformers import GenerationConfig, PretrainedConfig, PreTrainedTokenizerFast
from transformers.utils.hub import convert_file_size_to_int

from training.models.architecture import ArchitectureError
from training.checkpoints.checkpointer import LATEST, META, STEP_DIR
from training.models.llama import build_model, hf_config

log = logging.getLogger("training.export_hf")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16"}
INDEX = "model.safetensors.index.json"


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


class CachedMetadataReader(FileSystemReader):
    """DCP reads ``.metadata`` again on every load; here that is once per tensor, and a large
    checkpoint's ``.metadata`` (every rank's chunk of every tensor) takes a while to unpickle."""

    def __init__(self, path: Path):
        super().__init__(path)
        self._metadata = None

    def read_metadata(self, *args, **kwargs):
        if self._metadata is None:
            self._metadata = super().read_metadata(*args, **kwargs)
        return self._metadata


def weight_shapes(config: PretrainedConfig) -> dict[str, torch.Size]:
    """The Hugging Face model's weights, by name in its own order, from a model on the meta device: each
    parameter once, under its first name. A tied output projection (``tie_word_embeddings``, Llama 3.2
    1B/3B) is the embedding's own parameter: written as ``model.embed_tokens.weight`` only, as
    transformers' ``save_pretrained`` does, and tied again by ``from_pretrained``."""
    shapes, seen = {}, set()
    for name, tensor in build_model(config).state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            shapes[name] = tensor.shape
    return shapes


def plan_shards(shapes: dict[str, torch.Size], dtype: torch.dtype, max_shard_bytes: int) -> list[list[str]]:
    """Weight names grouped into shards of at most ``max_shard_bytes`` (a larger tensor gets one of its own)."""
    shards, size = [[]], 0
    for name, shape in shapes.items():
        nbytes = shape.numel() * dtype.itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def write_shard(path: Path, names: list[str], shapes: dict[str, torch.Size], dtype: torch.dtype, read) -> None:
    """One safetensors file, its tensors written as they are read: the format's header (names,
    shapes, byte ranges) follows from the shapes alone, so no tensor waits in memory for the others."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in names:
        nbytes = shapes[name].numel() * dtype.itemsize
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shapes[name]),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header so that the data is 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name in names:
            tensor = read(name).to(dtype).contiguous()  # no copy when read gives it so (write_weights does)
            f.write(tensor.view(torch.uint8).numpy().data)


def write_weights(checkpoint: Path, out: Path, config: PretrainedConfig, dtype: str = "bfloat16",
                  max_shard_size: str = "5GB") -> None:
    """The checkpoint's model weights as safetensors shards and their index in ``out``, one tensor
    in memory at a time: in the export's dtype, plus the one chunk of it DCP is reading (fp32)."""
    reader = CachedMetadataReader(checkpoint)
    saved = reader.read_metadata().state_dict_metadata
    shapes = weight_shapes(config)
    for name, shape in shapes.items():
        key = f"model.{name}"
        if key not in saved or saved[key].size != shape:
            found = f"shape {tuple(saved[key].size)}" if key in saved else "nothing"
            raise ExportError(f"{checkpoint} holds {found} under {key}, the {config.num_hidden_layers}-layer "
                              f"model of its {META} needs shape {tuple(shape)}: not a checkpoint of this model")

    target = DTYPES[dtype]

    def read(name: str) -> torch.Tensor:
        # A global tensor, whole: DCP assembles it from every rank's chunks (FSDP and TP shards alike),
        # each read into memory of its own and copied into place, which converts it: a bf16 export
        # never holds the fp32 tensor whole (peak: half the fp32 tensor + its largest chunk, not twice it).
        tensor = torch.empty(shapes[name], dtype=target)
        dcp.load({"model": {name: tensor}}, storage_reader=reader, no_dist=True)
        return tensor

    shards = plan_shards(shapes, target, convert_file_size_to_int(max_shard_size))
    weight_map = {}
    for i, names in enumerate(shards, 1):
        filename = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_shard(out / filename, names, shapes, target, read)
        weight_map.update(dict.fromkeys(names, filename))
        log.info("wrote %s (%d tensors)", filename, len(names))
    total = sum(shape.numel() for shape in shapes.values()) * target.itemsize
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def export(checkpoint_dir: str | Path, out: str | Path | None = None, *, tokenizer: str, step: int | None = None,
           dtype: str = "bfloat16", max_shard_size: str = "5GB", expected_sha256: str | None = None) -> Path:
    """Write the export to ``out`` (default ``<checkpoint_dir>/export/step_<N>``); return that folder."""
    checkpoint = find_checkpoint(Path(checkpoint_dir), step)
    out = Path(out) if out else checkpoint.parent / "export" / checkpoint.name
    if out.exists():
        raise ExportError(f"{out} already exists: that step is exported (delete the folder to export it again)")
    tok = load_tokenizer(tokenizer)
    sha = tok.identity["sha256"]
    if expected_sha256 and sha != expected_sha256:
        raise ExportError(f"tokenizer {tokenizer} (sha256 {sha[:12]}) is not the one the dataset was "
                          f"tokenized with (sha256 {expected_sha256[:12]}); pass that tokenizer")
    meta = json.loads((checkpoint / META).read_text())
    if tok.vocab_size > meta["vocab_size"]:
        raise ExportError(f"tokenizer {tokenizer} has {tok.vocab_size} ids, the model only {meta['vocab_size']}")
    try:  # a shorthand, a shipped config.json by name, or the absolute path of one: what model.preset named
        config = hf_config(meta["preset"], meta["vocab_size"], meta["seq_len"])
    except ArchitectureError as exc:
        raise ExportError(f"{checkpoint / META} names model.preset {meta['preset']!r}, which no longer gives an "
                          f"architecture ({exc}); put that config.json back, or name where it is now in {META}"
                          ) from None
    config.eos_token_id = tok.eos_id
    config.use_cache = True  # training turned the KV cache off; generation wants it
    config.dtype = dtype

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{out.name}.partial-", dir=out.parent))
    try:
        write_weights(checkpoint, partial, config, dtype, max_shard_size)
        config.save_pretrained(partial)
        GenerationConfig.from_model_config(config).save_pretrained(partial)
        eos = tok.backend.id_to_token(tok.eos_id)
        PreTrainedTokenizerFast(tokenizer_object=tok.backend, eos_token=eos).save_pretrained(partial)
        partial.chmod(0o755)  # mkdtemp's folder is private to its owner; the export is for everyone
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log.info("exported %s (step %d, %s, %s) to %s", checkpoint, meta["step"], meta["preset"], dtype, out)
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m training.export_hf", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir", help="a model's checkpoint folder, e.g. /fsx/checkpoints/model1")
    parser.add_argument("--out", help="folder to write the Hugging Face model to (default: <checkpoint_dir>/export/step_<N>)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", help="tokenized dataset folder: use (and check) the tokenizer it was made with")
    source.add_argument("--tokenizer", help="tokenizer folder, tokenizer.json or hub id")
    parser.add_argument("--step", type=int, help="export step_<N> instead of the one 'latest' names")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
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
    except CheckpointException as exc:  # a shard file missing or damaged: DCP's own message, first line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: the checkpoint in {args.checkpoint_dir} cannot be read ({first}); export another "
              "step (--step N) or restore this one from the backup bucket", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
