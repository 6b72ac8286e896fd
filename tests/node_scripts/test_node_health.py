"""node_health.sh fails closed, on a stand-in p5e.48xlarge node: the node's tools are fakes on PATH (lspci listing
the PCI devices node_scripts/ami/ describes, nvidia-smi, dmesg), with /dev and /sys trees; the check itself runs
for real, as any user. What it must do: drain when the kernel log cannot be read; act on every Xid of NVIDIA's
catalog as node_scripts/xid_catalog.tsv says (pass, drain, reset-reboot, escalate after repeats, counted per GPU
across runs); drain for a pending row remap or an NVSwitch fabric that is not up, and say so where nvidia-smi
cannot tell."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "node_scripts"
GPU_NODE = yaml.safe_load((SCRIPTS / "ami" / "parallelcluster-3.16-al2023.yaml").read_text())["nodes"]["gpu_compute"]
BUSES = ["53", "64", "75", "86", "97", "a8", "b9", "ca"]  # the 8 H200s' PCI buses
SWITCH_BUSES = ["07", "08", "09", "0a"]


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def xid(code: int, bus: str = "97", ago: float = 60.0, text: str = "pid=4242, name=python, Ch 00000008") -> str:
    """A kernel log line of Xid ``code`` on the GPU at ``bus``, ``ago`` seconds ago (dmesg's seconds since boot)."""
    return f"[{uptime() - ago:12.6f}] NVRM: Xid (PCI:0000:{bus}:00): {code}, {text}"


def smi_q(*, pending: str = "", failed: str = "", fabric: str = "Completed", status: str = "Success",
          remapper: bool = True) -> str:
    """`nvidia-smi -q` as 8 H200s answer it, the sections the check reads (a GPU's bus in ``pending`` or
    ``failed``: its row remap is pending, or failed)."""
    out = ["==============NVSMI LOG==============", "", "Timestamp                                 : Mon Nov 24 09:42:00 2026",
           "Driver Version                            : 570.172.08", "CUDA Version                              : 12.8",
           "", "Attached GPUs                             : 8"]
    for bus in BUSES:
        out += [f"GPU 00000000:{bus.upper()}:00.0", "    Product Name                          : NVIDIA H200",
                "    ECC Mode", "        Current                           : Enabled",
                "        Pending                           : Enabled",  # not the row remapper's Pending
                "    Fabric", f"        State                             : {fabric}",
                f"        Status                            : {status}", "        CliqueId                          : 0"]
        if remapper:
            out += ["    Remapped Rows", "        Correctable Error                 : 0",
                    "        Uncorrectable Error               : 0",
                    f"        Pending                           : {'Yes' if bus == pending else 'No'}",
                    f"        Remapping Failure Occurred        : {'Yes' if bus == failed else 'No'}",
                    "        Bank Remap Availability Histogram", "            Max                           : 640 bank(s)"]
        else:
            out += ["    Remapped Rows                         : N/A"]
        out += ["    Processes                             : None", ""]
    return "\n".join(out) + "\n"


class Node:
    """A GPU node's disk in a folder: the fakes read what the test puts beside them (kmsg, smi-q, ...)."""

    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "usr" / "bin"
        self.bin.mkdir(parents=True)
        self.history = root / "var" / "lib" / "llm-node-health" / "xid-events.tsv"
        devices = [(d["class"], d["vendor_device"]) for d in GPU_NODE["nvidia"]["pci_devices"] for _ in range(d["count"])]
        buses = iter(BUSES + SWITCH_BUSES)
        self.listing = "\n".join(f"{next(buses)}:00.0 {cls}: {vd} (rev a1)" for cls, vd in devices)
        self.write_lspci(self.listing)
        self.tool("nvidia-smi", f'r={root}\ncase "$*" in\n'
                                '  -L) for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H200 (UUID: GPU-$i)"; done ;;\n'
                                '  -q) cat "$r/smi-q"; exit "$(cat "$r/smi-q.rc" 2>/dev/null || echo 0)" ;;\n'
                                '  *) echo "Invalid combination of input arguments. Please run \'nvidia-smi -h\' for help."; exit 2 ;;\n'
                                'esac\n')
        self.tool("dmesg", f'r={root}\nif [[ -e $r/dmesg.fails ]]; then\n'
                           '  echo "dmesg: read kernel buffer failed: Operation not permitted" >&2\n  exit 1\nfi\n'
                           'cat "$r/kmsg"\n')
        for i in range(8):
            (root / "dev").mkdir(exist_ok=True)
            (root / "dev" / f"nvidia{i}").touch()
        (root / "sys" / "class" / "infiniband").mkdir(parents=True)  # EFA: test_node_images.py
        (root / "node-health.env").write_text("EXPECTED_GPUS=8\n")
        self.kmsg()
        self.smi(smi_q())

    def tool(self, name: str, body: str) -> None:
        (self.bin / name).write_text("#!/bin/bash\n" + body)
        (self.bin / name).chmod(0o755)

    def write_lspci(self, listing: str) -> None:
        self.tool("lspci", 'vendor=""\nwhile (($#)); do [[ $1 == -d ]] && { vendor="${2%%:*}"; shift; }; shift; done\n'
                           'while read -r slot cls id rest; do\n  [[ ${id%%:*} == "$vendor" ]] && echo "$slot $cls $id $rest"\n'
                           f"done <<'EOF'\n{listing}\nEOF\nexit 0\n")

    def kmsg(self, *lines: str) -> None:
        (self.root / "kmsg").write_text("".join(f"{line}\n" for line in lines))

    def smi(self, q: str, rc: int = 0) -> None:
        (self.root / "smi-q").write_text(q)
        (self.root / "smi-q.rc").write_text(f"{rc}\n")

    def check(self, as_nobody: bool = False, **env: str) -> subprocess.CompletedProcess:
        """The check as root, or as the user nobody (setpriv), as an acceptance run checks as its job's user."""
        user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_nobody else []
        full = {"PATH": f"{self.bin}:{os.environ['PATH']}", "NODE_HEALTH_ENV": str(self.root / "node-health.env"),
                "SYSFS_ROOT": str(self.root / "sys"), "DEV_ROOT": str(self.root / "dev"),
                "EFA_BIN": str(self.root / "opt" / "amazon" / "efa" / "bin"), "FSX_MOUNTS": "",
                "XID_HISTORY": str(self.history), **env}
        return subprocess.run([*user, "bash", str(SCRIPTS / "node_health.sh")], env=full, capture_output=True,
                              text=True, timeout=60)

    def fails(self, **env: str) -> str:
        """The check's reason (its last line), asserting that it failed."""
        proc = self.check(**env)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        return proc.stdout.splitlines()[-1]

    def passes(self, **env: str) -> list[str]:
        """The check's lines before "healthy", asserting that it passed."""
        proc = self.check(**env)
        assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "healthy", proc.stdout + proc.stderr
        return proc.stdout.splitlines()[:-1]


@pytest.fixture
def node(tmp_path) -> Node:
    return Node(tmp_path)


def test_the_stand_in_node_is_healthy(node):
    assert node.passes() == []


# --- the kernel log ----------------------------------------------------------------------------------------

def test_a_kernel_log_that_cannot_be_read_drains_the_node_saying_so(node):
    node.kmsg(xid(79))  # there, but unreadable: it used to pass as healthy, Xid 79, 48 and 95 alike
    (node.root / "dmesg.fails").touch()
    reason = node.fails()
    assert reason.startswith("the kernel log cannot be read (dmesg: read kernel buffer failed: Operation not permitted)")
    assert "not trusted" in reason
    (node.root / "dmesg_restrict").write_text("1\n")  # a kernel that keeps the log from users: root must read it
    assert node.fails(DMESG_RESTRICT=str(node.root / "dmesg_restrict")).startswith("the kernel log cannot be read")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="runs the check as another user (root)")
