"""Initial weights (training.models.llama.init_weights) are the same in every layout and never repeat.

Four gloo processes build a small model in DDP 4, FSDP 4, HSDP 2 x 2 and FSDP 2 x TP 2 and
initialize it. Its widths split unevenly, as 70B's do (k/v: 6 rows -> TP 3 + 3 -> FSDP 2 + 1;
gate/up: 11 rows -> 6 + 5 -> 3 + 3 and 3 + 2; FSDP 4 leaves one rank an empty k/v shard), and FSDP x
TP splits Q/K/V and gate/up twice along dim 0. Every layout must give the un-sharded model's values,
and no two parameters, nor two shards of one, may be equal.

The 70B layout (FSDP 34 x TP 8) cannot be initialized here: its old GPU path (DTensor's random ops)
is replayed with torch's own offset arithmetic instead, to show the duplicates it drew.
"""

from __future__ import annotations

import hashlib
import itertools
import json

import pytest
import torch
import torch.distributed as dist
from conftest import CONFIG, torchrun_script
from transformers import LlamaConfig

from training.parallel import distributed
from training.dry_run import fake_dist, load_model_config
from training.models.llama import build_model, canonical_name, init_weights, hf_config, param_seed

# Even heads for RoPE, uneven everything else: q 18 rows, k/v 6 (one KV head), gate/up 11, vocab 7.
ODD = dict(vocab_size=7, hidden_size=18, intermediate_size=11, num_hidden_layers=2, num_attention_heads=3,
           num_key_value_heads=1, head_dim=6, tie_word_embeddings=False, use_cache=False)
LAYOUTS = {"ddp": ["train.parallelism=ddp"], "fsdp": ["train.parallelism=fsdp"],
           "hsdp": ["train.parallelism=hsdp", "train.hsdp_shard_size=2"],
           "fsdp_tp": ["train.parallelism=fsdp", "train.tensor_parallel=2"]}

WORKER = r"""
import hashlib, json, sys, torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from transformers import LlamaConfig
from training.parallel import distributed
from training.dry_run import load_model_config
from training.models.llama import canonical_name
from training.train import build

odd, layouts, config, out = json.loads(sys.argv[1])
d = distributed.init(60)
result = {}
for layout, overrides in layouts.items():
    cfg = load_model_config(config, overrides)
    model, _ = build(cfg, LlamaConfig(**odd), d, distributed.device_mesh(d, cfg.train))
    shards = {}  # this rank's block of each parameter: [name, its shard's index] -> its place and digest
    for name, p in model.named_parameters():
        local, index, offset, placements = p.detach(), [], [0] * p.dim(), ""
        if isinstance(p, DTensor):
            local, placements = p.to_local().detach(), str(tuple(p.placements))
            coordinate = p.device_mesh.get_coordinate()
            index = [c for c, placement in zip(coordinate, p.placements) if not placement.is_replicate()]
            offset = list(compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)[1])
        shards[json.dumps([canonical_name(name), index])] = {
            "offset": offset, "shape": list(local.shape), "placements": placements,
            "digest": hashlib.sha256(local.contiguous().numpy().tobytes()).hexdigest()}
    # What the forward computes with: FSDP's gathered parameters, then the tensor-parallel ones gathered.
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.unshard()
    full = {canonical_name(name): (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for name, p in model.named_parameters()}
    result[layout] = {"shards": shards, "full": full}
torch.save(result, f"{out}/rank{d.rank}.pt")
distributed.shutdown()
"""


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> list[dict]:
    """Per rank: {layout: {"shards": {key: {offset, shape, placements, digest}}, "full": {name: tensor}}}."""
    out = tmp_path_factory.mktemp("init")
    (out / "worker.py").write_text(WORKER)
    code, output = torchrun_script(out / "worker.py", json.dumps([ODD, LAYOUTS, str(CONFIG), str(out)]))
    assert code == 0, output[-4000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(4)]


def reference() -> dict[str, torch.Tensor]:
    model = build_model(LlamaConfig(**ODD))
    init_weights(model, model.config, torch.device("cpu"), seed=0)
    return {canonical_name(name): p.detach() for name, p in model.named_parameters()}


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_starts_from_the_unsharded_models_weights(layouts, layout):
    """Each rank's shard is its slice of the un-sharded init, and so is what the forward gathers."""
    expected = reference()
    for rank in layouts:
        full = rank[layout]["full"]
        assert sorted(full) == sorted(expected)
        for name, value in expected.items():
            assert torch.equal(full[name], value), (layout, name)
        for key, shard in rank[layout]["shards"].items():
            value = expected[json.loads(key)[0]]
            part = value[tuple(slice(o, o + n) for o, n in zip(shard["offset"], shard["shape"]))]
            assert shard["digest"] == digest(part), (layout, key)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_no_two_parameters_nor_two_shards_are_equal(layouts, layout):
    matrices = {name: t for name, t in layouts[0][layout]["full"].items() if t.dim() == 2}
    assert len({digest(t) for t in matrices.values()}) == len(matrices)
    blocks: dict[str, str] = {}  # (parameter, shard index) -> digest; replicas must agree
    for rank in layouts:
        for key, shard in rank[layout]["shards"].items():
            if json.loads(key)[0] in matrices and shard["shape"][0]:  # norms are all ones; FSDP 4: an empty k/v shard
                assert blocks.setdefault(key, shard["digest"]) == shard["digest"], (layout, key)
    assert len(set(blocks.values())) == len(blocks), layout


