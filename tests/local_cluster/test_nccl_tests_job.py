"""`sbatch jobs/nccl_tests.sh` on the local Slurm cluster: nccl-tests is built once into NCCL_TESTS_HOME,
under its lock, while two jobs start together; every node checks it sees the binaries; each rank runs
them from there; the logs are parsed and checked.

The nodes have no GPU, CUDA or EFA: the hardware and its toolchain are stand-ins on PATH. `nvidia-smi`
lists one GPU; `git` and `make` "build" nccl-tests by writing six programs that print recorded
nccl-tests output (tests/local_cluster/fixtures/nccl_tests_efa.log) for their collective.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from local_cluster.client import CLUSTER_USER, give_to

pytestmark = pytest.mark.slurm

FIXTURE = Path(__file__).parent / "fixtures" / "nccl_tests_efa.log"
# Two CPUs per local node and no GPUs: one rank per node, and two jobs may share the nodes.
OPTIONS = ["--ntasks-per-node=1", "--gpus-per-node=0", "--exclusive=user"]

NVIDIA_SMI = '#!/bin/bash\n[[ $1 == -L ]] && echo "GPU 0: Stand-in GPU (UUID: GPU-0)"\nexit 0\n'
GIT = '#!/bin/bash\n# git clone ... DEST: an empty source tree\nmkdir -p "${@: -1}"\n'
# `make ... BUILDDIR=DIR`: slow enough that the second job reaches the lock while the first builds.
MAKE = """#!/bin/bash
for arg; do [[ $arg == BUILDDIR=* ]] && build=${arg#BUILDDIR=}; done
echo "make on $(hostname)" >>"{calls}"
sleep 3
mkdir -p "$build"
for t in all_reduce_perf all_gather_perf broadcast_perf reduce_perf reduce_scatter_perf alltoall_perf; do
  cat >"$build/$t" <<'EOF'
#!/bin/bash
# Rank 0 prints, as nccl-tests does under MPI: its collective's part of the recorded run.
[[ ${SLURM_PROCID:-0} == 0 ]] || exit 0
awk -v b="$(basename "$0")" '/^# Collective test starting:/ { on = ($5 == b) } on' "{fixture}"
EOF
  chmod +x "$build/$t"
done
"""


@pytest.fixture
def work(slurm_cluster):
    """A folder of the cluster's user, who submits the jobs, that the nodes see at the same path (pytest's
    temporary folders are root's alone)."""
    folder = slurm_cluster.fsx / "tests/nccl_tests" / uuid.uuid4().hex[:8]
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder)


@pytest.fixture
def toolchain(work) -> dict[str, str]:
    """Stand-ins for the GPU node's tools; returns the job environment that uses them."""
    bin_dir, cuda, mpi = work / "bin", work / "cuda", work / "openmpi"
    for folder in (bin_dir, cuda / "bin", cuda / "include", mpi / "bin"):
        folder.mkdir(parents=True)
    scripts = {bin_dir / "nvidia-smi": NVIDIA_SMI, bin_dir / "git": GIT, cuda / "bin" / "nvcc": "#!/bin/true\n",
               mpi / "bin" / "mpicc": "#!/bin/true\n",
               bin_dir / "make": MAKE.replace("{calls}", str(work / "make.calls")).replace("{fixture}", str(FIXTURE))}
    for path, text in scripts.items():
        path.write_text(text)
        path.chmod(0o755)
    (cuda / "include" / "nccl.h").write_text("/* stand-in */\n")
    (work / "shared").mkdir()
    give_to(CLUSTER_USER, work)  # as the node setup gives it JOBS_HOME/tools, where the build goes by default
    # NCCL_TESTS_MPI=none: the local nodes have no PMIx library, and the stand-ins need no MPI.
    return {"CUDA_HOME": str(cuda), "NCCL_HOME": str(cuda), "MPI_HOME": str(mpi), "BIN": str(bin_dir), "NCCL_TESTS_MPI": "none",
            "NCCL_TESTS_HOME": str(work / "shared" / "nccl-tests")}


def test_two_jobs_build_nccl_tests_once_and_run_it_on_every_node(slurm_cluster, toolchain, work):
    env = {**toolchain, "PATH": f"{toolchain['BIN']}:{slurm_cluster.env['PATH']}"}
    jobs = [slurm_cluster.sbatch("jobs/nccl_tests.sh", env=env, options=[f"--nodes={n}", *OPTIONS], user=CLUSTER_USER)
            for n in (2, 1)]
    logs = {}
    for job in jobs:
        state = slurm_cluster.wait(job, timeout=300)
        logs[job] = (slurm_cluster.fsx / "logs" / "validation" / f"nccl-tests_{job}.out").read_text()
        assert state == ("COMPLETED", 0), logs[job][-3000:]

    # One build for both jobs: the second waited on the lock, then found the binaries.
    assert len((work / "make.calls").read_text().splitlines()) == 1
    assert sum(log.count("building nccl-tests") for log in logs.values()) == 1
    two_nodes = jobs[0]
    assert f"job {two_nodes}: 2 nodes" in logs[two_nodes]
    results = json.loads((slurm_cluster.fsx / "logs" / "validation" / f"nccl-tests_{two_nodes}" / "results.json").read_text())
    assert results["transport_ok"] is True and len(results["results"]) == 36
    assert "transport: EFA" in logs[two_nodes]
