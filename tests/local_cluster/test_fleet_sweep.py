"""The fleet sweep (jobs/fleet_sweep.sh): its pairing schedule and verdict, and one sweep over every node of
the local cluster with two injected faults, found and drained: one node fails its health check (the stand-in
check's marker, in a health conf of the test's own so that the prolog is not touched), another node's
network is slowed to 50 Mbit/s both ways (tbf on its veth, host side and node side), so every link it has is
slow while the link between the other two is not."""

from __future__ import annotations

import json
import subprocess

import pytest

from cluster_checks.fleet_sweep import Link, NodeChecks, judge, round_count, schedule
from local_cluster.client import cluster_name, hostnames


@pytest.mark.parametrize("count", [2, 3, 8, 9, 80])
def test_schedule_pairs_every_node_with_every_other_once(count):
    nodes = [f"n{i}" for i in range(count)]
    rounds = schedule(nodes)
    assert len(rounds) == round_count(count) == (count - 1 if count % 2 == 0 else count)
    pairs = [frozenset(pair) for pairs in rounds for pair in pairs]
    assert len(pairs) == len(set(pairs)) == count * (count - 1) // 2
    for pairs in rounds:  # each node in at most one pair of a round, and (n even) in every round
        busy = [node for pair in pairs for node in pair]
        assert len(busy) == len(set(busy)) >= count - 1


def healthy(node: str, read: float = 1000.0) -> NodeChecks:
    return NodeChecks(node, 0, "healthy", "pass", "", read)


def test_one_slow_link_between_good_nodes_is_named_not_blamed_on_a_node():
    nodes = ["a", "b", "c", "d"]
    links = [Link(a, b, r, 100.0) for r, pairs in enumerate(schedule(nodes)) for a, b in pairs]
    next(link for link in links if {link.a, link.b} == {"b", "c"}).busbw_gbps = 40.0
    verdict = judge(nodes, {n: healthy(n) for n in nodes}, links, 0.75, 0.5)
    assert verdict.bad_nodes == [] and verdict.reference_gbps == 100.0
    assert [{link.a, link.b} for link in verdict.slow_links] == [{"b", "c"}]


def test_a_uniformly_slow_fleet_passes_the_ratio_but_not_the_floor():
    nodes = ["a", "b", "c", "d"]
    links = [Link(a, b, r, 3.0) for r, pairs in enumerate(schedule(nodes)) for a, b in pairs]  # TCP, everywhere
    checks = {n: healthy(n) for n in nodes}
    assert judge(nodes, checks, links, 0.75, 0.5).bad_nodes == []
    floored = judge(nodes, checks, links, 0.75, 0.5, min_busbw_gbps=100.0)
    assert floored.bad_nodes == nodes and "below the floor 100 GB/s" in floored.nodes["a"][0]


def test_a_node_whose_every_link_is_slow_and_a_failed_check_are_bad_nodes():
    nodes = ["a", "b", "c", "d"]
    links = [Link(a, b, r, 20.0 if "d" in (a, b) else 100.0) for r, pairs in enumerate(schedule(nodes))
             for a, b in pairs]
    checks = {n: healthy(n) for n in nodes}
    checks["a"] = NodeChecks("a", 1, "GPU count 7, expected 8", "not available", "no dcgmi", 1000.0)
    checks["b"] = healthy("b", read=100.0)  # a tenth of the others' read
    del checks["c"]  # its checks never reported
    verdict = judge(nodes, checks, links, 0.75, 0.5)
    assert verdict.nodes["a"] == ["health check: GPU count 7, expected 8"]
    assert verdict.nodes["b"][0].startswith("storage read 100 MB/s, below 0.5 x the median 1000 MB/s")
    assert verdict.nodes["c"] == ["no record: its checks did not run"]
    assert verdict.nodes["d"][0].startswith("network: all 3 of its links slow or failed")
    assert verdict.slow_links == []  # every slow link is d's


