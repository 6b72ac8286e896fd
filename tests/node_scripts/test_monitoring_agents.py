"""node_scripts/monitoring_agents.sh on stand-in nodes: the head node fetches the pinned releases (served by
a stand-in curl from tarballs built here out of Debian's prometheus, promtool and node exporter, with
their sha256sums.txt) and NVIDIA's DCGM exporter (stand-in enroot and unsquashfs), every node installs
from the shared volume, a stand-in systemctl records what is enabled and (re)started. Files land under
NODE_ROOT; the rendered agent config is checked with the real promtool. Then directory_setup.sh calls it as
ParallelCluster's custom action does."""

from __future__ import annotations

import hashlib
import io
import os
import pwd
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from cluster_config.monitoring import DCGM_FIELDS, keep_regex, monitoring_file
from cluster_config.settings import load_settings
from tests.marks import needs_mount_namespace, needs_root
from tests.node_scripts.test_node_scripts import node, run_directory_setup  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
AGENTS = REPO / "node_scripts" / "monitoring_agents.sh"
SOURCE = AGENTS.read_text()
NODE_EXPORTER = re.search(r"^NODE_EXPORTER_VERSION=(\S+)", SOURCE, re.M).group(1)
PROMETHEUS = re.search(r"^PROMETHEUS_VERSION=(\S+)", SOURCE, re.M).group(1)
DCGM_IMAGE = re.search(r'^DCGM_EXPORTER_IMAGE="(\S+)"', SOURCE, re.M).group(1)
DCGM_TAG = DCGM_IMAGE.rsplit(":", 1)[1]
RELEASES_URL = "https://releases.example"
REMOTE_WRITE = "https://aps-workspaces.ap-southeast-3.amazonaws.com/workspaces/ws-0123abcd-4567-89ef/api/v1/remote_write"
# The binaries the releases carry, at the names the releases use (Debian's builds, older than the pins).
RELEASES = {
    ("prometheus/node_exporter", "node_exporter", NODE_EXPORTER): {"node_exporter": "/usr/bin/prometheus-node-exporter"},
    ("prometheus/prometheus", "prometheus", PROMETHEUS): {"prometheus": "/usr/bin/prometheus", "promtool": "/usr/bin/promtool"},
}

needs_prometheus = pytest.mark.skipif(
    not all(Path(b).exists() for files in RELEASES.values() for b in files.values()),
    reason="needs Debian's prometheus and prometheus-node-exporter (make deps)",
)


