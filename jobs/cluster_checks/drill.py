"""The acceptance run's recovery drill: a short training run whose ranks on one node are killed must
resume from its checkpoint with the same losses as an uninterrupted run, bit for bit (deterministic
kernels: ``train.deterministic``), and a stopped rank must be detected within the collective timeout.

jobs/acceptance.sh runs the drill through ``python -m cluster_checks.acceptance`` (``drill-args``,
``signal``, ``drill``): this module gives it the drill's overrides for its allocation, finds the
workers to signal, writes drill.json from the runs' metrics (``drill_record``) and judges it
(``drill_checks``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional

from cluster_checks.verdict import Check, check, not_measured

# A stalled rank must be noticed within the collective timeout (train.timeout_s); NCCL's watchdog sees
# the expired collective on its next poll, and the rank's teardown (dumps, traceback) takes seconds.
STALL_GRACE_S = 30.0
DRILL = "drill"  # the checks' section in the report
RECOVERY_SOURCE = ("jobs/training/checkpoints/checkpointer.py + recovery.py: a killed rank requeues and resumes exactly "
                   "(tests/training/test_resume.py on CPU)")
STALL_SOURCE = ("jobs/training/config.py train.timeout_s (collective timeout after the first step), "
                "jobs/training/resilience/watchdog.py")


def recovery(scope: str, recovered: Optional[bool], reference: Optional[Mapping[int, float]],
             resumed: Optional[Mapping[int, float]], reference_samples: Optional[Mapping[int, int]] = None,
             resumed_samples: Optional[Mapping[int, int]] = None) -> Check:
    """A rank killed after a checkpoint: the job must resume on its own (``recovered``), and the steps after
    the resume must equal the uninterrupted run's bit for bit: their losses (step -> loss) and the data
    they read (step -> samples_crc, where recorded; the drill logs every step)."""
    name = f"{scope}: killed rank recovers, losses bit-identical"
    expected = "resumed automatically; losses and data (samples_crc) after the resume == uninterrupted run"
    if recovered is None:
        return not_measured(name, expected, "no drill/drill.json: the drill did not run (ACCEPTANCE_PARTS, or the "
                            "job ended before it)", RECOVERY_SOURCE)
    if not reference or not resumed:
        failed = ([] if reference else ["the uninterrupted run (drill/reference) logged no loss"]) + (
            [] if resumed else ["the killed run (drill/recovered) logged no loss after a resume"])
        return not_measured(name, expected, f"{' and '.join(failed)}: first read the drill runs' 'problem:' and "
                            "Traceback lines in the job's output (a config error makes every run exit 2 at start-up)",
                            RECOVERY_SOURCE)
    reference = {int(s): v for s, v in reference.items()}
    resumed = {int(s): v for s, v in resumed.items()}
    common = sorted(set(reference) & set(resumed))
    reference_data = {int(s): v for s, v in (reference_samples or {}).items()}
    resumed_data = {int(s): v for s, v in (resumed_samples or {}).items()}
    other_data = [s for s in common
                  if s in reference_data and s in resumed_data and reference_data[s] != resumed_data[s]]
    differ = sorted({s for s in common if reference[s] != resumed[s]} | set(other_data))
    if not recovered:
        why = ("the job did not resume on its own: first read its failure file and jobs/train.sh's requeue decision "
               "(training/resilience/recovery.py) in the job's log")
    elif not common:
        why = "the resumed run logged none of the reference run's steps: compare the steps each logged"
    elif other_data:
        why = (f"{len(differ)} of {len(common)} steps differ (first: step {differ[0]}); the data differs from step "
               f"{other_data[0]} (samples_crc): the resume did not restore the loader's position")
    else:
        data = ("on the same data (samples_crc equal)" if all(s in reference_data and s in resumed_data for s in differ)
                else "(samples_crc not recorded)")
        why = (f"{len(differ)} of {len(common)} steps differ (first: step {differ[0] if differ else '-'}) {data}: the "
               "resume does not restore all state (model, optimizer, RNG); on GPU, check that both runs' config line "
               "has train.deterministic true")
    ok = bool(recovered and common and not differ)
    return check(name, ok, f"{'resumed' if recovered else 'NOT resumed'}, {len(common) - len(differ)} of "
                 f"{len(common)} steps identical", expected, why, RECOVERY_SOURCE)


def stall_detected(scope: str, detected_s: Optional[float], timeout_s: Optional[float],
                   rank_stopped: bool = True) -> Check:
    """Seconds from stopping one rank (SIGSTOP) to the job noticing (a collective timeout or the watchdog);
    ``detected_s`` None with ``timeout_s`` set: it was never noticed. ``rank_stopped`` False: the run never
    reached the step where a rank is stopped, so there was nothing to detect."""
    name = f"{scope}: stalled rank detected"
    expected = (f"<= {timeout_s + STALL_GRACE_S:.0f} s (timeout {timeout_s:.0f} s + {STALL_GRACE_S:.0f} s)"
                if timeout_s else "within the collective timeout")
    if not timeout_s:
        return not_measured(name, expected, "stall test not recorded", STALL_SOURCE)
    if not rank_stopped:
        return not_measured(name, expected, "no rank was stopped: the stalled run (drill/stalled) failed before its "
                            "step 2; first read its 'problem:' and Traceback lines in the job's output", STALL_SOURCE)
    if detected_s is None:
        return check(name, False, "never detected", expected,
                     "a stopped rank left the job hanging: neither the collective timeout nor the progress watchdog "
                     "ended it; first run tests/training/test_collective_timeout.py (every process group must get "
                     "train.timeout_s) and tests/training/test_watchdog.py", STALL_SOURCE)
    limit = timeout_s + STALL_GRACE_S
    return check(name, detected_s <= limit, f"{detected_s:.0f} s", expected,
                 "noticed later than the collective timeout: the collective that waited did not time out (a group "
                 "with the default 30 min timeout) and the watchdog's longer window ended it; first read the "
                 "hang_*.txt the watchdog wrote: its stacks name the collective", STALL_SOURCE,
                 ratio=detected_s / timeout_s, limit=limit / timeout_s)


def drill_checks(record: Optional[Mapping], scope: str = DRILL) -> list[Check]:
    """Recovery and stall detection from DIR/drill/drill.json (``drill_record``); None: the drill did not run."""
    r = record or {}
    return [recovery(scope, r.get("recovered"), r.get("reference_losses"), r.get("resumed_losses"),
                     r.get("reference_samples"), r.get("resumed_samples")),
            stall_detected(scope, r.get("stall_detected_s"), r.get("collective_timeout_s"),
                           r.get("rank_stopped", True))]


def _losses(metrics: Path) -> tuple[dict[int, float], dict[int, int], list[dict]]:
    """(step -> the last loss logged for it, step -> its samples_crc, the event lines) of a run's metrics.jsonl."""
    losses, samples, events = {}, {}, []
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a line cut by the kill
                continue
            if "loss" in record and "step" in record:
                losses[int(record["step"])] = record["loss"]
                if "samples_crc" in record:
                    samples[int(record["step"])] = record["samples_crc"]
            elif "event" in record:
                events.append(record)
    return losses, samples, events


