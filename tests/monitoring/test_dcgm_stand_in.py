"""The local cluster's DCGM exporter stand-in serves the GPU fields the cluster collects, as DCGM names them:
every Xid of its fault file counted by code (DCGM_EXP_XID_ERRORS_COUNT), not only the last one."""

from __future__ import annotations

import re

from cluster_config.monitoring import DCGM_FIELDS
from local_cluster.stand_ins.dcgm_exporter import read_faults, render


def samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")}


def test_it_serves_exactly_the_fields_the_cluster_collects():
    names = set(re.findall(r"^# TYPE (\S+) (\S+)$", render("node1", 2, {}), re.M))
    assert names == set(DCGM_FIELDS)


def test_every_xid_of_a_gpu_is_counted_by_code(tmp_path):
    faults = tmp_path / "node1.xid"
    faults.write_text("3 79\n3 43\n1 48\n1 48\n2 temp 91\nnot a fault\n")
    got = samples(render("node1", 4, read_faults(faults)))
    xids = {key: value for key, value in got.items() if key.startswith("DCGM_EXP_XID_ERRORS_COUNT")}
    label = 'DCGM_EXP_XID_ERRORS_COUNT{{gpu="{}",UUID="{}",device="nvidia{}",modelName="NVIDIA A10G (stand-in)",Hostname="node1",window_size_in_ms="300000"{}}}'
    uuid = {i: re.search(rf'gpu="{i}",UUID="([^"]+)"', "\n".join(got)).group(1) for i in range(4)}
    assert xids == {label.format(3, uuid[3], 3, ',xid="79"'): 1, label.format(3, uuid[3], 3, ',xid="43"'): 1,
                    label.format(1, uuid[1], 1, ',xid="48"'): 2,
                    label.format(0, uuid[0], 0, ""): 0, label.format(2, uuid[2], 2, ""): 0}  # none: one series, 0
    dbe = {key.split('gpu="')[1][0]: value for key, value in got.items() if key.startswith("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")}
    assert dbe == {"0": 0, "1": 2, "2": 0, "3": 0}  # each Xid 48 is a double-bit ECC error
    temps = {key.split('gpu="')[1][0]: value for key, value in got.items() if key.startswith("DCGM_FI_DEV_GPU_TEMP")}
    assert temps == {"0": 30, "1": 31, "2": 91, "3": 33}
    faults.unlink()  # the fix: no fault, no Xid
    assert all(value == 0 for key, value in samples(render("node1", 4, read_faults(faults))).items()
               if key.startswith("DCGM_EXP_XID_ERRORS_COUNT"))
