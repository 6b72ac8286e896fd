"""Recovery benchmark: real faults on the local Slurm cluster, how long until training goes on by itself.

    local_cluster/cluster.sh up && .venv/bin/python -m benchmarks.recovery [--faults FAULT ...] [--out FILE]

Per fault: seconds from the fault to the first training step logged by the restarted run (the
metrics file is watched every 0.1 s from the host), steps repeated after the resume, whether the losses equal an
uninterrupted run's bit for bit, and whether a human was needed. Tiny preset, 2 of the 3 nodes,
24 steps with a checkpoint every 6 and a progress-watchdog floor of 8 s. The time limit
(SIGUSR1, the planned path) is measured as the baseline. Writes JSON (default
benchmarks/results/recovery.json); the smoke test in `make test` runs the baseline alone.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "jobs"))

from cli import ArgumentParser, fail  # noqa: E402
from local_cluster.client import LocalCluster  # noqa: E402
from local_cluster.training_job import TrainingJob, continue_stopped  # noqa: E402

STEPS, EVERY, FLOOR_S = 24, 6, 8
RUN = (f"train.steps={STEPS}", f"checkpoint.every={EVERY}", "log.interval=1", "optim.warmup_steps=3",
       f"train.watchdog_floor_s={FLOOR_S}")
FAULT_AT = 9  # the step after which the fault is done: 3 steps past the step-6 checkpoint


def stepped_after_restart(records: list[dict], before: int) -> bool:
    """A loss line logged after a trainer start that came after the first ``before`` records."""
    later = records[before:]
    starts = [i for i, r in enumerate(later) if r.get("event") == "start"]
    return bool(starts) and any("loss" in r for r in later[starts[0]:])


def time_to_next_step(job: TrainingJob, before: int, fault_time: float, timeout: float = 300) -> float:
    """Seconds from the fault until the restarted run logs its first step."""
    job.wait_until("a step after the restart", lambda records: stepped_after_restart(records, before), timeout)
    return round(time.monotonic() - fault_time, 1)


def repeated(job: TrainingJob) -> int:
    steps = [r["step"] for r in job.records() if "loss" in r]
    return len(steps) - len(set(steps))


def measure(cluster, name: str, fault, reference, **env) -> dict:
    job = TrainingJob(cluster, fault.__name__.strip("_")).submit(*RUN, **env)
    try:
        job.wait_for_step(FAULT_AT)
        before, fault_time = len(job.records()), time.monotonic()
        extra = fault(job) or {}
        result = {"fault": name, **extra}
        if extra.get("human_needed"):
            state, code = job.wait()
            result.update(seconds_to_next_step=None, steps_repeated=None, end=f"{state} exit {code}",
                          seconds_to_end=round(time.monotonic() - fault_time, 1), restarts=int(job.record()["Restarts"]))
            return result
        requeued = job.wait_until("the requeue", lambda records: any(
            r.get("event") == "recovery" and r.get("action") == "requeue" for r in records[before:]), 300)
        result["seconds_to_requeue"] = round(requeued - fault_time, 1)
        result["seconds_to_next_step"] = time_to_next_step(job, before, fault_time)
        state, code = job.wait()
        result.update(steps_repeated=repeated(job), end=f"{state} exit {code}", restarts=int(job.record()["Restarts"]),
                      losses_identical=job.losses() == reference, human_needed=False,
                      causes=[e["cause"] for e in job.events("recovery")])
        return result
    finally:
        subprocess.run(["scancel", job.id], check=False)


def time_limit(job):
    subprocess.run(["scancel", "--signal=USR1", job.id], check=True)


def sigkill(job):
    job.kill_worker(signal.SIGKILL, node="node2")


def sigstop(job):
    start = time.monotonic()
    pid = job.kill_worker(signal.SIGSTOP, node="node2")
    try:
        detected = job.wait_until("hang report", lambda _: list(job.log_dir.glob(f"hang_{job.id}_rank*.txt")), 120)
        job.wait_until("the stopped worker's end", lambda _: not Path(f"/proc/{pid}").exists(), 120)
    finally:
        continue_stopped(pid)
    return {"seconds_to_detect": round(detected - start, 1), "watchdog_window_s": FLOOR_S}


def bad_node_fault(cluster, drained: list[str]):
    def bad_node(job):
        node = job.nodes()[-1]
        marker = cluster.fsx / ".node-health" / node
        marker.parent.mkdir(exist_ok=True)
        marker.write_text("benchmark: marked bad\n")  # the stand-in health check fails there from now on
        drained.append(node)
        job.kill_worker(signal.SIGKILL, node=node)
        return {"drained": node}
    return bad_node


def crash_loop(job):
    for attempt in range(2):
        if attempt:
            job.wait_until("the restart", lambda rs: len([r for r in rs if r.get("event") == "start"]) > attempt, 300)
        job.kill_worker(signal.SIGKILL)
    return {"human_needed": True, "why": "retry budget spent (MAX_RECOVERIES=1)"}


def config_error(cluster) -> dict:
    job = TrainingJob(cluster, "bench-config").submit(*RUN, "train.steps=many")
    start = time.monotonic()
    state, code = job.wait()
    return {"fault": "config error", "human_needed": True, "end": f"{state} exit {code}",
            "seconds_to_end": round(time.monotonic() - start, 1), "restarts": int(job.record()["Restarts"]),
            "seconds_to_next_step": None, "steps_repeated": None}


FAULTS = ("time-limit", "sigkill", "sigstop", "bad-node", "crash-loop", "config-error")  # --faults, in run order


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.recovery", description=__doc__.splitlines()[0])
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS), metavar="FAULT",
                        help=f"only these, run in the order {' '.join(FAULTS)} (default: all; time-limit is the baseline)")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/recovery.json"))
    args = parser.parse_args(argv)
    cluster = LocalCluster()
    if not cluster.is_up():
        return fail("the local cluster is not up", "run `local_cluster/cluster.sh up` first")
    from local_cluster import demo_data

    demo_data.build(cluster.fsx / "data/tokenized/sample")
    ref = TrainingJob(cluster, "bench-reference").submit(*RUN)
    assert ref.wait() == ("COMPLETED", 0), ref.output()[-3000:]
    reference = ref.losses()

    drained: list[str] = []
    measured = {  # --faults name: (row name, fault, the job's extra environment)
        "time-limit": ("time limit (SIGUSR1), baseline", time_limit, {}),
        "sigkill": ("worker SIGKILL (Xid, OOM kill)", sigkill, {}),
        "sigstop": ("worker SIGSTOP (hang)", sigstop, {}),
        "bad-node": ("node fails its health check", bad_node_fault(cluster, drained), {}),
        "crash-loop": ("crash loop (a rank that always dies)", crash_loop, {"MAX_RECOVERIES": "1"}),
    }
    rows = []
    try:
        for name in (f for f in FAULTS if f in args.faults):
            if name == "config-error":
                rows.append(config_error(cluster))
            else:
                row, fault, env = measured[name]
                rows.append(measure(cluster, row, fault, reference, **env))
    finally:
        for node in drained:
            (cluster.fsx / ".node-health" / node).unlink(missing_ok=True)
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)

    result = {"setup": f"local Slurm cluster, 3 CPU nodes (2 per job), tiny preset, {STEPS} steps, checkpoint every "
                       f"{EVERY}, fault after step {FAULT_AT}, watchdog floor {FLOOR_S} s", "faults": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("| fault | seconds to requeue | seconds to next step | steps repeated | losses identical | human needed | end |")
    print("|---|---|---|---|---|---|---|")
    cell = lambda value: "-" if value is None else value  # noqa: E731
    for r in rows:
        print(f"| {r['fault']} | {cell(r.get('seconds_to_requeue'))} | {cell(r.get('seconds_to_next_step'))} | "
              f"{cell(r.get('steps_repeated'))} | "
              f"{cell(r.get('losses_identical'))} | {'yes' if r.get('human_needed') else 'no'} | {r['end']} |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
