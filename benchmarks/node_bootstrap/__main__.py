"""Head-node bootstrap: how long OnNodeConfigured takes, against the timeout the settings give it.

    .venv/bin/python -m benchmarks.node_bootstrap [--env prod] [--stand-in-packages] [--out FILE]

Runs node_scripts/directory_setup.sh as the head node's OnNodeConfigured with the Args of the
environment's rendered config, for real: the jobs bundle synced from the (stand-in) assets bucket,
the jobs venv built with `python -m venv` and `pip install -r requirements-jobs.txt` from this
machine's package index, the health hooks installed. The FSx file systems are tmpfs mounts in a
private mount namespace, S3 is local_cluster/stand_ins/aws, and there is no slurmdbd (the accounts
step is skipped). Prints the seconds of each step (the script's own log) and their ratio to
`head_node.bootstrap_timeout_s`; writes JSON.

What this machine cannot show: the real head node installs torch's CUDA build, whose NVIDIA
libraries add a few GB of wheels to download; the timeout's margin over the measured total is
what has to cover that. --stand-in-packages skips pip (JOBS_VENV_SITE_PACKAGES = .venv's packages):
the smoke test in `make test`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "jobs"))

from cli import ArgumentParser  # noqa: E402
from cluster_config.settings import load_settings  # noqa: E402

FSX = ("data", "checkpoints", "logs")
STEP = re.compile(r"step '([^']+)' took (\d+)s")


def head_node_action(env: str, work: Path) -> list[str]:
    """The head node's OnNodeConfigured Args, from the plan the local cluster boots with; fills work/s3."""
    plan = work / "plan"
    subprocess.run([sys.executable, "-m", "local_cluster.boot_plan", "--env", env, "--s3", str(work / "s3"),
                    "--out", str(plan), "--jobs", str(work / "jobs")], cwd=REPO, check=True)
    script, *args = (plan / "HeadNode.OnNodeConfigured").read_text().splitlines()
    assert script.endswith("/directory_setup.sh"), script
    return args


def run(env: str, stand_in_packages: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="node-bootstrap-") as tmp:
        work = Path(tmp)
        args = head_node_action(env, work)
        # The FSx mount points become tmpfs mounts of the same role.
        mounts = {}
        for name in FSX:
            flag = f"--{name}"
            mounts[args[args.index(flag) + 1]] = work / name
            args[args.index(flag) + 1] = str(work / name)
            (work / name).mkdir()
        (work / "cfnconfig").write_text("cfn_node_type=HeadNode\ncfn_cluster_user=root\n")
        environment = {
            "PATH": f"{REPO / 'local_cluster' / 'stand_ins'}:{os.environ['PATH']}",
            "HOME": os.environ.get("HOME", "/root"),
            "LOCAL_S3_ROOT": str(work / "s3"),
            "CFNCONFIG": str(work / "cfnconfig"),
            "JOBS_HOME": str(work / "jobs_home"),
            "JOBS_PYTHON": os.path.realpath(REPO / ".venv" / "bin" / "python"),
            "LOG_DIR": str(work / "log"),
            "SLURM_ETC": str(work / "slurm_etc"),
            "SLURM_BIN": str(work / "no-slurm"),
            "FSX_FSTYPE": "tmpfs",
            # The model credential helper goes to the node's folder, not this machine's /usr/local/sbin.
            "MODEL_CREDENTIALS_HELPER": str(work / "sbin" / "llm-model-credentials"),
        }
        for key in ("PIP_FIND_LINKS", "PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
            if key in os.environ:
                environment[key] = os.environ[key]
        if stand_in_packages:
            environment["JOBS_VENV_SITE_PACKAGES"] = sysconfig.get_paths()["purelib"]
        script = REPO / "node_scripts" / "directory_setup.sh"
        # Its own /etc and /home, as a node has: the models' users the script adds stay in the namespace.
        mount = " && ".join([f"cp -a /etc {work}/etc && mount --bind {work}/etc /etc",
                             f"mkdir {work}/home && mount --bind {work}/home /home",
                             *(f"mount -t tmpfs tmpfs {work / name}" for name in FSX)])
        start = time.monotonic()
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c",
                               f'{mount} && exec bash {script} "$@"', "bootstrap", *args],
                              env=environment, capture_output=True, text=True, timeout=1800)
        total = time.monotonic() - start
        log = (work / "log" / "llm-directory-setup.log").read_text() if (work / "log").exists() else ""
        if proc.returncode != 0:
            raise SystemExit(f"directory_setup.sh failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        steps = {name: int(seconds) for name, seconds in STEP.findall(log)}
    timeout = load_settings(env).head_node.bootstrap_timeout_s
    return {
        "env": env,
        "packages": "stand-in (.venv's site-packages)" if stand_in_packages else "pip install -r requirements-jobs.txt",
        "steps_s": steps,
        "total_s": round(total, 1),
        "head_node_bootstrap_timeout_s": timeout,
        "timeout_over_measured": round(timeout / max(total, 1e-9), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.node_bootstrap", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="prod", help="the environment whose head-node action runs (default prod)")
    parser.add_argument("--stand-in-packages", action="store_true",
                        help="no pip: the venv reads .venv's packages (the quick smoke run)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "node_bootstrap.json")
    args = parser.parse_args(argv)
    result = run(args.env, args.stand_in_packages)
    print(f"head node OnNodeConfigured ({args.env}, packages: {result['packages']}):")
    for name, seconds in result["steps_s"].items():
        print(f"  {name:<18} {seconds:>6} s")
    print(f"  {'total':<18} {result['total_s']:>6.1f} s; HeadNodeBootstrapTimeout {result['head_node_bootstrap_timeout_s']} s "
          f"= {result['timeout_over_measured']}x the measured total")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