def test_a_users_run_on_a_kernel_that_keeps_the_log_from_users_says_the_prolog_checks_it():
    """The acceptance run checks its nodes as its job's user; with kernel.dmesg_restrict=1 (Ubuntu's default) the
    kernel log is root's, and the Slurm prolog and epilog, root's, have checked it: the run says so and goes on.
    Where the kernel lets users read it, a user's run that cannot read it still drains."""
    root = Path(tempfile.mkdtemp(prefix="node-health-"))  # not pytest's tmp_path: that is root's alone (0700)
    try:
        root.chmod(0o755)
        node = Node(root)
        node.kmsg(xid(79))
        (root / "dmesg.fails").touch()
        (root / "dmesg_restrict").write_text("1\n")
        proc = node.check(as_nobody=True, DMESG_RESTRICT=str(root / "dmesg_restrict"))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.splitlines() == [
            "the kernel log is root's here (kernel.dmesg_restrict=1): Xids not checked by this run; the Slurm prolog "
            "and epilog check them as root", "healthy"]
        (root / "dmesg_restrict").write_text("0\n")
        proc = node.check(as_nobody=True, DMESG_RESTRICT=str(root / "dmesg_restrict"))
        assert proc.returncode == 1 and proc.stdout.splitlines()[-1].startswith("the kernel log cannot be read")
    finally:
        shutil.rmtree(root)


