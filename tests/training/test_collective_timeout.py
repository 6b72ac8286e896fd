"""The collective timeouts reach every group the training collectives run on (training.parallel.distributed).

HSDP and FSDP x TP run their collectives on the device mesh's groups, which torch creates with its
own default timeout (30 min). Four gloo processes build both meshes (2 x 2) and read every group's
timeout at start-up and after ``set_timeout``; then a rank whose tensor-parallel peer never joins
must give up after the short timeout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CONFIG, TORCHRUN_COMMAND, torchrun_script

START_S, SHORT_S = 300, 2
LAYOUTS = {"hsdp": ["train.parallelism=hsdp", "train.hsdp_shard_size=2"],
           "fsdp_tp": ["train.parallelism=fsdp", "train.tensor_parallel=2"]}

WORKER = r"""
import json, os, sys, time, torch, torch.distributed as dist
from training.parallel import distributed
from training.dry_run import load_model_config

start_s, short_s, layouts, config, out = json.loads(sys.argv[1])
d = distributed.init(start_s)

def seconds(group):
    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()

def groups(mesh):  # every dimension's group, and the slices parallelize() takes
    slices = [mesh[names] for names in (("dp_replicate", "dp_shard"), ("dp_shard",), ("tp",))
              if set(names) <= set(mesh.mesh_dim_names)]
    return [seconds(g) for m in (mesh, *slices) for g in m.get_all_groups()]

meshes = {name: distributed.device_mesh(d, load_model_config(config, o).train) for name, o in layouts.items()}
result = {"start": {name: groups(mesh) for name, mesh in meshes.items()}}
distributed.set_timeout(d, short_s)
result["short"] = {name: groups(mesh) for name, mesh in meshes.items()}
result["default"], result["control"] = seconds(dist.group.WORLD), seconds(d.control_group)
result["checkpoint"] = seconds(d.checkpoint_group)
with open(f"{out}/rank{d.rank}.json", "w") as f:
    json.dump(result, f)
if d.rank == 0:  # its tensor-parallel peer (rank 1) never joins
    began = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1), group=meshes["fsdp_tp"]["tp"].get_group())
    except RuntimeError:
        with open(f"{out}/gave_up.json", "w") as f:
            json.dump(time.monotonic() - began, f)
dist.barrier(group=d.checkpoint_group)  # the long timeout: rank 1 waits here for rank 0
os._exit(0)  # rank 0's tensor-parallel group is broken: no orderly shutdown of it
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, str]:
    """The 4-process run's folder and output; a run still waiting after 60 s (a long timeout) is stopped."""
    out = tmp_path_factory.mktemp("timeouts")
    (out / "worker.py").write_text(WORKER)
    _, output = torchrun_script(out / "worker.py", json.dumps([START_S, SHORT_S, LAYOUTS, str(CONFIG), str(out)]),
                                timeout=60, launcher=TORCHRUN_COMMAND)
    return out, output


def test_mesh_groups_get_the_start_up_timeout_then_the_short_one(finished):
    out, output = finished
    assert all((out / f"rank{r}.json").exists() for r in range(4)), output[-4000:]
    for rank in (json.loads((out / f"rank{r}.json").read_text()) for r in range(4)):
        for layout in LAYOUTS:
            assert rank["start"][layout] and set(rank["start"][layout]) == {START_S}, (layout, rank["start"])
            assert set(rank["short"][layout]) == {SHORT_S}, (layout, rank["short"])
        assert rank["default"] == rank["control"] == SHORT_S
        assert rank["checkpoint"] == START_S  # the checkpoint writer's group keeps the long one


def test_a_missing_tensor_parallel_peer_ends_the_collective_after_the_short_timeout(finished):
    out, output = finished
    assert (out / "gave_up.json").exists(), "rank 0 still waited for its peer after 60 s:\n" + output[-4000:]
    assert SHORT_S <= json.loads((out / "gave_up.json").read_text()) < SHORT_S + 10
