"""The node scripts on stand-in nodes built from node_scripts/ami/parallelcluster-3.16-al2023.yaml,
the checked-in description of ParallelCluster's official AL2023 AMI per node type.

Each stand-in node is a folder laid out like the node's own disk: the commands the description names,
at the paths it names, behaving as it says (nvidia-smi and fi_info that fail on the CPU node, a
system Python 3.9 and no python3.11, a `dnf` that installs python3.11), fake /dev and /sys trees
with the node's GPUs and EFA devices, and the cfnconfig. Every node runs in its own mount namespace
with its folder bound at one fixed path, so the head node and the compute nodes see the same
absolute paths (JOBS_PYTHON, the cfnconfig) with their own contents, as on a cluster, and share only
what the head node shares (JOBS_HOME, /opt/slurm). FSx mounts are tmpfs, S3 is a folder.

Findings re-created here:
  A  the venv the head node builds links to python3.11, which compute nodes lacked: jobs failed at `python`
  B  node_health.sh took an installed nvidia-smi/fi_info for a GPU/EFA node: every CPU node drained
  C  without /etc/parallelcluster/cfnconfig the head node's set-up was skipped silently
  E  the head node's log did not say how long its steps took
  F  node_health.sh read the kernel log with `dmesg || true`: one it could not read passed every Xid
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster_config.settings import model_uid

from tests.marks import needs_mount_namespace
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "node_scripts"
AMI_FILE = SCRIPTS / "ami" / "parallelcluster-3.16-al2023.yaml"
AMI = yaml.safe_load(AMI_FILE.read_text())
REAL_PYTHON = os.path.realpath(sys.executable)  # a real CPython: what the stand-in dnf installs as python3.11
STAND_IN_MODULE = "llm_jobs_stand_in"  # in JOBS_VENV_SITE_PACKAGES, the stand-in for the jobs' PyPI packages
# The stand-in GPU node's nvidia-smi answers only -L: the check says what it could not see (nvidia-smi -q's parts,
# each tested in test_node_health.py) and goes on.
NO_SMI_Q = "nvidia-smi -q is not available here (exit 2): row remapping and the NVSwitch fabric not checked"


def _tool(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def _free_id() -> int:
    """A uid/gid unused on this machine, for the node's ec2-user (bound over /etc/passwd in its namespace)."""
    taken = set()
    for name in ("/etc/passwd", "/etc/group"):
        for line in Path(name).read_text().splitlines():
            fields = line.split(":")
            if len(fields) > 2 and fields[2].isdigit():
                taken.add(int(fields[2]))
    return next(i for i in range(61000, 62000) if i not in taken)


