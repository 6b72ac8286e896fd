"""What the acceptance run records on one node: ``<out>/<queue>_<node>.json`` (``node_checks.NodeRecord``).

    python -m cluster_checks.node_record --queue gpu --gpus 8 --out DIR

Run by jobs/acceptance.sh as one task on every node of the run, inside the jobs venv (so its own
start proves the venv runs on that node type). It runs the node health check the Slurm prolog runs
(``HEALTH_CHECK`` from ``HEALTH_CONF``, as node_scripts/slurm_health_hook.sh finds it), imports torch
and the jobs packages, and reads from nvidia-smi the CUDA version the driver supports and the GPUs'
memory-error counters. Where there is no nvidia-smi (a CPU node) those stay null: not recorded.
Exit 0 whatever it found (the report judges); 2 on bad arguments.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from dataclasses import asdict
from pathlib import Path

from cli import ArgumentParser

from cluster_checks.node_checks import NodeRecord

HEALTH_CONF = "/opt/slurm/etc/llm/health.conf"
HEALTH_CHECK = "/opt/slurm/etc/llm/node_health.sh"
HEALTH_TIMEOUT_S = 120  # as the prolog: a check that hangs (a stuck driver) is a failure too


# As node_scripts/slurm_health_hook.sh runs it: HEALTH_CONF's settings (HEALTH_CHECK and what it reads), exported.
RUN_CHECK = ('set -a; conf="${HEALTH_CONF:-%s}"; if [[ -f $conf ]]; then source "$conf"; fi; set +a; '
             'exec "${HEALTH_CHECK:-%s}"' % (HEALTH_CONF, HEALTH_CHECK))


def run_health_check() -> tuple[int, str]:
    try:
        done = subprocess.run(["bash", "-c", RUN_CHECK], capture_output=True, text=True, timeout=HEALTH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return 124, f"no answer within {HEALTH_TIMEOUT_S}s"
    except OSError as exc:
        return 127, f"cannot run the health check: {exc}"
    return done.returncode, (done.stdout + done.stderr).strip()


def venv_check() -> tuple[bool, str, str | None]:
    """(the venv imports torch and the jobs packages, what it printed, torch's CUDA build)."""
    try:
        import torch
        import data_pipeline.loader  # noqa: F401
        import training.train  # noqa: F401
    except Exception as exc:  # any import failure is the finding
        return False, f"{type(exc).__name__}: {exc}", None
    return True, f"torch {torch.__version__}", torch.version.cuda


def nvidia_smi(*args: str) -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60)
    return done.stdout if done.returncode == 0 else None


def gpu_facts() -> dict:
    """Driver CUDA version and memory-error counters; empty without nvidia-smi."""
    header = nvidia_smi()
    if header is None:
        return {}
    version = re.search(r"CUDA Version:\s*([\d.]+)", header)
    ecc = nvidia_smi("--query-gpu=ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits") or ""
    remap = nvidia_smi("--query-remapped-rows=remapped_rows.pending,remapped_rows.failure",
                       "--format=csv,noheader") or ""
    flags = [field.strip().lower() for line in remap.splitlines() for field in line.split(",")]
    return {"driver_cuda": version.group(1) if version else None,
            "ecc_uncorrected": sum(int(v) for v in ecc.split() if v.isdigit()),
            "row_remap_pending": any(f in ("yes", "1") for f in flags[0::2]) if flags else None,
            "row_remap_failed": any(f in ("yes", "1") for f in flags[1::2]) if flags else None}


def record(queue: str, gpus: int) -> NodeRecord:
    rc, output = run_health_check()
    venv_ok, detail, torch_cuda = venv_check()
    return NodeRecord(node=os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0], queue=queue,
                      gpus_expected=gpus, health_rc=rc, health_output=output, venv_ok=venv_ok, venv_detail=detail,
                      torch_cuda=torch_cuda, **gpu_facts())


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cluster_checks.node_record", description=__doc__.splitlines()[0])
    parser.add_argument("--queue", required=True, help="the Slurm partition this node belongs to (gpu, cpu)")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs the queue's instance type has (0: a CPU queue)")
    parser.add_argument("--out", type=Path, required=True, help="folder for <node>.json")
    args = parser.parse_args(argv)
    node = record(args.queue, args.gpus)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.queue}_{node.node}.json"  # a node in two queues (the local cluster) twice
    path.write_text(json.dumps(asdict(node), indent=1) + "\n")
    print(f"{node.node} ({args.queue}): health {'ok' if node.health_rc == 0 else f'exit {node.health_rc}'}, "
          f"venv {'ok' if node.venv_ok else 'BROKEN'} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