# --- each Xid, as the catalog says ----------------------------------------------------------------------

@pytest.mark.parametrize("code, says", [
    (94, "NVIDIA Xid 94 (ROBUST_CHANNEL_CONTAINED_ERROR): NVIDIA's action RESTART_APP: the job restarts, the node stays"),
    (63, "NVIDIA Xid 63 (INFOROM_DRAM_RETIREMENT_EVENT): NVIDIA's action IGNORE: the node stays"),
    (43, "NVIDIA Xid 43 (ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR): NVIDIA's action IGNORE: the node stays"),
])
def test_contained_and_recorded_events_pass(node, code, says):
    node.kmsg(xid(code), xid(code, ago=30))
    assert node.passes() == [says]  # one line per Xid


@pytest.mark.parametrize("code, nvidia, remedy", [
    (54, "CHECK_MECHANICALS", "hardware"),  # auxiliary power
    (61, "UNEXPECTED_ERR_REPORT_ISSUE", "hardware"),  # PMU breakpoint: NVIDIA has no explanation on this GPU
    (48, "WORKFLOW_XID_48", "hardware"),  # double-bit ECC
    (79, "RESTART_BM", "reset or reboot"),  # fell off the bus
    (95, "RESET_GPU", "reset or reboot"),  # uncontained ECC
    (151, "RESTART_VM", "reset or reboot"),  # key rotation
    (160, "RESTART_BM", "reset or reboot"),  # channel retirement
    (162, "RESET_GPU", "reset or reboot"),
])
def test_fatal_and_reset_xids_drain_the_node(node, code, nvidia, remedy):
    node.kmsg(xid(13, ago=90), xid(code, bus="a8"))  # an application's Xid first does not hide it
    reason = node.fails()
    assert reason.startswith(f"fatal NVIDIA Xid {code} in the kernel log: "), reason
    assert reason.endswith(f", NVIDIA's action {nvidia} (GPU PCI:0000:a8:00; {remedy})"), reason


# --- repeats: Xid 13 and 31 drain at the fifth on one GPU within 24 h, counted across runs ---------------

@pytest.mark.parametrize("code", [13, 31])
def test_the_fifth_repeat_on_one_gpu_within_the_window_drains(node, code):
    lines = [xid(code, ago=600 - 100 * i) for i in range(5)]
    node.kmsg(*lines[:4])
    assert f"NVIDIA Xid {code} on GPU PCI:0000:97:00: 4 within 24 h, the node drains at 5" in node.passes()
    node.kmsg(*lines)  # one more, as the next job's epilog finds it
    assert node.fails() == (f"NVIDIA Xid {code} 5 times within 24 h on GPU PCI:0000:97:00 (drains at 5): "
                            "repeated, the GPU itself is suspect")


def test_repeats_are_kept_between_runs_once_each(node):
    node.kmsg(*(xid(13, ago=ago) for ago in (500, 400, 300)))
    node.passes()
    assert node.passes()[-1].endswith(": 3 within 24 h, the node drains at 5")  # the same lines read again count once
    node.kmsg(xid(13, ago=200), xid(13, ago=100))  # the first three gone from the kernel log (rotated, rebooted)
    assert node.fails().startswith("NVIDIA Xid 13 5 times within 24 h on GPU PCI:0000:97:00")
    assert len(node.history.read_text().splitlines()) == 5


