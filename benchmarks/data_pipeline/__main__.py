"""Data pipeline benchmark: ours vs the seed's design, same corpus, tokenizer, machine, one run.

    .venv/bin/python -m benchmarks.data_pipeline [--size-mb 16] [--out benchmarks/results/data_pipeline.json]

Measures tokenize throughput (same process pool on the same cores for both), bytes on disk per
token, loader delivered (non-pad) tokens/s and padding, and our loader's peak memory as the
dataset grows 4x. Prints a table with ratios to the baseline and writes JSON. Also the cost of the
loader's shard checksums: hashing every shard (what each loader process does once per run) over
reading one epoch without it, in the same process.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "jobs"))

from cli import ArgumentParser  # noqa: E402
from data_pipeline.sample_data import train_tokenizer, write_corpus  # noqa: E402
from data_pipeline.shards import read_dataset_meta, write_json_atomic  # noqa: E402

from . import seed_baseline  # noqa: E402

SEQ_LEN = 1024


def _ours_tokenize(args) -> int:
    src, tok_dir, out = args
    os.environ["RAYON_NUM_THREADS"] = "1"  # one core per process, like the baseline's processes
    from data_pipeline.tokenize import PackSettings, tokenize_file
    from data_pipeline.tokenizer import load_tokenizer
    summary = tokenize_file(src, load_tokenizer(str(tok_dir)), out,
                            PackSettings(seq_len=SEQ_LEN, shard_bytes=64 << 20))
    return summary["tokens"]


def _seed_tokenize(args) -> int:
    src, tok_dir, out = args
    return seed_baseline.tokenize_file(src, tok_dir, Path(out) / f"{src.stem}.tar")


def bench_tokenize(files, tok_dir, work: Path, cores: int) -> dict:
    out = {}
    for name, fn in (("seed", _seed_tokenize), ("ours", _ours_tokenize)):
        dest = work / f"{name}_shards"
        dest.mkdir()
        with ProcessPoolExecutor(cores) as pool:
            list(pool.map(len, [[0]] * cores))  # start the workers before timing
            t = time.perf_counter()
            tokens = sum(pool.map(fn, [(f, tok_dir, dest) for f in files]))
            seconds = time.perf_counter() - t
        disk = sum(p.stat().st_size for p in dest.glob("*.tar"))
        stored = tokens if name == "seed" else finalized(dest, files).total_tokens
        out[name] = {"tokens": tokens, "seconds": round(seconds, 3),
                     "tokens_per_s": round(tokens / seconds), "disk_bytes": disk,
                     "bytes_per_token": round(disk / stored, 3)}
    return out


def finalized(dest: Path, files):
    from data_pipeline.tokenize import finalize
    return finalize(dest, [f.name for f in files])


def bench_loader(work: Path, tok_dir: Path, batch_size: int, workers: int, seconds: float) -> dict:
    from data_pipeline.loader import TokenLoader

    def run(it, count_tokens):
        next(it)  # workers started
        t0 = time.perf_counter()
        tokens = total = batches = 0
        while time.perf_counter() - t0 < seconds:
            nonpad, size = count_tokens(next(it))
            tokens, total, batches = tokens + nonpad, total + size, batches + 1
        elapsed = time.perf_counter() - t0
        return {"batches": batches, "tokens_per_s": round(tokens / elapsed),
                "padding_fraction": round(1 - tokens / total, 4)}

    urls = sorted(str(p) for p in (work / "seed_shards").glob("*.tar"))
    seed = run(iter(seed_baseline.make_loader(urls, tok_dir, batch_size, workers)),
               lambda b: (int(b["attention_mask"].sum()), b["attention_mask"].numel()))
    ours_loader = TokenLoader(work / "ours_shards", batch_size=batch_size, seq_len=SEQ_LEN,
                              num_workers=workers, seed=0)
    ours = run(iter(ours_loader), lambda b: (b["input_ids"].numel(), b["input_ids"].numel()))
    return {"seed": seed, "ours": ours, "batch_size": batch_size, "num_workers": workers}


def bench_verify(path: Path, batch_size: int) -> dict:
    """Seconds to check every shard's SHA-256 over seconds to read one epoch, in this process (page cache warm).

    Must run before anything else in this process reads ``path`` with the loader: the check is once per
    process, so it is timed first and the epoch read after it, which finds every shard checked, only reads.
    """
    from data_pipeline.loader import TokenLoader, verify_shard
    meta = read_dataset_meta(path)
    start = time.perf_counter()
    for shard in meta.shards:
        fd = os.open(path / shard.file, os.O_RDONLY)
        try:
            verify_shard(fd, path / shard.file, shard.sha256)
        finally:
            os.close(fd)
    verify_s = time.perf_counter() - start
    loader = TokenLoader(path, batch_size=batch_size, seq_len=SEQ_LEN, num_workers=0)
    start = time.perf_counter()
    for _ in itertools.islice(iter(loader), loader.batches_per_epoch):
        pass
    epoch_s = time.perf_counter() - start
    size = sum(s.bytes for s in meta.shards)
    return {"shards": len(meta.shards), "bytes": size, "verify_s": round(verify_s, 6),
            "verify_mb_per_s": round(size / verify_s / 1e6, 1), "epoch_read_s": round(epoch_s, 6),
            "batches_per_epoch": loader.batches_per_epoch, "verify_over_epoch_ratio": round(verify_s / epoch_s, 3)}


def grow(src: Path, dst: Path, factor: int) -> None:
    """A dataset ``factor`` times larger: hard links of every shard in ``factor`` subfolders."""
    meta = json.loads((src / "dataset.json").read_text())
    dst.mkdir()
    shards = []
    for k in range(factor):
        for s in meta["shards"]:
            name = f"copy{k}/{s['file']}"
            (dst / name).parent.mkdir(exist_ok=True)
            os.link(src / s["file"], dst / name)
            shards.append({**s, "file": name})
    meta.update(shards=shards, total_sequences=meta["total_sequences"] * factor,
                total_tokens=meta["total_tokens"] * factor)
    write_json_atomic(dst / "dataset.json", meta)


MEMORY_PROBE = """
import sys
sys.path.insert(0, {jobs!r})
from data_pipeline.loader import TokenLoader
loader = TokenLoader({path!r}, batch_size=8, seq_len={seq_len}, num_workers=0)
it = iter(loader)
for _ in range(loader.batches_per_epoch * 2):
    next(it)
