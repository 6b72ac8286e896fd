"""Load a Hugging Face fast tokenizer by model id, local folder or tokenizer.json, with its EOS id."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

# Names used for end-of-text by common tokenizers, tried when no config names the EOS token.
_EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[SEP]")


class TokenizerError(ValueError):
    pass


@dataclass(frozen=True)
class LoadedTokenizer:
    backend: object  # tokenizers.Tokenizer
    eos_id: int
    vocab_size: int
    name: str

    @property
    def identity(self) -> dict:
        """Name and SHA-256 of the serialized tokenizer: recorded in every shard index."""
        blob = self.backend.to_str().encode()
        return {"name": self.name, "sha256": hashlib.sha256(blob).hexdigest(),
                "eos_id": self.eos_id, "vocab_size": self.vocab_size}


_RESAVE = ("copy it again from where it was saved (save_pretrained() writes it), the same tokenizer the "
           "dataset was made with")


def _offline_hint(spec: str) -> str:
    return ("To use it offline, save it once where the hub is reachable: `python -c \"from "
            f"transformers import AutoTokenizer; AutoTokenizer.from_pretrained('{spec}')"
            ".save_pretrained('DIR')\"`, copy DIR (it holds tokenizer.json) to the cluster and "
            "pass --tokenizer DIR")


def _eos_from_config(folder: Path) -> str | None:
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            eos = json.loads(cfg.read_text()).get("eos_token")
        except (ValueError, AttributeError) as e:  # not JSON, or JSON but not an object
            raise TokenizerError(f"tokenizer config {cfg} is corrupt ({type(e).__name__}: {e}) — "
                                 f"{_RESAVE}") from None
        return eos.get("content") if isinstance(eos, dict) else eos
    return None


def load_tokenizer(spec: str, eos_token: str | None = None) -> LoadedTokenizer:
    """``spec``: a folder holding tokenizer.json, a tokenizer.json file, or a hub model id."""
    from tokenizers import Tokenizer

    path = Path(spec)
    looks_local = path.exists() or spec.startswith((".", "/", "~")) or spec.endswith(".json")
    if looks_local:
        path = path.expanduser()
        tok_file = path / "tokenizer.json" if path.is_dir() else path
        if not tok_file.is_file():
            what = "has no tokenizer.json" if path.is_dir() else "does not exist"
            raise TokenizerError(f"tokenizer {spec}: {what}. Pass a folder saved with "
                                 "save_pretrained() (it must hold tokenizer.json: a fast "
                                 "tokenizer) or a tokenizer.json file")
        try:
            backend = Tokenizer.from_file(str(tok_file))
        except Exception as e:  # the Rust library raises a bare Exception for a file it cannot parse
            raise TokenizerError(f"tokenizer file {tok_file} is corrupt ({e}) — {_RESAVE}") from None
        eos_token = eos_token or _eos_from_config(tok_file.parent)
        name = str(path.resolve())
    else:
        try:
            from transformers import AutoTokenizer
            hf = AutoTokenizer.from_pretrained(spec)
        except (OSError, ValueError) as e:
            raise TokenizerError(f"cannot load tokenizer {spec!r} from the Hugging Face hub or "
                                 f"its local cache ({type(e).__name__}). {_offline_hint(spec)}") from None
        if not hf.is_fast:
            raise TokenizerError(f"tokenizer {spec!r} has no fast (Rust) version")
        backend = hf.backend_tokenizer
        eos_token = eos_token or hf.eos_token
        name = spec
    if eos_token is None:
        eos_token = next((t for t in _EOS_CANDIDATES if backend.token_to_id(t) is not None), None)
    eos_id = backend.token_to_id(eos_token) if eos_token else None
    if eos_id is None:
        raise TokenizerError(f"tokenizer {spec}: no EOS token found (tried config and "
                             f"{', '.join(_EOS_CANDIDATES)}); pass --eos-token")
    return LoadedTokenizer(backend, eos_id, backend.get_vocab_size(with_added_tokens=True), name)
