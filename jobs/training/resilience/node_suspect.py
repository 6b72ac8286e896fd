"""A rank's report that its own node should be taken out of service, for the root epilog to act on.

A job runs as its user and cannot drain a node; the Slurm epilog (node_scripts/slurm_health_hook.sh)
runs as root on every node of the job when it ends. A rank that finds its node at fault (a straggler
the trainer evicts, a replica the sentinel finds disagreeing) writes one line to

    /dev/shm/llm-node-suspect.<SLURM_JOB_ID>

on its own node: node-local (tmpfs: nothing on shared storage, so a job reports only nodes it ran on),
sticky and world-writable (the job's user can write it, no other user can replace it), gone after a
reboot. The epilog trusts it only as a regular file of the job's user named for its job, reads one
printable line (160 characters at most), removes it, and drains the node with reason
``job <id>: <line>`` into the failure history (quarantine on a repeat failure). Written atomically
(a rename), so the epilog never reads half a line; several ranks of one node may write it, the last wins.

``NODE_SUSPECT_DIR`` moves it (tests); outside Slurm (no SLURM_JOB_ID) nothing is written.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

MAX_LINE = 160  # what the epilog keeps of it


def marker_path() -> Path | None:
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return None
    return Path(os.environ.get("NODE_SUSPECT_DIR", "/dev/shm")) / f"llm-node-suspect.{job}"


def report(line: str) -> Path | None:
    """Ask the epilog to take this node out with ``line`` as the evidence; the marker written, or None."""
    path = marker_path()
    if path is None:
        log.warning("not a Slurm job: no epilog to take this node out (%s)", line)
        return None
    text = " ".join(line.split())[:MAX_LINE]
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        partial.write_text(text + "\n")
        os.replace(partial, path)
    except OSError as exc:
        log.error("could not report this node to the epilog at %s: %s", path, exc)
        return None
    log.warning("reported this node to the epilog (%s): %s", path, text)
    return path