def slow_network(node: str, on: bool) -> None:
    """50 Mbit/s each way through the node's veth (local_cluster/cluster.sh: veth_of, netns_of), or back."""
    name = cluster_name()
    sides = [[], ["nsenter", f"--net=/run/netns/lc{name}-{node}"]]
    devices = [f"lc{name}veth{node.removeprefix('node')}", "eth0"]
    for prefix, device in zip(sides, devices):
        command = ["add", "dev", device, "root", "tbf", "rate", "50mbit", "burst", "64kb", "latency", "200ms"]
        subprocess.run([*prefix, "tc", "qdisc", *(command if on else ["del", "dev", device, "root"])],
                       check=on, capture_output=True)


@pytest.mark.slurm
def test_sweep_checks_every_node_and_drains_the_injected_bad_ones(slurm_cluster, tmp_path):
    nodes = hostnames(subprocess.run(["sinfo", "-h", "-p", "gpu", "-o", "%N"], capture_output=True, text=True,
                                     check=True).stdout.strip())
    assert len(nodes) >= 3
    sick, slow = nodes[-1], nodes[1]
    test_dir = slurm_cluster.fsx / "fleet-sweep-test"
    markers = test_dir / "health-markers"
    markers.mkdir(parents=True, exist_ok=True)
    (markers / sick).write_text("GPU 5 fell off the bus (Xid 79)\n")
    conf = test_dir / "health.conf"  # the prolog's settings, but this test's markers
    conf.write_text((slurm_cluster.base / "opt/slurm/etc/llm/health.conf").read_text()
                    + f"LOCAL_HEALTH_MARKERS={markers}\n")
    out = test_dir / "out"
    env = {"HEALTH_CONF": str(conf), "FLEET_SWEEP_OUT": "/fsx/fleet-sweep-test/out", "FLEET_SWEEP_BYTES": "4M",
           "FLEET_SWEEP_READ_BYTES": "16M",
           # Every local node reads through one kernel's page cache: the read figures are noise, not a node's.
           "FLEET_SWEEP_READ_RATIO": "0.05"}
    slow_network(slow, True)
    try:
        job = slurm_cluster.sbatch("jobs/fleet_sweep.sh", env=env, options=[f"--nodes={len(nodes)}"])
        state, code = slurm_cluster.wait(job, timeout=600)
        output = (slurm_cluster.fsx / "logs" / "validation" / f"fleet-sweep_{job}.out").read_text()
        assert (state, code) == ("FAILED", 1), output[-4000:]
        report = json.loads((out / "report.json").read_text())
        assert sorted(report["bad_nodes"]) == sorted([sick, slow]), output[-4000:]
        assert report["nodes"][sick] == ["health check: stand-in check: GPU 5 fell off the bus (Xid 79)"]
        assert report["nodes"][slow][0].startswith(f"network: all {len(nodes) - 1} of its links slow or failed")
        assert report["slow_links"] == [] and report["not_drained"] == []
        assert len(report["rounds"]) == round_count(len(nodes))
        assert len(report["links"]) == len(nodes) * (len(nodes) - 1) // 2  # every pair measured
        assert all(c["gpu_diag"] == "not available" and c["read_mb_s"] for c in report["checks"].values())
        assert "no dcgmi" in report["checks"][nodes[0]]["gpu_diag_detail"]
        assert "for 80 nodes: " in output and "79 rounds x" in output
        for node in (sick, slow):
            shown = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True).stdout
            assert "DRAIN" in shown and f"fleet sweep {job}: " in shown, shown
        good = [n for n in nodes if n not in (sick, slow)]
        assert all(report["nodes"][n] == [] for n in good)
        print(report["estimate"])
    finally:
        slow_network(slow, False)
        for node in (sick, slow):  # back into service, only if this sweep drained it
            shown = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True).stdout
            if "fleet sweep" in shown:
                subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
