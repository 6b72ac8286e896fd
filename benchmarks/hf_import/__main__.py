"""Bytes each rank reads of released weights (model.init_from) and prod's import times, 70B's among them.

Released weights are read by training/models/hf_weights.py, each rank its own slices.

    .venv/bin/python -m benchmarks.hf_import [--hidden 256] [--out benchmarks/results/hf_import.json]

Measured: a Llama checkpoint of ``--hidden`` width (4 layers, vocab 4096, bf16 as released), made here
with transformers, imported by 4 gloo processes (torchrun) in DDP 4, FSDP 4, HSDP 2 x 2 and FSDP 2 x
TP 2; per layout, each rank's ``bytes_read_by_rank`` over the checkpoint's tensor bytes, and the
import's seconds (the slowest rank). Computed: the same figures from DTensor's placement rules alone
(what hf_weights reads by: ``compute_local_shape_and_global_offset``), on the fake process group,
for each layout here (they must equal the measured ones) and for each prod model in its own layout
and world size, its preset's checkpoint in bf16. A prod model's import time is the bytes all its
ranks read / the checkpoint file system's throughput (prod.yaml's storage.checkpoints, the figure the
planner's save times use): a lower bound, with the file system the only limit. Writes JSON.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "jobs")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from cli import ArgumentParser  # noqa: E402
from cluster_config.model_jobs import bundled_cluster  # noqa: E402
from cluster_config.settings import load_settings  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset  # noqa: E402
from training.parallel import distributed  # noqa: E402
from training.dry_run import fake_dist, load_model_config, production_setup  # noqa: E402
from training.models.llama import build_model, canonical_name, count_parameters, hf_config  # noqa: E402
from training.models.presets import resolve  # noqa: E402

CONFIG = REPO / "jobs/training/configs/tiny.yaml"
LAYOUTS = {"ddp": ["train.parallelism=ddp"], "fsdp": ["train.parallelism=fsdp"],
           "hsdp": ["train.parallelism=hsdp", "train.hsdp_shard_size=2"],
           "fsdp_tp": ["train.parallelism=fsdp", "train.tensor_parallel=2"]}
STORED_BYTES = 2  # bf16: how Llama, Mistral and Qwen release their weights
WORKER = Path(__file__).with_name("worker.py")


def make_checkpoint(folder: Path, hidden: int) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", vocab_size=4096, hidden_size=hidden, intermediate_size=3 * hidden - 6,
                                  num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                  max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    return folder


def measured(folder: Path, tmp: Path) -> dict:
    """{layout: {"bytes": [per rank], "seconds": slowest rank's import}} from 4 real gloo processes."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "jobs"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node=4",
                           str(WORKER), json.dumps([str(folder), LAYOUTS, str(CONFIG), str(tmp)])],
                          env=env, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"the import workers failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    ranks = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(4)]
    return {layout: {"bytes": [r[layout]["bytes"] for r in ranks], "seconds": max(r[layout]["seconds"] for r in ranks)}
            for layout in LAYOUTS}


def computed(cfg, model_config, world_size: int, itemsize: int) -> list[int]:
    """Each rank's bytes to read, by DTensor's placement rules, on the fake process group: a two-layer model
    of ``model_config``'s widths, its layer 0 counted once per layer of the real one."""
    layers = model_config.num_hidden_layers
    if cfg.train.parallelism == "ddp":  # whole copies: every rank reads everything
        return [itemsize * count_parameters(model_config)[0]] * world_size
    small = copy.deepcopy(model_config)
    small.num_hidden_layers = 2
    d = fake_dist(world_size)
    try:
        mesh = distributed.device_mesh(d, cfg.train)
        model = distributed.parallelize(build_model(small), cfg.train, d, mesh, mixed_precision=False, compile=False)
        names, grid = mesh.mesh_dim_names, mesh.mesh
        coordinates = {int(grid[index]): index for index in itertools.product(*map(range, grid.shape))}
        per_rank = [0] * world_size
        for name, p in model.named_parameters():
            name = canonical_name(name)
            if ".layers." in name and ".layers.0." not in name:
                continue
            times = layers if ".layers.0." in name else 1
            for rank, coordinate in coordinates.items():
                if isinstance(p, DTensor):
                    own = [coordinate[names.index(n)] for n in p.device_mesh.mesh_dim_names]
                    shape, _ = _compute_local_shape_and_global_offset(p.shape, p.device_mesh.shape, own, p.placements)
                else:
                    shape = p.shape
                numel = 1
                for n in shape:
                    numel *= n
                per_rank[rank] += times * numel * itemsize
        return per_rank
    finally:
        dist.destroy_process_group()


def prod_models() -> list[dict]:
    """Each prod model's preset (bf16, the plan's vocabulary) imported in its own layout."""
    cluster, settings, rows = bundled_cluster("prod"), load_settings("prod"), []
    throughput = settings.storage.checkpoints.throughput_mb_s * 1e6
    for model in cluster.models:
        raw, world_size, _ = production_setup(model, cluster)
        cfg = load_model_config(raw)
        vocab = cfg.model.vocab_size or resolve(cfg.model.preset).vocab or settings.plan.vocab_size
        model_config = hf_config(cfg.model.preset, vocab, cfg.data.seq_len)
        checkpoint = STORED_BYTES * count_parameters(model_config)[0]
        per_rank = computed(cfg, model_config, world_size, STORED_BYTES)
        layout = cfg.train.parallelism + (f" shards of {cfg.train.hsdp_shard_size}" if cfg.train.parallelism == "hsdp"
                                          else "") + (f" x TP {cfg.train.tensor_parallel}"
                                                      if cfg.train.tensor_parallel > 1 else "")
        rows.append({"model": model, "preset": cfg.model.preset, "layout": layout, "world_size": world_size,
                     "checkpoint_bytes": checkpoint, "max_rank_ratio": max(per_rank) / checkpoint,
                     "min_rank_ratio": min(per_rank) / checkpoint, "all_ranks_ratio": sum(per_rank) / checkpoint,
                     "throughput_mb_s": throughput / 1e6, "import_s": sum(per_rank) / throughput})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256, help="width of the measured checkpoint (default 256)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/hf_import.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hf_import-") as tmp:
        folder = make_checkpoint(Path(tmp) / "released", args.hidden)
        arch = resolve(str(folder))
        model_config = hf_config(arch, arch.vocab, 128)
        checkpoint = STORED_BYTES * count_parameters(model_config)[0]
        runs = measured(folder, Path(tmp))
        layouts = {}
        for layout, run in runs.items():
            cfg = load_model_config(CONFIG, [*LAYOUTS[layout], f"model.preset={folder}"])
            layouts[layout] = {"rank_ratios": [b / checkpoint for b in run["bytes"]],
                               "computed_rank_ratios": [b / checkpoint for b in computed(cfg, model_config, 4,
                                                                                         STORED_BYTES)],
                               "all_ranks_ratio": sum(run["bytes"]) / checkpoint, "seconds": run["seconds"]}
    result = {"measured": {"checkpoint_bytes": checkpoint, "hidden": args.hidden, "ranks": 4, "layouts": layouts},
              "models": prod_models()}
    print(f"measured: a {checkpoint / 1e6:.1f} MB bf16 checkpoint on 4 gloo ranks; bytes read per rank / checkpoint")
    for layout, row in layouts.items():
        agree = "= computed" if row["rank_ratios"] == row["computed_rank_ratios"] else "!= computed"
        print(f"  {layout:8s} {' '.join(f'{r:.3f}' for r in row['rank_ratios'])} ({agree}); all ranks "
              f"{row['all_ranks_ratio']:.2f} x the checkpoint, {row['seconds']:.2f} s")
    print("prod, computed: bytes per rank / checkpoint, and the import at the checkpoint file system's throughput")
    for row in result["models"]:
        print(f"  {row['model']} ({row['preset']}, {row['layout']}, {row['world_size']} GPUs): "
              f"{row['checkpoint_bytes'] / 1e9:.1f} GB, per rank {row['min_rank_ratio']:.4f}-{row['max_rank_ratio']:.4f}, "
              f"all ranks {row['all_ranks_ratio']:.2f} x: {row['import_s']:.0f} s at {row['throughput_mb_s']:,.0f} MB/s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(row["rank_ratios"] == row["computed_rank_ratios"] for row in layouts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
