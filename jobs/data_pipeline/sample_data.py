"""A small deterministic corpus and a BPE tokenizer trained on it, for tests and the demo.

No downloads. The text follows simple rules (templated sentences, arithmetic facts, counting
runs), so a tiny model's loss falls quickly on it. ``python -m data_pipeline.sample_data OUT``
writes ``OUT/raw/corpus-NNNNN.txt`` (one document per line) and ``OUT/tokenizer/`` (tokenizer.json
+ tokenizer_config.json, loadable by ``data_pipeline.tokenize`` and by transformers' AutoTokenizer).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from cli import ArgumentParser

EOS_TOKEN = "<|endoftext|>"
_NOUNS = "cat dog bird fish horse cow sheep mouse fox bear owl frog".split()
_ADJS = "small big red green quick slow happy sleepy old young".split()
_VERBS = "sees chases likes follows finds helps watches meets".split()
_PLACES = "the river|the forest|the town|the hill|the farm|the lake".split("|")


def _sentence(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.5:
        a, b = rng.sample(_NOUNS, 2)
        return (f"the {rng.choice(_ADJS)} {a} {rng.choice(_VERBS)} the {b} "
                f"near {rng.choice(_PLACES)}.")
    if kind < 0.8:
        x, y = rng.randrange(50), rng.randrange(50)
        return f"{x} plus {y} is {x + y}."
    start = rng.randrange(90)
    return "count " + " ".join(str(n) for n in range(start, start + rng.randrange(3, 9))) + "."


def write_corpus(out_dir, *, num_files: int = 4, total_bytes: int = 400_000, seed: int = 0,
                 prefix: str = "corpus") -> list[Path]:
    """Write ``num_files`` text files, one document (a few sentences) per line, ~total_bytes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    files = []
    for i in range(num_files):
        lines, size = [], 0
        while size < total_bytes // num_files:
            doc = " ".join(_sentence(rng) for _ in range(rng.randrange(2, 12)))
            lines.append(doc)
            size += len(doc) + 1
        path = out_dir / f"{prefix}-{i:05d}.txt"
        path.write_text("\n".join(lines) + "\n")
        files.append(path)
    return files


def train_tokenizer(files, out_dir, *, vocab_size: int = 512) -> Path:
    """Train a byte-level BPE tokenizer on ``files`` (seconds) and save it as a tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([str(f) for f in files], trainer)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    # The same fields transformers' save_pretrained writes, so AutoTokenizer loads the folder too.
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS_TOKEN,
        "bos_token": None, "pad_token": None, "model_max_length": 1_000_000}, indent=1))
    return out_dir


def make_sample(out_dir, *, num_files: int = 4, total_bytes: int = 400_000, seed: int = 0,
                vocab_size: int = 512) -> tuple[list[Path], Path]:
    """Corpus under ``out_dir/raw`` and tokenizer under ``out_dir/tokenizer``."""
    out_dir = Path(out_dir)
    files = write_corpus(out_dir / "raw", num_files=num_files, total_bytes=total_bytes, seed=seed)
    return files, train_tokenizer(files, out_dir / "tokenizer", vocab_size=vocab_size)


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m data_pipeline.sample_data", description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--files", type=int, default=4, help="number of raw text files")
    p.add_argument("--size-kb", type=int, default=400, help="total corpus size")
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    files, tok = make_sample(a.out_dir, num_files=a.files, total_bytes=a.size_kb * 1000,
                             seed=a.seed, vocab_size=a.vocab_size)
    print(json.dumps({"raw_files": [str(f) for f in files], "tokenizer": str(tok)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
