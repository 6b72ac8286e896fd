"""Shared fixtures.

``slurm_cluster`` (session): the real local two-node Slurm cluster (local_cluster/cluster.sh),
started once per test session if it is not already up and stopped at the end only if this
session started it. Skipped only where the machine cannot run it (not root, no namespaces).
It is a ``local_cluster.client.LocalCluster``:

    .sbatch(script, *args, env=None, options=()) -> job id   (submitted from the repo root)
    .wait(job_id, timeout=180) -> (state, exit_code)          (via scontrol show job)
    .jobs(job_id) -> list of scontrol records (dicts)
    .fsx   host path of the stand-in /fsx (.local_cluster/fsx: data/, checkpoints/, logs/)
    .env   environment jobs are submitted with (JOBS_VENV = the repo's .venv)
    .repo  repository root

Mark tests that use it with ``@pytest.mark.slurm``.

``dev_jobs`` (session): dev's model job scripts and configs written into jobs/ (jobs/train_<model>.sh,
jobs/models/<model>.yaml), as the local cluster's ``up`` and, for its environment, the cluster stack do.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster_config.model_jobs import write_job_files
from cluster_config.settings import load_settings
from local_cluster.client import LocalCluster, cluster_name, unsupported_reason


@dataclass
class ClusterSession:
    cluster: LocalCluster
    up_before_session: bool  # started outside this test session: never stop it
    started_here: bool = False


@pytest.fixture(scope="session")
def dev_jobs() -> list:
    return write_job_files(load_settings("dev"), LocalCluster().repo / "jobs")


@pytest.fixture(scope="session")
def cluster_session() -> ClusterSession:
    reason = unsupported_reason()
    if reason:
        pytest.skip(reason)
    cluster = LocalCluster()
    return ClusterSession(cluster, up_before_session=cluster.is_up())


@pytest.fixture(scope="session")
def slurm_cluster(cluster_session: ClusterSession, dev_jobs):
    cluster = cluster_session.cluster
    if not cluster.is_up():
        cluster.up()
        cluster_session.started_here = True
    yield cluster
    if cluster_session.started_here and not cluster_session.up_before_session:
        cluster.down()


# --- the tiers and where the suite's time goes (docs/testing.md) --------------------------------------
SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")


def pytest_collection_modifyitems(items):
    """Mark slow the tests a measured run found slow (tests/slow_tests.txt), beside those marked by hand,
    and every test sharing a module-scoped fixture with one of them: the run charged the fixture's
    set-up to the first test that used it, and would charge it to the next one left in the tier."""
    listed = {line.strip() for line in SLOW_TESTS.read_text().splitlines() if line.strip() and not line.startswith("#")}
    slow_fixtures = {(item.path, name) for item in items if item.nodeid in listed
                     for name, defs in item._fixtureinfo.name2fixturedefs.items() if defs[-1].scope == "module"}
    for item in items:
        if item.nodeid in listed or any((item.path, name) in slow_fixtures for name in item.fixturenames):
            item.add_marker(pytest.mark.slow)


# With SUITE_TIMES=<file>, every test appends one JSON line: its id, whether it needs the local
# cluster and which one ran it, its wall time and the CPU time of this process and the children it
# waited for (setup, call and teardown together, so a session fixture is charged to the first test that
# needs it). scripts/suite_times.py turns the lines of make test's four processes into the docs' tables.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get("SUITE_TIMES")
    if not path:
        yield
        return
    wall0, cpu0 = time.monotonic(), _cpu_seconds()
    yield
    record = {
        "test": item.nodeid,
        "slurm": (slurm := item.get_closest_marker("slurm") is not None),
        "cluster": (cluster_name() or "default") if slurm else "",
        "wall_s": round(time.monotonic() - wall0, 3),
        "cpu_s": round(_cpu_seconds() - cpu0, 3),
    }
    with open(path, "a") as out:  # one short line per write: make test's four processes share the file
        out.write(json.dumps(record) + "\n")


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