def test_the_layouts_split_twice_and_unevenly(layouts):
    """What the two tests above cover: double split along dim 0 with uneven and empty shards."""
    def rows(layout, name):  # each rank's rows of the parameter
        return sorted(shard["shape"][0] for r in layouts for key, shard in r[layout]["shards"].items()
                      if json.loads(key)[0] == name)

    gate, k = "model.layers.0.mlp.gate_proj.weight", "model.layers.0.self_attn.k_proj.weight"
    placements = layouts[0]["fsdp_tp"]["shards"][json.dumps([gate, [0, 0]])]["placements"]
    assert placements == "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
    assert rows("fsdp_tp", gate) == [2, 3, 3, 3] and rows("fsdp_tp", k) == [1, 1, 2, 2]
    assert rows("fsdp", k) == [0, 2, 2, 2]


def test_the_70b_layout_old_gpu_path_repeated_values_and_the_new_one_cannot(monkeypatch):
    """llama2-70b on FSDP 34 x TP 8 (272 ranks, the fake process group, meta device; two layers).

    Old path: DTensor's random ops on CUDA give each shard the range of one shared Philox stream that
    torch's ``OffsetBasedRNGTracker._compute_rng_offsets`` computes. Replayed here for every rank:
    with Q/K/V and gate/up split twice along dim 0, a shard on data-parallel rank >= 1 starts in the
    next parameter's range, so k_proj's shard at (dp 1, tp j) draws exactly v_proj's at (dp 0, tp j).
    New path: one generator per parameter, seeded by its name (all 562 matrices of the 80-layer
    model get distinct seeds), and each rank keeps its block by DTensor's placement rules (checked
    against the real shards above), which cover the parameter once.
    """
    from torch.distributed.tensor._random import OffsetBasedRNGTracker
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    cfg = load_model_config(CONFIG, ["train.parallelism=fsdp", "train.tensor_parallel=8", "model.preset=llama2-70b"])
    model_config = hf_config("llama2-70b", 32000, 4096)
    all_names = [name for name, p in build_model(model_config).named_parameters() if p.dim() == 2]
    assert len({param_seed(0, name) for name in all_names}) == len(all_names) == 562
    model_config.num_hidden_layers = 2
    d = fake_dist(272)
    try:
        mesh = distributed.device_mesh(d, cfg.train)
        model = distributed.parallelize(build_model(model_config), cfg.train, d, mesh, mixed_precision=True)
        tracker = object.__new__(OffsetBasedRNGTracker)  # its arithmetic only: the real one needs a GPU
        stream, starts, repeats = 0, {}, []
        for name, p in model.named_parameters():
            if p.dim() < 2:
                continue
            spec, blocks = p._spec, []
            for coordinate in itertools.product(*map(range, spec.mesh.shape)):
                monkeypatch.setattr(spec.mesh, "_sym_get_coordinate", lambda i, c=coordinate: c[i])
                start, numel = tracker._compute_rng_offsets(spec)
                shape, offset = _compute_local_shape_and_global_offset(p.shape, spec.mesh.shape, coordinate,
                                                                       p.placements)
                first = starts.setdefault((stream + start, shape), (name, coordinate))  # same start, same draw
                if first[0] != name:
                    repeats.append((first, (name, coordinate)))
                blocks.append((offset, shape))
            stream += numel
            assert_partition(name, p.shape, blocks)
    finally:
        dist.destroy_process_group()
    k, v = "model.layers.{}.self_attn.k_proj.weight", "model.layers.{}.self_attn.v_proj.weight"
    for layer, tp in itertools.product(range(2), range(8)):
        assert ((k.format(layer), (1, tp)), (v.format(layer), (0, tp))) in repeats
    assert len(repeats) > 1000


def assert_partition(name: str, shape: tuple[int, int], blocks: list[tuple[tuple, tuple]]) -> None:
    """The (offset, shape) blocks cover a matrix of ``shape`` once: counted on the grid of their edges."""
    edges = [sorted({0, shape[i]} | {o[i] + n for o, s in blocks for n in (0, s[i])}) for i in range(2)]
    cover = torch.zeros(len(edges[0]) - 1, len(edges[1]) - 1, dtype=torch.int32)
    for offset, size in blocks:
        rows, cols = ((edges[i].index(offset[i]), edges[i].index(offset[i] + size[i])) for i in range(2))
        cover[slice(*rows), slice(*cols)] += 1
    assert bool((cover == 1).all()), name


def test_wrapped_parameter_names_map_to_the_model_s_own():
    """Activation checkpointing, DDP and torch.compile add parts to a name; the seed must not see them
    (it once turned '_checkpoint_wrapped_module.' into '_checkpoint_wrapped_', re-seeding recomputed layers)."""
    plain = "model.layers.0.self_attn.q_proj.weight"
    for wrapped in ("module.model.layers.0._checkpoint_wrapped_module.self_attn.q_proj.weight",
                    "model.layers.0._checkpoint_wrapped_module._orig_mod.self_attn.q_proj.weight"):
        assert canonical_name(wrapped) == plain