print(loader.batches_per_epoch)
"""


def peak_rss_mb(path: Path) -> tuple[float, int]:
    """Peak RSS of a process that reads two full epochs of ``path`` with the loader."""
    code = MEMORY_PROBE.format(jobs=str(REPO / "jobs"), path=str(path), seq_len=SEQ_LEN)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "memory probe failed"
    return usage.ru_maxrss / 1024, int(out)


def bench_memory(work: Path) -> dict:
    result = {}
    for factor in (1, 4):
        path = work / f"grown_{factor}x"
        grow(work / "ours_shards", path, factor)
        rss, batches = peak_rss_mb(path)
        result[f"{factor}x"] = {"peak_rss_mb": round(rss, 1), "batches_per_epoch": batches}
    result["ratio_4x_to_1x"] = round(result["4x"]["peak_rss_mb"] / result["1x"]["peak_rss_mb"], 3)
    return result


def bench_uint32(work: Path) -> dict:
    """Bytes per token when the vocabulary needs uint32 (a 70,000-word word-level tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from data_pipeline.tokenize import tokenize_files
    words = [f"w{i}" for i in range(70_000)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words + ["<eos>"])}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(work / "big_vocab.json"))
    raw = work / "big_vocab_raw"
    raw.mkdir()
    lines = (" ".join(words[(i * 37 + j) % 70_000] for j in range(100)) for i in range(20_000))
    (raw / "a.txt").write_text("\n".join(lines) + "\n")
    meta = tokenize_files([raw / "a.txt"], str(work / "big_vocab.json"), work / "big_vocab_out",
                          SEQ_LEN)
    disk = sum((meta.path / s.file).stat().st_size for s in meta.shards)
    return {"dtype": meta.dtype, "bytes_per_token": round(disk / meta.total_tokens, 3)}


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m benchmarks.data_pipeline", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mb", type=float, default=16, help="corpus size")
    p.add_argument("--files", type=int, default=8, help="raw files (array tasks)")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--loader-seconds", type=float, default=10)
    p.add_argument("--out", default=str(REPO / "benchmarks/results/data_pipeline.json"))
    a = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="dp-bench-"))
    try:
        files = write_corpus(work / "raw", num_files=a.files, total_bytes=int(a.size_mb * 1e6))
        tok_dir = train_tokenizer(files[:2], work / "tokenizer", vocab_size=a.vocab_size)
        tokenize = bench_tokenize(files, tok_dir, work, cores)
        verify = bench_verify(work / "ours_shards", a.batch_size)
        loader = bench_loader(work, tok_dir, a.batch_size, min(2, cores), a.loader_seconds)
        memory = bench_memory(work)
        uint32 = bench_uint32(work)
    finally:
        shutil.rmtree(work)
    ratios = {
        "tokenize_throughput": round(tokenize["ours"]["tokens_per_s"] / tokenize["seed"]["tokens_per_s"], 2),
        "loader_tokens_per_s": round(loader["ours"]["tokens_per_s"] / loader["seed"]["tokens_per_s"], 1),
        "bytes_per_token": round(tokenize["ours"]["bytes_per_token"] / tokenize["seed"]["bytes_per_token"], 4),
    }
    targets = {
        "tokenize_throughput >= 4x": ratios["tokenize_throughput"] >= 4,
        "loader_tokens_per_s >= 50x": ratios["loader_tokens_per_s"] >= 50,
        "padding == 0": loader["ours"]["padding_fraction"] == 0,
        "bytes_per_token uint16 <= 2.1": tokenize["ours"]["bytes_per_token"] <= 2.1,
        "bytes_per_token uint32 <= 4.1": uint32["bytes_per_token"] <= 4.1,
        "loader memory flat (4x data, <= 1.1x RSS)": memory["ratio_4x_to_1x"] <= 1.1,
    }
    result = {"machine": {"cores": cores, "python": platform.python_version(),
                          "platform": platform.platform()},
              "corpus": {"bytes": int(a.size_mb * 1e6),
                         "files": a.files, "vocab_size": a.vocab_size, "seq_len": SEQ_LEN},
              "tokenize": tokenize, "loader": loader, "verify": verify, "memory": memory, "uint32": uint32,
              "ratios": ratios, "targets_met": targets}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    t, l_ = tokenize, loader
    print(f"{'metric':34} {'seed':>14} {'ours':>14} {'ratio':>8}")
    print(f"{'tokenize tokens/s':34} {t['seed']['tokens_per_s']:>14,} {t['ours']['tokens_per_s']:>14,} "
          f"{ratios['tokenize_throughput']:>7}x")
    print(f"{'bytes on disk per token':34} {t['seed']['bytes_per_token']:>14} "
          f"{t['ours']['bytes_per_token']:>14} {ratios['bytes_per_token']:>8}")
    print(f"{'loader non-pad tokens/s':34} {l_['seed']['tokens_per_s']:>14,} {l_['ours']['tokens_per_s']:>14,} "
          f"{ratios['loader_tokens_per_s']:>7}x")
    print(f"{'loader padding fraction':34} {l_['seed']['padding_fraction']:>14} "
          f"{l_['ours']['padding_fraction']:>14}")
    print(f"{'shard SHA-256 check / epoch read':34} {'':>14} {verify['verify_over_epoch_ratio']:>14} "
          f"({verify['verify_s']} s / {verify['epoch_read_s']} s, {verify['verify_mb_per_s']} MB/s)")
    print(f"{'loader peak RSS MB (1x -> 4x data)':34} {'':>14} "
          f"{memory['1x']['peak_rss_mb']:>6} -> {memory['4x']['peak_rss_mb']:<6}")
    print(f"{'bytes per token, uint32 vocab':34} {'':>14} {uint32['bytes_per_token']:>14}")
    for name, ok in targets.items():
        print(f"  [{'ok' if ok else 'MISSED'}] {name}")
    print(f"wrote {a.out}")
    return 0 if all(targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