def test_repeats_older_than_the_window_no_longer_count(node):
    node.history.parent.mkdir(parents=True)
    day_ago = int(time.time()) - 86400
    node.history.write_text("".join(f"{day_ago - 3600 * i}\tPCI:0000:97:00\t13\n" for i in range(1, 5)))  # 25-28 h ago
    node.kmsg(xid(13))
    assert node.passes()[-1].endswith(": 1 within 24 h, the node drains at 5")
    node.history.write_text("".join(f"{day_ago + 3600 * i}\tPCI:0000:97:00\t13\n" for i in range(1, 5)))  # 20-23 h ago
    assert node.fails().startswith("NVIDIA Xid 13 5 times within 24 h")


@pytest.mark.parametrize("lines", [
    [xid(13, ago=60 - i / 10) for i in range(6)],  # one fault, six lines within the same second
    [xid(13, bus=bus) for bus in BUSES[:6]],  # one application's fault on six GPUs at once
    [xid(13, ago=60 * i) for i in range(1, 4)] + [xid(31, ago=60 * i + 30) for i in range(1, 4)],  # 13 and 31 apart
], ids=["one-burst", "six-gpus", "two-xids"])
def test_what_is_not_five_repeats_of_one_xid_on_one_gpu_passes(node, lines):
    node.kmsg(*lines)
    node.passes()


def test_without_a_writable_history_the_kernel_logs_repeats_still_count(node):
    node.kmsg(*(xid(31, ago=60 * i) for i in range(1, 6)))
    proc = node.check(XID_HISTORY="/dev/null/xid-events.tsv")  # not root (an acceptance run), no such folder
    assert proc.returncode == 1
    assert "no Xid history at /dev/null/xid-events.tsv (cannot write it): counting the kernel log's Xids only" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("NVIDIA Xid 31 5 times within 24 h")


# --- row remapping and the NVSwitch fabric (nvidia-smi -q) -------------------------------------------------

def test_a_pending_row_remap_drains_the_node(node):
    node.smi(smi_q(pending="97"))
    assert node.fails() == ("GPU 00000000:97:00.0 has a memory row remap pending (nvidia-smi -q -d ROW_REMAPPER): "
                            "it needs a GPU reset")


def test_a_failed_row_remap_drains_the_node(node):
    node.smi(smi_q(failed="b9"))
    assert node.fails() == ("GPU 00000000:B9:00.0 failed to remap a memory row (nvidia-smi -q -d ROW_REMAPPER): "
                            "the GPU needs replacing")


@pytest.mark.parametrize("state, status", [("In Progress", "N/A"), ("Not Started", "N/A"), ("Completed", "Unknown Error")])
def test_an_nvswitch_fabric_that_is_not_up_drains_the_node(node, state, status):
    node.smi(smi_q(fabric=state, status=status))
    assert node.fails() == (f"GPU 00000000:53:00.0: NVSwitch fabric State {state}, Status {status} (nvidia-smi -q, "
                            "Fabric): the fabric manager (nvidia-fabricmanager) has not set up NVLink")


def test_without_nvswitches_on_the_pci_bus_the_fabric_is_not_asked(node):
    node.write_lspci("\n".join(line for line in node.listing.splitlines() if " 0680: " not in line))
    node.smi(smi_q(fabric="N/A", status="N/A"))
    assert node.passes() == []


def test_what_nvidia_smi_cannot_show_is_skipped_with_a_note(node):
    node.smi(smi_q(fabric="N/A", status="N/A", remapper=False))
    assert node.passes() == ["nvidia-smi shows no row remapping on these GPUs: not checked",
                             "nvidia-smi shows no NVSwitch fabric state on these GPUs: not checked"]
    node.smi("Invalid combination of input arguments.\n", rc=2)  # an nvidia-smi without -q, as on older stand-ins
    assert node.passes() == ["nvidia-smi -q is not available here (exit 2): row remapping and the NVSwitch fabric "
                             "not checked"]


def test_nvidia_smi_failing_its_query_drains_the_node(node):
    node.smi("Unable to determine the device handle for GPU0000:97:00.0: GPU is lost.\n", rc=15)
    assert node.fails() == "nvidia-smi -q failed (exit 15): Unable to determine the device handle for GPU0000:97:00.0: GPU is lost."