@dataclass
class Cluster:
    tmp: Path
    mount: Path  # where each node's folder is bound in its namespace: that node's "/"
    shared: Path  # what the head node shares over NFS
    fsx: Path
    bucket: Path
    site_packages: Path
    head: Path | None = None  # the head node's folder, once it has bootstrapped
    head_result: subprocess.CompletedProcess | None = None

    @property
    def jobs_home(self) -> Path:
        return self.shared / "opt" / "llm-jobs"

    def at(self, path: str) -> Path:
        """A path of the description (an absolute path on the node), as the node's scripts see it."""
        return self.mount / path.lstrip("/")

    def build(self, name: str, kind: str, *, visible_gpus: int | None = None, pci_gpus: int | None = None,
              nvidia_smi_works: bool | None = None, fi_info_works: bool | None = None, dmesg: str | None = "",
              cfnconfig: bool = True) -> Path:
        """Node folder for AMI['nodes'][kind]; keywords override one fact (a broken GPU, a failing tool;
        dmesg=None: a kernel log that cannot be read)."""
        spec = AMI["nodes"][kind]
        root = self.tmp / "nodes" / name
        root.mkdir(parents=True)
        on = lambda path: root / path.lstrip("/")  # noqa: E731  a described path on this node's disk
        python, nvidia, efa = spec["python"], spec["nvidia"], spec["efa"]

        system = python["system"]
        for path in (system["path"], f"/usr/bin/python{system['version']}"):
            _tool(on(path), f'[[ "$*" == --version ]] && {{ echo "Python {system["version"]}.16"; exit 0; }}\n'
                            f'echo "stand-in for the AMI\'s system Python {system["version"]}: not for jobs" >&2\nexit 1\n')
        jobs_python = python["jobs_interpreter"]
        if jobs_python["present"]:
            on(jobs_python["path"]).parent.mkdir(parents=True, exist_ok=True)
            on(jobs_python["path"]).symlink_to(REAL_PYTHON)
        # The package manager: `dnf install ... python3.11` puts the interpreter where the description says.
        target = self.at(jobs_python["path"])
        _tool(on("/usr/bin/dnf"), f'echo "dnf $*" >>{self.at("/var/log/dnf.calls")}\n'
                                  f'for a; do [[ $a == python3.11 ]] && {{ mkdir -p {target.parent}; ln -sfn {REAL_PYTHON} {target}; exit 0; }}; done\n'
                                  'echo "stand-in dnf: no such package" >&2\nexit 1\n')
        # The S3 boundary: `aws s3 sync|cp s3://BUCKET/KEY DEST` copies from the bucket folder.
        _tool(on("/usr/bin/aws"), 'args=(); for a; do [[ $a == --* ]] || args+=("$a"); done\n'
                                  f'src="{self.bucket}/${{args[2]#s3://}}" dst="${{args[3]}}"\n'
                                  'if [[ ${args[1]} == sync ]]; then mkdir -p "$dst"; cp -r "$src"/. "$dst"/; else cp "$src" "$dst"; fi\n')

        devices = [(dev["class"], dev["vendor_device"]) for dev in nvidia["pci_devices"] for _ in range(dev["count"])]
        if pci_gpus is not None:  # a GPU gone from the bus
            gpus = [d for d in devices if d[0] in ("0300", "0302")][:pci_gpus]
            devices = gpus + [d for d in devices if d[0] not in ("0300", "0302")]
        lines = ["05:00.0 0200: 1d0f:ec20"]  # the ENA network card every instance has (vendor Amazon)
        lines += [f"{0x10 + i:02x}:00.0 {cls}: {vd} (rev a1)" for i, (cls, vd) in enumerate(devices)]
        if spec["lspci"]["present"]:
            listing = "\n".join(lines)
            _tool(on(spec["lspci"]["path"]),
                  'vendor=""\nwhile (($#)); do [[ $1 == -d ]] && { vendor="${2%%:*}"; shift; }; shift; done\n'
                  f'while read -r slot cls id rest; do\n  [[ -z $vendor || ${{id%%:*}} == "$vendor" ]] && echo "$slot $cls $id $rest"\n'
                  f"done <<'EOF'\n{listing}\nEOF\nexit 0\n")

        smi = nvidia["nvidia_smi"]
        works = smi["works"] if nvidia_smi_works is None else nvidia_smi_works
        count = nvidia["dev_nvidia"] if visible_gpus is None else visible_gpus
        if smi["present"]:
            failure = smi.get("failure", {"exit_status": 9, "output": "Unable to determine the device handle for GPU0000:10:00.0: Unknown Error"})
            body = (f'[[ "$*" == -L ]] || exit 2\nfor ((i = 0; i < {count}; i++)); do echo "GPU $i: {smi.get("gpu_name", "GPU")} (UUID: GPU-$i)"; done\n'
                    if works else f'echo "{failure["output"]}"\nexit {failure["exit_status"]}\n')
            _tool(on(smi["path"]), body)
        for i in range(nvidia["dev_nvidia"]):
            on(f"/dev/nvidia{i}").parent.mkdir(parents=True, exist_ok=True)
            on(f"/dev/nvidia{i}").touch()
        on("/dev").mkdir(exist_ok=True)
        _tool(on("/usr/bin/dmesg"), f"cat <<'EOF'\n{dmesg}\nEOF\n" if dmesg is not None  # the node's kernel log, not this machine's
              else 'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2\nexit 1\n')

        fi_info = efa["fi_info"]
        works = fi_info["works"] if fi_info_works is None else fi_info_works
        if fi_info["present"]:
            failure = fi_info.get("failure", {"exit_status": 1, "output": "fi_getinfo: -61 (No data available)"})
            _tool(on(fi_info["path"]), 'echo "provider: efa"\n' if works
                  else f'echo "{failure["output"]}" >&2\nexit {failure["exit_status"]}\n')
        (root / "sys" / "bus" / "pci" / "drivers" / "efa").mkdir(parents=True)
        (root / "sys" / "class" / "infiniband").mkdir(parents=True)
        for i in range(efa["devices"]):
            device = root / "sys" / "class" / "infiniband" / f"rdmap{0x20 + i}s0" / "device"
            device.mkdir(parents=True)
            (device / "driver").symlink_to("../../../../bus/pci/drivers/efa")

        if cfnconfig:
            facts = spec["cfnconfig"]
            queue = f"cfn_scheduler_queue_name={spec['queue']}\n" if "queue" in spec else ""
            on(AMI["cfnconfig"]["path"]).parent.mkdir(parents=True)
            on(AMI["cfnconfig"]["path"]).write_text(
                "stack_name=llm-prod\ncfn_preinstall_args=()\ncfn_region=ap-southeast-3\ncfn_scheduler=slurm\n"
                f"cfn_node_type={facts['cfn_node_type']}\ncfn_cluster_user={facts['cfn_cluster_user']}\n{queue}")
        user, uid = AMI["cluster_user"], _free_id()
        on("/etc").mkdir(exist_ok=True)
        # The host's users but its own ec2-user (the local cluster creates one on the host too), and model1's
        # user as a first boot leaves it (directory_setup.sh's useradd cannot replace a file bound in place).
        own = {user: uid, "model1": model_uid("model1")}
        for name in ("passwd", "group"):
            host = [entry for entry in Path(f"/etc/{name}").read_text().splitlines() if entry.split(":")[0] not in own]
            lines = [f"{u}:x:{i}:{i}::/home/{u}:/bin/bash" if name == "passwd" else f"{u}:x:{i}:" for u, i in own.items()]
            on(f"/etc/{name}").write_text("\n".join([*host, *lines]) + "\n")
        on("/var/log").mkdir(parents=True, exist_ok=True)
        return root

    def env(self, spec_kind: str, **extra: str) -> dict[str, str]:
        spec = AMI["nodes"][spec_kind]
        return {
            **os.environ,
            "PATH": f"{self.at('/usr/bin')}:{self.at('/usr/sbin')}:{os.environ['PATH']}",
            "CFNCONFIG": str(self.at(AMI["cfnconfig"]["path"])),
            "JOBS_PYTHON": str(self.at(spec["python"]["jobs_interpreter"]["path"])),
            "NODE_HEALTH_ENV": str(self.at("/etc/llm/node-health.env")),
            "SYSFS_ROOT": str(self.at("/sys")),
            "DEV_ROOT": str(self.at("/dev")),
            "EFA_BIN": str(self.at(os.path.dirname(spec["efa"]["fi_info"]["path"]))),
            "LOG_DIR": str(self.at("/var/log/parallelcluster")),
            "JOBS_HOME": str(self.jobs_home),
            "SLURM_ETC": str(self.shared / "opt" / "slurm" / "etc"),
            "SLURM_BIN": str(self.shared / "opt" / "slurm" / "bin"),
            "FSX_FSTYPE": "tmpfs",
            "FSX_MOUNTS": f"{self.fsx / 'checkpoints'} {self.fsx / 'logs'}",
            # The model credential helper, its list and sudo rule (directory_setup.sh): the node's, not this machine's.
            "MODEL_CREDENTIALS_HELPER": str(self.at("/usr/local/sbin/llm-model-credentials")),
            "MODEL_ROLES": str(self.at("/etc/llm/model-roles")), "SUDOERS_DIR": str(self.at("/etc/sudoers.d")),
            **extra,
        }

    def run(self, root: Path, kind: str, *command: str, **extra: str) -> subprocess.CompletedProcess:
        """Run command on the node whose folder is root: its own mount namespace, its disk at self.mount,
        its own ec2-user, tmpfs as its FSx mounts."""
        setup = [f"mount --bind {root} {self.mount}",
                 f"mount --bind {root}/etc/passwd /etc/passwd", f"mount --bind {root}/etc/group /etc/group",
                 f"mkdir -p {root}/home && mount --bind {root}/home /home",  # the model users' homes: the node's
                 *(f"mount -t tmpfs tmpfs {self.fsx / name}" for name in ("data", "checkpoints", "logs"))]
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c",
                               " && ".join(setup) + ' && exec "$@"', "node", *command],
                              capture_output=True, text=True, env=self.env(kind, **extra), timeout=120)

    def bootstrap(self, root: Path, kind: str, *args: str, **extra: str) -> subprocess.CompletedProcess:
        """directory_setup.sh as the config runs it (OnNodeConfigured), with the queue's --gpus."""
        spec = AMI["nodes"][kind]
        gpus = ["--gpus", str(spec["gpus_per_instance"])] if "gpus_per_instance" in spec else []
        fsx = ["--data", str(self.fsx / "data"), "--checkpoints", str(self.fsx / "checkpoints"), "--logs", str(self.fsx / "logs")]
        return self.run(root, kind, "bash", str(SCRIPTS / "directory_setup.sh"), *fsx, *gpus, *args, "model1", **extra)

    def health(self, root: Path, kind: str, **extra: str) -> subprocess.CompletedProcess:
        return self.run(root, kind, "bash", str(SCRIPTS / "node_health.sh"), **extra)

    def log(self, root: Path) -> str:
        return (root / "var" / "log" / "parallelcluster" / "llm-directory-setup.log").read_text()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A cluster whose head node has bootstrapped on the AMI: the bundle, the venv, the health hooks."""
    tmp = tmp_path_factory.mktemp("cluster")
    c = Cluster(tmp, tmp / "node", tmp / "shared", tmp / "fsx", tmp / "s3", tmp / "site-packages")
    for folder in (c.mount, c.jobs_home, c.site_packages, *(c.fsx / n for n in ("data", "checkpoints", "logs"))):
        folder.mkdir(parents=True)
    (c.site_packages / f"{STAND_IN_MODULE}.py").write_text("OK = True\n")
    (c.bucket / "assets" / "jobs").mkdir(parents=True)
    (c.bucket / "assets" / "jobs" / "env.sh").write_text("# env\n")
    (c.bucket / "assets" / "jobs" / "requirements-jobs.txt").write_text("torch==2.13.0\n")  # never fetched here
    shutil.copytree(SCRIPTS, c.bucket / "assets" / "node_scripts")
    head = c.build("head", "head_node")
    c.head_result = c.bootstrap(head, "head_node", "--jobs-uri", "s3://assets/jobs/",
                                JOBS_VENV_SITE_PACKAGES=str(c.site_packages))
    c.head = head
    return c


# D: the description itself -----------------------------------------------------------------------

def test_the_image_description_states_what_the_scripts_rely_on():
    assert (AMI["image"]["parallelcluster_version"], AMI["image"]["os"]) == ("3.16", "alinux2023")
    text = AMI_FILE.read_text()
    for source in ("custom-bootstrap-actions-v3", "gpu_health_check.sh", "nvidia_install.rb", "efa_alinux2023.rb",
                   "config_head_node.rb", "cfnconfig.erb", "al2023/ug/python"):
        assert source in text, source
    assert AMI["cfnconfig"]["path"] == "/etc/parallelcluster/cfnconfig" and AMI["cfnconfig"]["may_be_removed"]
    assert AMI["slurm"]["install_dir"] == "/opt/slurm"
    assert {"/opt/slurm", "/home", "/opt/parallelcluster/shared", "/opt/llm-jobs"} <= {s["path"] for s in AMI["head_node_shares"]}
    nodes = AMI["nodes"]
    assert set(nodes) == {"head_node", "gpu_compute", "cpu_compute"}
    assert {n["cfnconfig"]["cfn_node_type"] for n in nodes.values()} == {"HeadNode", "ComputeFleet"}
    for name, node in nodes.items():
        assert node["python"]["system"] == {"path": "/usr/bin/python3", "version": "3.9"}, name
        assert node["python"]["jobs_interpreter"] == {"path": "/usr/bin/python3.11", "present": False}, name
        # The one image carries the NVIDIA and EFA software on every instance type.
        assert node["nvidia"]["driver_installed"] and node["nvidia"]["nvidia_smi"]["present"], name
        assert node["efa"]["software_installed"] and node["efa"]["fi_info"]["present"], name
    gpu, cpu = nodes["gpu_compute"], nodes["cpu_compute"]
    assert (gpu["instance_type"], gpu["gpus_per_instance"], gpu["nvidia"]["dev_nvidia"], gpu["efa"]["devices"]) == ("p5e.48xlarge", 8, 8, 32)
    assert sum(d["count"] for d in gpu["nvidia"]["pci_devices"] if d["class"] in ("0300", "0302")) == 8
    for node in (cpu, nodes["head_node"]):
        assert not node["nvidia"]["nvidia_smi"]["works"] and not node["efa"]["fi_info"]["works"]
        assert (node["nvidia"]["pci_devices"], node["nvidia"]["dev_nvidia"], node["efa"]["devices"]) == ([], 0, 0)
    assert (cpu["instance_type"], cpu["gpus_per_instance"]) == ("c7i.8xlarge", 0)


@needs_mount_namespace
def test_a_stand_in_cpu_node_behaves_as_described(cluster):
    root = cluster.build("cpu-probe", "cpu_compute")
    probe = ("python3 --version; test -e $JOBS_PYTHON || echo 'no python3.11'; nvidia-smi -L; echo nvidia-smi=$?; "
             "fi_info -p efa; echo fi_info=$?; lspci -n -d 10de:; echo lspci=$?")
    proc = cluster.run(root, "cpu_compute", "bash", "-c", f'PATH="$EFA_BIN:$PATH"; {probe}')
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "Python 3.9" in out and "no python3.11" in out
    assert "nvidia-smi=9" in out and "couldn't communicate with the NVIDIA driver" in out
    assert "fi_info=1" in out and "lspci=0" in out and "10de:" not in out


# B: the node health check decides by hardware and settings ----------------------------------------

@needs_mount_namespace
def test_cpu_node_is_healthy_though_nvidia_smi_and_fi_info_fail(cluster):
    root = cluster.build("cpu-1", "cpu_compute")
    setup = cluster.bootstrap(root, "cpu_compute")
    assert setup.returncode == 0, setup.stderr
    proc = cluster.health(root, "cpu_compute")
    assert (proc.returncode, proc.stdout.strip()) == (0, "healthy"), proc.stdout
    assert (root / "etc" / "llm" / "node-health.env").read_text().splitlines()[-1] == "EXPECTED_GPUS=0"


@needs_mount_namespace
def test_gpu_node_with_its_8_gpus_and_efa_is_healthy(cluster):
    root = cluster.build("gpu-1", "gpu_compute")
    setup = cluster.bootstrap(root, "gpu_compute", "--local-cache", str(cluster.tmp / "no-cache"))
    assert setup.returncode == 0, setup.stderr
    proc = cluster.health(root, "gpu_compute")
    assert (proc.returncode, proc.stdout.splitlines()) == (0, [NO_SMI_Q, "healthy"]), proc.stdout
    assert "node health check expects 8 GPU(s) here" in setup.stderr


@pytest.mark.parametrize("broken, reason", [
    ({"visible_gpus": 7}, "nvidia-smi sees 7 of 8 GPUs"),
    ({"pci_gpus": 7}, "the PCI bus shows 7 of 8 GPUs"),
    ({"nvidia_smi_works": False}, "nvidia-smi failed: Unable to determine the device handle"),
    ({"fi_info_works": False}, "fi_info lists no efa provider on a node with 32 EFA devices"),
    ({"dmesg": "[  812.1] NVRM: Xid (PCI:0000:97:00): 79, pid=1234, GPU has fallen off the bus."},
     "fatal NVIDIA Xid 79 in the kernel log: ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, NVIDIA's action RESTART_BM"),
    # an application's Xid first, then the uncontained ECC error that needs a reset
    ({"dmesg": "[  90.2] NVRM: Xid (PCI:0000:97:00): 13, pid=77, Graphics Exception\n"
               "[  95.0] NVRM: Xid (PCI:0000:97:00): 95, pid=77, Uncontained: FBHUB. RST: Yes"},
     "fatal NVIDIA Xid 95 in the kernel log: ROBUST_CHANNEL_UNCONTAINED_ERROR, NVIDIA's action RESET_GPU"),
    ({"dmesg": "[ 300.0] NVRM: Xid (PCI:0000:97:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"},
     "fatal NVIDIA Xid 154 in the kernel log: GPU_RECOVERY_ACTION_CHANGED to 0x2 (Node Reboot Required)"),
    # fails closed: an unreadable kernel log passed as healthy, Xid 79 in it or not
    ({"dmesg": None}, "the kernel log cannot be read (dmesg: read kernel buffer failed: Operation not permitted)"),
])
@needs_mount_namespace
def test_gpu_node_fails_its_check_with_the_reason(cluster, broken, reason):
    root = cluster.build(f"gpu-broken-{next(iter(broken))}-{abs(hash(reason)) % 10**6}", "gpu_compute", **broken)
    assert cluster.bootstrap(root, "gpu_compute").returncode == 0
    proc = cluster.health(root, "gpu_compute")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1].startswith(reason), proc.stdout


@pytest.mark.parametrize("dmesg, says", [
    # NVIDIA's catalog: contained ECC error, restart the application (the node was drained for it before)
    ("[  5.1] NVRM: Xid (PCI:0000:97:00): 94, pid=1234, Contained: SM (0x1). RST: No, D-RST: No\n" * 3,
     ["NVIDIA Xid 94 (ROBUST_CHANNEL_CONTAINED_ERROR): NVIDIA's action RESTART_APP: the job restarts, the node stays"]),
    ("[  7.0] NVRM: Xid (PCI:0000:97:00): 63, pid=0, Row Remapper: New row marked for remapping",
     ["NVIDIA Xid 63 (INFOROM_DRAM_RETIREMENT_EVENT): NVIDIA's action IGNORE: the node stays"]),
    ("[  9.0] NVRM: Xid (PCI:0000:97:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
     ["NVIDIA Xid 154 (GPU_RECOVERY_ACTION_CHANGED) to 0x0 (None): the node stays"]),
    ("[  9.5] NVRM: Xid (PCI:0000:97:00): 999, pid=1, a future Xid",
     [f"NVIDIA Xid 999 is not in {SCRIPTS / 'xid_catalog.tsv'}: reported, not acted on (see NVIDIA's Xid catalog)"]),
], ids=["94-restart-app", "63-ignore", "154-none", "unknown"])
@needs_mount_namespace
def test_xids_whose_action_is_not_a_reset_leave_the_node_in_service(cluster, dmesg, says):
    root = cluster.build(f"gpu-xid-{abs(hash(dmesg)) % 10**6}", "gpu_compute", dmesg=dmesg.rstrip("\n"))
    assert cluster.bootstrap(root, "gpu_compute").returncode == 0
    proc = cluster.health(root, "gpu_compute")
    assert (proc.returncode, proc.stdout.splitlines()) == (0, [*says, NO_SMI_Q, "healthy"]), proc.stdout


@needs_mount_namespace
def test_a_node_without_gpus_in_the_gpu_queue_fails_its_check(cluster):
    # A CPU instance behind the GPU queue's settings (--gpus 8): no NVIDIA device on the PCI bus.
    root = cluster.build("gpu-queue-c7i", "cpu_compute")
    assert cluster.bootstrap(root, "cpu_compute", "--gpus", "8").returncode == 0
    proc = cluster.health(root, "cpu_compute")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == "the queue expects 8 GPUs but the PCI bus shows no NVIDIA GPU (wrong instance type?)"


@pytest.mark.parametrize("kind", ["cpu_compute", "gpu_compute"])
@needs_mount_namespace
def test_without_the_settings_file_the_check_expects_the_gpus_on_the_pci_bus(cluster, kind):
    # A node bootstrapped before --gpus existed: the check still tells a CPU node from a GPU node.
    root = cluster.build(f"{kind}-no-settings", kind)
    proc = cluster.health(root, kind)
    assert (proc.returncode, proc.stdout.splitlines()[-1]) == (0, "healthy"), proc.stdout


# A, E: the jobs' interpreter on every node; the head node's step times ------------------------------

@needs_mount_namespace
def test_head_node_installs_the_interpreter_builds_the_venv_and_logs_each_steps_seconds(cluster):
    assert cluster.head_result.returncode == 0, cluster.head_result.stderr
    assert (cluster.head / "var" / "log" / "dnf.calls").read_text() == "dnf install -y -q python3.11\n"
    venv = cluster.jobs_home / "venv"
    assert os.readlink(venv / "bin" / "python3.11") == str(cluster.at("/usr/bin/python3.11"))
    log = cluster.log(cluster.head)
    assert f"packages from {cluster.site_packages} (JOBS_VENV_SITE_PACKAGES: a stand-in for PyPI" in log
    for step in ("jobs interpreter", "FSx mounts", "directory tree", "jobs bundle", "jobs venv", "health hooks", "jobs venv check"):
        assert f"step '{step}' took " in log, step
    assert "done in " in log
    hooks = cluster.shared / "opt" / "slurm" / "etc" / "scripts"
    assert (hooks / "prolog.d" / "80_llm_node_health").is_file()
    assert (cluster.jobs_home / "tools").stat().st_uid == _free_id()  # the node's ec2-user (cfn_cluster_user)


@pytest.mark.parametrize("kind", ["gpu_compute", "cpu_compute"])
@needs_mount_namespace
def test_compute_node_installs_the_interpreter_and_its_venv_starts(cluster, kind):
    root = cluster.build(f"{kind}-python", kind)
    assert not (root / "usr" / "bin" / "python3.11").exists()
    proc = cluster.bootstrap(root, kind)
    assert proc.returncode == 0, proc.stderr
    # What a job does first on that node: the shared venv's python, with the jobs' packages.
    job = cluster.run(root, kind, str(cluster.jobs_home / "venv" / "bin" / "python"), "-c", f"import {STAND_IN_MODULE}")
    assert job.returncode == 0, job.stderr
    assert (root / "var" / "log" / "dnf.calls").read_text() == "dnf install -y -q python3.11\n"
    assert f"jobs venv {cluster.jobs_home / 'venv'} starts on this node" in cluster.log(root)


@needs_mount_namespace
def test_compute_node_whose_venv_interpreter_cannot_start_fails_its_bootstrap(cluster):
    # The head node's venv links to python3.11; this node was given another interpreter.
    root = cluster.build("gpu-other-python", "gpu_compute")
    other = cluster.at("/usr/bin/python3.12")
    proc = cluster.bootstrap(root, "gpu_compute", JOBS_PYTHON=str(other),
                             JOBS_PYTHON_INSTALL=f"ln -s {REAL_PYTHON} {other}")
    assert proc.returncode == 1
    wanted = cluster.at("/usr/bin/python3.11")
    assert f"the jobs venv's interpreter {wanted} ({cluster.jobs_home / 'venv'}/bin/python) does not start on this node" in proc.stderr
    assert "Every node needs it" in proc.stderr


@needs_mount_namespace
def test_compute_node_fails_clearly_when_the_interpreter_cannot_be_installed(cluster):
    root = cluster.build("cpu-no-repo", "cpu_compute")
    proc = cluster.bootstrap(root, "cpu_compute", JOBS_PYTHON_INSTALL="echo 'Error: Failed to download metadata' >&2; exit 1")
    assert proc.returncode == 1
    assert f"could not install the jobs interpreter {cluster.at('/usr/bin/python3.11')}" in proc.stderr
    assert "Failed to download metadata" in cluster.log(root)


# C: no cfnconfig, no silent skip --------------------------------------------------------------------

@needs_mount_namespace
def test_a_node_without_cfnconfig_fails_naming_the_file(cluster):
    root = cluster.build("head-no-cfnconfig", "head_node", cfnconfig=False)
    proc = cluster.bootstrap(root, "head_node", "--jobs-uri", "s3://assets/jobs/")
    assert proc.returncode == 1
    path = cluster.at(AMI["cfnconfig"]["path"])
    assert f"{path} is missing, so this node cannot tell whether it is the head node" in proc.stderr
    assert "set CFNCONFIG to a file with cfn_node_type=HeadNode|ComputeFleet" in proc.stderr