def _tool(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\nset -euo pipefail\n" + body)
    path.chmod(0o755)


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> Path:
    """<dir>/<project>/releases/download/v<version>/{<tarball>, sha256sums.txt}, as GitHub serves them."""
    root = tmp_path_factory.mktemp("releases")
    for (project, name, version), binaries in RELEASES.items():
        folder = root / project / "releases" / "download" / f"v{version}"
        folder.mkdir(parents=True)
        tarball = f"{name}-{version}.linux-amd64.tar.gz"
        with tarfile.open(folder / tarball, "w:gz", compresslevel=1) as tar:
            for member, binary in binaries.items():
                tar.add(binary, arcname=f"{name}-{version}.linux-amd64/{member}")
        digest = hashlib.sha256((folder / tarball).read_bytes()).hexdigest()
        (folder / "sha256sums.txt").write_text(f"{'0' * 64}  {name}-{version}.darwin-amd64.tar.gz\n{digest}  {tarball}\n")
    return root


class Node:
    """A node's disk (NODE_ROOT), the shared volume, and the stand-ins at its boundaries."""

    def __init__(self, tmp: Path, releases: Path, shared: Path, settings_text: str) -> None:
        self.root, self.bin, self.shared, self.releases = tmp / "root", tmp / "bin", shared, releases
        self.root.mkdir(parents=True)
        self.bin.mkdir()
        self.calls = tmp / "calls"
        self.settings = tmp / "monitoring.env"
        self.settings.write_text(settings_text)
        # curl -fsSL --retry 3 -o OUT URL: from the releases folder; 22 (HTTP error) when absent.
        _tool(self.bin / "curl", f'out="" url=""\nwhile (($#)); do case $1 in -o) out=$2; shift ;; -*) ;; *) url=$1 ;; esac; shift; done\n'
                                 f'echo "curl $url" >>{self.calls}\nsrc="{releases}/${{url#{RELEASES_URL}/}}"\n'
                                 '[[ -f $src ]] || exit 22\ncp "$src" "$out"\n')
        _tool(self.bin / "systemctl", f'echo "systemctl $*" >>{self.calls}\n')
        # enroot import --output FILE docker://IMAGE: an "image" (a tar) holding usr/bin/dcgm-exporter.
        _tool(self.bin / "enroot", f'echo "enroot $* cache=${{ENROOT_CACHE_PATH:-unset}}" >>{self.calls}\n'
                                   '[[ $1 == import && $2 == --output ]]\nimage=$(mktemp -d)\nmkdir -p "$image/usr/bin"\n'
                                   "printf '#!/bin/sh\\necho dcgm-exporter %s\\n' \"$4\" >\"$image/usr/bin/dcgm-exporter\"\n"
                                   'tar -cf "$3" -C "$image" usr\nrm -rf "$image"\n')
        _tool(self.bin / "unsquashfs", '[[ $1 == -no-progress && $2 == -dest ]]\nmkdir -p "$3"\ntar -xf "$4" -C "$3" "$5"\n')

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        environ = {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}", "NODE_ROOT": str(self.root),
                   "JOBS_HOME": str(self.shared), "RELEASES_URL": RELEASES_URL, "LOG_DIR": str(self.root / "log"), **env}
        return subprocess.run(["bash", str(AGENTS), "--settings", str(self.settings), *args],
                              capture_output=True, text=True, env=environ, timeout=120)

    def head(self) -> subprocess.CompletedProcess:
        fsx = ["--data", "/fsx/data", "--checkpoints", "/fsx/checkpoints", "--logs", "/fsx/logs"]
        return self.run("--node-type", "HeadNode", "--user", "nobody", *fsx)

    def at(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def take_calls(self) -> list[str]:
        calls = self.calls.read_text().splitlines() if self.calls.exists() else []
        self.calls.unlink(missing_ok=True)
        return calls


def prod_settings(remote_write: str = REMOTE_WRITE) -> str:
    return monitoring_file(load_settings("prod"), remote_write_url=remote_write, region="ap-southeast-3")


@pytest.fixture(scope="module")
def cluster(releases, tmp_path_factory):
    """A head node that has installed its agents, and the shared volume it filled."""
    tmp = tmp_path_factory.mktemp("cluster")
    head = Node(tmp / "head", releases, tmp / "shared", prod_settings())
    head.result = head.head()
    head.first_calls = head.take_calls()
    return head


def compute(cluster, tmp_path) -> Node:
    return Node(tmp_path, cluster.releases, cluster.shared, prod_settings())


# The head node -------------------------------------------------------------------------------------

@needs_prometheus
def test_head_node_fetches_the_pinned_releases_verified_and_installs_its_agents(cluster):
    assert cluster.result.returncode == 0, cluster.result.stderr
    curls = [c.removeprefix("curl ") for c in cluster.first_calls if c.startswith("curl ")]
    base = f"{RELEASES_URL}/prometheus"
    assert curls == [
        f"{base}/node_exporter/releases/download/v{NODE_EXPORTER}/sha256sums.txt",
        f"{base}/node_exporter/releases/download/v{NODE_EXPORTER}/node_exporter-{NODE_EXPORTER}.linux-amd64.tar.gz",
        f"{base}/prometheus/releases/download/v{PROMETHEUS}/sha256sums.txt",
        f"{base}/prometheus/releases/download/v{PROMETHEUS}/prometheus-{PROMETHEUS}.linux-amd64.tar.gz",
    ]
    tools = cluster.shared / "agents"
    assert (tools / f"node_exporter-{NODE_EXPORTER}" / "sha256sums.txt").is_file()
    for binary in (f"node_exporter-{NODE_EXPORTER}/node_exporter", f"prometheus-{PROMETHEUS}/prometheus",
                   f"prometheus-{PROMETHEUS}/promtool"):
        assert os.access(cluster.at(f"/opt/{binary}"), os.X_OK), binary
    # The DCGM exporter's binary, out of NVIDIA's image, for the GPU nodes; enroot with folders of its own.
    enroot = [c for c in cluster.first_calls if c.startswith("enroot ")]
    assert len(enroot) == 1 and f"docker://{DCGM_IMAGE}" in enroot[0] and "cache=unset" not in enroot[0]
    assert os.access(tools / f"dcgm-exporter-{DCGM_TAG}" / "dcgm-exporter", os.X_OK)
    systemctl = [c for c in cluster.first_calls if c.startswith("systemctl ")]
    assert systemctl[0] == "systemctl daemon-reload"
    for unit in ("node_exporter", "prometheus_agent", "llm_exporter"):
        assert f"systemctl enable {unit}.service --quiet" in systemctl
        assert f"systemctl restart {unit}.service" in systemctl
    assert not any("dcgm" in c or "nvidia" in c for c in systemctl)  # no GPU here


@needs_prometheus
def test_head_node_exporters_serve_the_textfile_locally_and_the_exporter_runs_in_the_jobs_venv(cluster):
    unit = cluster.at("/etc/systemd/system/node_exporter.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start == (f"ExecStart=/opt/node_exporter-{NODE_EXPORTER}/node_exporter --web.listen-address=127.0.0.1:9100 "
                          "--collector.disable-defaults --collector.infiniband --collector.textfile "
                          "--collector.textfile.directory=/var/lib/node_exporter/textfile")
    assert cluster.at("/var/lib/node_exporter/textfile").owner() == "nobody"  # where the exporter writes llm.prom
    exporter = cluster.at("/etc/systemd/system/llm_exporter.service").read_text()
    jobs = cluster.shared / "bundle" / "jobs"
    assert "User=nobody" in exporter
    assert "Environment=FSX_DATA=/fsx/data FSX_CHECKPOINTS=/fsx/checkpoints FSX_LOGS=/fsx/logs" in exporter
    assert f"Environment=JOBS_DIR={jobs} PYTHONPATH={jobs} PATH=/opt/slurm/bin:" in exporter
    assert (f"ExecStart={cluster.shared}/venv/bin/python -m monitoring.exporter "
            "--textfile-dir /var/lib/node_exporter/textfile --interval 15") in exporter
    agent = cluster.at("/etc/systemd/system/prometheus_agent.service").read_text()
    assert f"ExecStart=/opt/prometheus-{PROMETHEUS}/prometheus --agent --config.file=/etc/prometheus-agent/agent.yml" in agent
    assert "User=" not in agent  # root: the only user that reaches the instance credentials (Imds Secured)


@needs_prometheus
def test_the_agent_config_passes_promtool_and_sends_only_the_kept_metrics_to_the_workspace(cluster):
    config_path = cluster.at("/etc/prometheus-agent/agent.yml")
    check = subprocess.run(["promtool", "check", "config", "--agent", str(config_path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    config = yaml.safe_load(config_path.read_text())
    assert config["global"]["scrape_interval"] == "30s"
    assert config["global"]["external_labels"] == {"cluster": "llm-prod"}
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert list(jobs) == ["head_node", "node", "dcgm"]
    assert jobs["head_node"]["static_configs"][0]["targets"] == ["127.0.0.1:9100"]
    for name, port in (("node", 9100), ("dcgm", 9400)):
        (sd,) = jobs[name]["ec2_sd_configs"]
        assert (sd["region"], sd["port"]) == ("ap-southeast-3", port)
        filters = {f["name"]: f["values"] for f in sd["filters"]}
        assert filters["tag:parallelcluster:cluster-name"] == ["llm-prod"]
        assert filters["tag:parallelcluster:node-type"] == ["Compute"]
        assert filters["instance-state-name"] == ["running"]
    dcgm_filters = {f["name"]: f["values"] for f in jobs["dcgm"]["ec2_sd_configs"][0]["filters"]}
    assert dcgm_filters["tag:parallelcluster:queue-name"] == ["gpu"]  # the GPU queue's nodes only
    (write,) = config["remote_write"]
    assert write["url"] == REMOTE_WRITE and write["sigv4"] == {"region": "ap-southeast-3"}
    assert write["write_relabel_configs"] == [{"source_labels": ["__name__"], "regex": keep_regex(), "action": "keep"}]


@needs_prometheus
def test_a_rerun_fetches_nothing_and_restarts_nothing(cluster):
    again = cluster.head()
    assert again.returncode == 0, again.stderr
    calls = cluster.take_calls()
    assert not [c for c in calls if c.startswith(("curl", "enroot"))]
    assert not [c for c in calls if "restart" in c]
    assert "systemctl start prometheus_agent.service" in calls


@needs_prometheus
def test_a_changed_workspace_restarts_the_agent_only(cluster, tmp_path):
    moved = Node(tmp_path, cluster.releases, cluster.shared, prod_settings(REMOTE_WRITE.replace("ws-0123abcd", "ws-9999abcd")))
    shutil.copytree(cluster.root, moved.root, dirs_exist_ok=True, symlinks=True)
    assert moved.head().returncode == 0
    restarts = [c for c in moved.take_calls() if "restart" in c]
    assert restarts == ["systemctl restart prometheus_agent.service"]


@needs_prometheus
def test_a_tarball_that_does_not_match_its_sums_is_refused(releases, tmp_path):
    bad = tmp_path / "releases"
    shutil.copytree(releases, bad)
    tarball = next((bad / "prometheus" / "node_exporter").rglob("*.tar.gz"))
    tarball.write_bytes(tarball.read_bytes() + b"tampered")
    node = Node(tmp_path, bad, tmp_path / "shared", prod_settings())
    proc = node.head()
    assert proc.returncode == 1
    assert f"node_exporter-{NODE_EXPORTER}.linux-amd64.tar.gz does not match the SHA-256 in" in proc.stderr
    assert not (tmp_path / "shared" / "agents" / f"node_exporter-{NODE_EXPORTER}").exists()
    assert not node.at("/etc/systemd/system").exists()


# Compute nodes ------------------------------------------------------------------------------------

@needs_prometheus
def test_a_gpu_node_installs_from_the_shared_volume_and_runs_the_dcgm_exporter_against_the_host_engine(cluster, tmp_path):
    node = compute(cluster, tmp_path)
    proc = node.run("--node-type", "ComputeFleet", "--gpus", "8")
    assert proc.returncode == 0, proc.stderr
    calls = node.take_calls()
    assert not [c for c in calls if c.startswith(("curl", "enroot"))]  # nothing downloaded at a compute node's boot
    assert "systemctl enable --now nvidia-dcgm.service --quiet" in calls
    for unit in ("node_exporter", "dcgm_exporter"):
        assert f"systemctl restart {unit}.service" in calls
    assert not node.at("/etc/systemd/system/prometheus_agent.service").exists()
    exporter = node.at("/etc/systemd/system/node_exporter.service").read_text()
    assert "--web.listen-address=0.0.0.0:9100 --collector.disable-defaults --collector.infiniband\n" in exporter
    dcgm = node.at("/etc/systemd/system/dcgm_exporter.service").read_text()
    assert (f"ExecStart=/opt/dcgm-exporter-{DCGM_TAG}/dcgm-exporter --collectors /etc/dcgm-exporter/llm-counters.csv "
            "--address :9400 --remote-hostengine-info localhost:5555") in dcgm
    assert "Requires=nvidia-dcgm.service" in dcgm
    counters = node.at("/etc/dcgm-exporter/llm-counters.csv").read_text().splitlines()[1:]
    assert counters == [f"{field}, {kind}, {field}." for field, kind in DCGM_FIELDS]
    assert os.access(node.at(f"/opt/dcgm-exporter-{DCGM_TAG}/dcgm-exporter"), os.X_OK)


@needs_prometheus
@needs_root  # chown
def test_a_compute_node_runs_nothing_a_job_could_have_replaced(cluster, tmp_path):
    shared = tmp_path / "shared"
    shutil.copytree(cluster.shared, shared, symlinks=True)
    binary = shared / "agents" / f"dcgm-exporter-{DCGM_TAG}" / "dcgm-exporter"
    os.chown(binary, pwd.getpwnam("nobody").pw_uid, -1)  # the cluster user's, as under its tools/ folder
    node = Node(tmp_path / "node", cluster.releases, shared, prod_settings())
    proc = node.run("--node-type", "ComputeFleet", "--gpus", "8")
    assert proc.returncode != 0 and f"{binary} is not root's alone" in proc.stderr
    assert not node.at(f"/opt/dcgm-exporter-{DCGM_TAG}/dcgm-exporter").exists()
    assert not node.at(f"/opt/node_exporter-{NODE_EXPORTER}").exists()  # refused before anything is installed


@needs_prometheus
def test_a_cpu_node_runs_the_node_exporter_only(cluster, tmp_path):
    node = compute(cluster, tmp_path)
    assert node.run("--node-type", "ComputeFleet", "--gpus", "0").returncode == 0
    assert sorted(p.name for p in node.at("/etc/systemd/system").iterdir()) == ["node_exporter.service"]
    assert not [c for c in node.take_calls() if "nvidia" in c]


def test_a_compute_node_before_the_head_node_fetched_fails_naming_where_to_look(tmp_path):
    node = Node(tmp_path, tmp_path / "no-releases", tmp_path / "empty-shared", prod_settings())
    proc = node.run("--node-type", "ComputeFleet", "--gpus", "8")
    assert proc.returncode == 1
    assert f"has no verified node_exporter-{NODE_EXPORTER}.linux-amd64.tar.gz; the head node fetches it" in proc.stderr


@pytest.mark.parametrize("line, message", [
    ("REMOTE_WRITE_URL=https://example.com/push", "REMOTE_WRITE_URL 'https://example.com/push' is not a workspace's remote-write URL"),
    ("KEEP_METRICS=up'\n", "KEEP_METRICS 'up'' is not a metric-name regex"),
    ("EXTRA=1", "unknown key 'EXTRA'"),
])
def test_a_settings_file_the_script_does_not_understand_is_refused(tmp_path, line, message):
    key = line.split("=", 1)[0]
    text = "".join(f"{ln}\n" for ln in prod_settings().splitlines() if not ln.startswith(f"{key}=")) + line + "\n"
    node = Node(tmp_path, tmp_path, tmp_path / "shared", text)
    proc = node.run("--node-type", "ComputeFleet")
    assert proc.returncode == 1
    assert message in proc.stderr


def test_the_script_is_shellcheck_clean_and_strict():
    proc = subprocess.run([str(Path(sys.executable).parent / "shellcheck"), "-S", "warning", str(AGENTS)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    assert "set -euo pipefail" in SOURCE


# Called by directory_setup.sh (OnNodeConfigured) ----------------------------------------------------

def _bucket(node: Path, settings_text: str | None) -> None:
    """The assets bucket as the cluster stack fills it: node_scripts/, the model list, the agents' settings."""
    aws = node / "bin" / "aws"  # `aws s3 cp [--only-show-errors] s3://BUCKET/KEY FILE` from node/s3
    aws.write_text(f'#!/bin/sh\nset -e\n[ "$1 $2" = "s3 cp" ] || exit 3\nshift 2\n[ "$1" = --only-show-errors ] && shift\n'
                   f'cp "{node}/s3/${{1#s3://}}" "$2"\n')
    aws.chmod(0o755)
    shutil.copytree(REPO / "node_scripts", node / "s3" / "assets" / "node_scripts")
    (node / "s3" / "assets" / "cluster").mkdir(parents=True)
    (node / "s3" / "assets" / "cluster" / "llm-prod.models").write_text("model1 4\n")
    if settings_text is not None:
        (node / "s3" / "assets" / "cluster" / "llm-prod.monitoring").write_text(settings_text)


def _setup(node: Path, *args: str, **env: str):
    return run_directory_setup(node, "--jobs-uri", "s3://assets/jobs/", "--models-uri", "s3://assets/cluster/llm-prod.models",
                               *args, extra_env=env)


@needs_prometheus
@needs_mount_namespace
def test_directory_setup_installs_a_gpu_nodes_agents_with_the_settings_beside_the_model_list(node, cluster):  # noqa: F811
    stand_ins = Node(node / "agents", cluster.releases, cluster.shared, "")
    for tool in stand_ins.bin.iterdir():
        shutil.copy(tool, node / "bin")
    _bucket(node, prod_settings())
    shutil.copytree(cluster.shared / "agents", node / "jobs_home" / "agents")  # what the head node fetched
    proc = _setup(node, "--gpus", "8", NODE_ROOT=str(stand_ins.root))
    assert proc.returncode == 0, proc.stderr
    assert "metric agents running" in proc.stderr
    assert "step 'monitoring agents' took" in (node / "log" / "llm-directory-setup.log").read_text()
    assert stand_ins.at("/etc/systemd/system/dcgm_exporter.service").is_file()  # --gpus reached the agents


@needs_mount_namespace
def test_directory_setup_keeps_a_compute_node_whose_agents_fail_and_says_so(node):  # noqa: F811
    _bucket(node, prod_settings())  # but the shared volume holds no release: the head node never fetched
    proc = _setup(node, "--gpus", "8", NODE_ROOT=str(node / "root"))
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: the metric agents failed to install" in proc.stderr


@needs_mount_namespace
def test_directory_setup_without_the_agents_settings_installs_none(node):  # noqa: F811
    # The local cluster's stand-in bucket has no settings file: it runs its own Prometheus.
    _bucket(node, None)
    proc = _setup(node, "--gpus", "8")
    assert proc.returncode == 0, proc.stderr
    assert ("no metric agents' settings at s3://assets/cluster/llm-prod.monitoring (the cluster stack ships them, "
            "the local cluster none): agents not installed") in proc.stderr


def test_the_settings_file_is_what_the_script_reads():
    text = prod_settings()
    keys = [line.split("=", 1)[0] for line in io.StringIO(text).read().splitlines() if not line.startswith("#")]
    for key in keys:
        assert f"\n      {key})" in SOURCE, key  # read_settings has a case for each


def test_what_the_script_relies_on_is_in_the_ami_description():
    ami = yaml.safe_load((REPO / "node_scripts" / "ami" / "parallelcluster-3.16-al2023.yaml").read_text())["monitoring"]
    assert ami["systemd"] and ami["enroot"]["path"] and ami["enroot"]["unsquashfs"]
    # The exporter's image is built against the AMI's DCGM major version (the tag's first part): libdcgm.so.4.
    assert DCGM_TAG.split("-")[0].split(".")[0] == str(ami["dcgm"]["major_version"])
    assert f"{ami['dcgm']['service']}.service" in SOURCE and not ami["dcgm"]["running_after_boot"]
    # No container runtime to run the exporter's image: its binary runs on the host.
    assert not ami["docker"] and not ami["nvidia_container_toolkit"]