def drill_record(drill_dir: Path, stall_detected_s: Optional[float], timeout_s: float,
                 rank_stopped: bool = True) -> dict:
    """What jobs/acceptance.sh's drill did: runs ``reference`` (uninterrupted), ``recovered`` (killed after a
    checkpoint, then started again) and ``stalled`` under DIR/<run>/logs/metrics.jsonl; ``rank_stopped``:
    the stalled run reached the step where one of its ranks is stopped."""
    reference, reference_samples, _ = _losses(drill_dir / "reference" / "logs" / "metrics.jsonl")
    recovered, recovered_samples, events = _losses(drill_dir / "recovered" / "logs" / "metrics.jsonl")
    resumes = [e for e in events if e.get("event") == "start" and e.get("resumed")]
    finished = any(e.get("event") == "complete" for e in events)
    resumed_from = int(resumes[-1]["step"]) if resumes else None
    after = [s for s in recovered if resumed_from is not None and s > resumed_from]
    return {"recovered": bool(resumes and finished), "resumed_from_step": resumed_from,
            "reference_losses": reference, "resumed_losses": {s: recovered[s] for s in after},
            "reference_samples": reference_samples,
            "resumed_samples": {s: recovered_samples[s] for s in after if s in recovered_samples},
            "rank_stopped": rank_stopped, "stall_detected_s": stall_detected_s, "collective_timeout_s": timeout_s}


# The drill's batch, from its allocation: 4 sequences per rank per micro-batch, 2 micro-batches per step
# (the resumed steps accumulate, as production steps do). A fixed global batch fits one allocation only
# (32 cannot start on 2 x 8 GPUs: 16 ranks x 4 > 32).
DRILL_MICRO_BATCH, DRILL_ACCUMULATION = 4, 2


def drill_overrides(ranks: int) -> list[str]:
    """The drill's training overrides that depend on its allocation (``ranks`` = nodes x workers per node,
    each a data-parallel rank under FSDP) and on its recovery criterion: deterministic kernels, so that a
    resumed run repeats the uninterrupted one's losses bit for bit on GPUs too (docs/acceptance.md)."""
    if ranks < 1:
        raise ValueError(f"--ranks {ranks}: the drill needs at least one rank — pass nodes x workers per node")
    return ["train.parallelism=fsdp", f"train.micro_batch_size={DRILL_MICRO_BATCH}",
            f"train.global_batch_size={DRILL_MICRO_BATCH * DRILL_ACCUMULATION * ranks}", "train.deterministic=true"]


def training_workers(node: str, module: str = "training.train") -> list[int]:
    """PIDs of the training workers (``python -u -m <module>``, not torchrun or srun) of a Slurm job on
    ``node``: by their command line and the node Slurm started them on (SLURMD_NODENAME), so that
    nodes sharing one process table (the local cluster) are told apart too."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        words = [a.decode(errors="replace") for a in argv]
        worker = Path(words[0]).name.startswith("python") and module in words[1:4] and "-m" in words[1:4]
        if worker and f"SLURMD_NODENAME={node}".encode() in environ and int(proc.name) != os.getpid():
            pids.append(int(proc.name))
    return pids
