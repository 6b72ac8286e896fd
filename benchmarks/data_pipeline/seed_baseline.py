"""The seed's design, rebuilt faithfully, as the benchmark baseline.

Tokenize: per line ``tokenizer.encode`` (transformers fast tokenizer), one tar sample per line with
``token_ids.json`` + ``text.txt`` (webdataset TarWriter). Loader: webdataset split by node and
worker, JSON decode, DataCollatorForLanguageModeling(mlm=False) padding to the longest line with
pad = eos. The one fix needed to run with webdataset 1.0: a ``map`` over sample dicts keeps ``__key__``,
which the collator rejects, so the ids are selected with ``to_tuple`` first.
"""

from __future__ import annotations

from pathlib import Path


def tokenize_file(src: Path, tokenizer_dir: Path, out_tar: Path) -> int:
    """Seed tokenizer for one raw file; returns the number of tokens written."""
    import webdataset as wds
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokens = 0
    with wds.TarWriter(str(out_tar)) as sink:
        for i, line in enumerate(src.read_text(encoding="utf-8").splitlines()):
            if not line.strip():
                continue
            ids = tok.encode(line)
            tokens += len(ids)
            sink.write({"__key__": f"{i:09d}", "token_ids.json": ids, "text.txt": line})
    return tokens


def make_loader(urls: list[str], tokenizer_dir: Path, batch_size: int, num_workers: int):
    import webdataset as wds
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.pad_token = tok.eos_token  # as for Llama-3, which has no pad token
    dataset = (wds.WebDataset(urls, nodesplitter=wds.split_by_node, shardshuffle=False,
                              workersplitter=wds.split_by_worker).repeat()
               .decode().to_tuple("token_ids.json")
               .map(lambda t: {"input_ids": t[0]}))  # a dict map() would keep __key__
    collator = DataCollatorForLanguageModeling(tok, mlm=False)
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                      collate_fn=collator)
