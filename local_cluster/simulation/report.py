"""What a simulation run measured per model, beside what the goodput model predicts for it.

Measured, in simulated time, over the window from the simulation's start (every model training) to the
end of its days, or to the model's completion if sooner:

  ETTR            productive step time / wall time: the steps gained over the window (at the end, the
                  step reached if the model is training, else the checkpoint it will resume from) x the
                  step time, over the window
  failures        injected failures that hit one of the model's nodes while its job ran
  time to resume  from a failure to the first step after the restart (a node free or not)
  GPU-h lost      (window - productive time) x the model's GPUs
  share           the most nodes its jobs held at once (never above its share), and the longest time it
                  waited while enough nodes were idle, Slurm's requeue hold aside (never beyond the
                  scheduler's cycle)
  end             complete, or still running / waiting to restart; never failed or pending for good

Predicted: ``cluster_config.goodput.Goodput`` with the simulation's effective parameters: the plan's
step and save times and Young's interval (simulated, so unchanged), the injected failure rate, and the
local recovery and replacement as ``calibrate`` measured them, multiplied by the time scale. "given
failures" uses the failures that did happen instead of the expected count: the per-failure cost alone.
"given resumes" also takes each failure's measured time to resume instead of the calibrated recovery:
what is left to compare is the rework, that a restart loses only the steps since its latest checkpoint.
Both also count the stragglers the model met (below), each by the goodput model.

Stragglers, from the stand-in trainer's lines (each log interval: the slowest rank's excess and node):

  met             slow nodes seen in the model's lines (an excess over 0)
  slowed h        the intervals it ran slowed; lost h: their time beyond the steps' time unslowed
  detection h     from the node turning slow (or the job starting on it) to the trainer's straggler event
  eviction h      from that event to the first step after the restart (the save, the requeue, the restart)
  operator h      without eviction: from a person's drain and requeue to the first step after the restart

Predicted: ``cluster_config.goodput.Stragglers`` with the simulation's parameters (the injected rate, the
window's days, the plan's detection window; the eviction's save, plus the calibrated restart after a GPU
failure, whose path an eviction takes: the ranks exit, jobs/train.sh requeues, the epilog drains the
node). "given stragglers": each slow node met holding the model back for the detection window (evicted;
its steps run slowed) or ``straggler_unattended_h`` (unattended), or for as long as it did if shorter (it
turned slow near the window's end, or its job was down meanwhile), and an eviction's cost for each
restart after (the trainer's eviction, or the person's drain and requeue).
"""

from __future__ import annotations

import dataclasses
import math

from cluster_config.goodput import DAY_S, Goodput, Stragglers, p_no_spare
from local_cluster.simulation.faults import KINDS
from local_cluster.simulation.run import Calibration, ModelSim, RunRecord

HOLD_REASON = "BeginTime"  # Slurm holds a requeued job until its old credential expires (cred_expire + 1 s)
SCHEDULER_CYCLE_WALL = 5.0  # sched_interval 2 s + bf_interval 1 s + a poll: longer is a model left waiting
TOLERANCE = 0.20


def predicted(model: ModelSim, record: RunRecord, calibration: Calibration, kind: str | None = None) -> Goodput:
    """The model's goodput with the simulation's effective parameters (a failure of ``kind``, or the mix)."""
    scale, spares = record.scenario.scale, record.scenario.spares
    training = sum(m.nodes for m in record.models)
    replacement_s = calibration.replacement * scale
    per_node_day = record.scenario.failures_per_1000_node_days / 1000
    return dataclasses.replace(
        model.plan, nodes=model.nodes, gpus=model.gpus, failures_per_day=per_node_day * model.nodes,
        checkpoint_interval_s=model.every * model.step_s, save_s=model.save_s,
        recovery_s=calibration.recovery(model.name, kind, record.scenario.gpu_share) * scale, replacement_s=replacement_s,
        p_no_spare=p_no_spare(per_node_day * training * replacement_s / DAY_S, spares))


def predicted_stragglers(model: ModelSim, record: RunRecord, calibration: Calibration, days: float) -> Stragglers:
    """The model's stragglers over ``days`` with the simulation's parameters."""
    s = record.scenario
    failure = predicted(model, record, calibration, "GPU failed")  # an eviction's path: ranks exit, train.sh requeues
    return dataclasses.replace(
        model.plan_stragglers, gpus=model.gpus, days=days, per_day=s.stragglers_per_1000_node_days / 1000 * model.nodes,
        slowdown=s.straggler_slowdown, unattended_s=s.straggler_unattended_h * 3600,
        evict_s=failure.save_s + failure.recovery_s + failure.replacement_wait_s)


def _resumed_after(starts: list[dict], t: float, step_wall: float, end: float) -> float | None:
    """Wall seconds from ``t`` to the first step after the next start, None if none came by ``end``."""
    later = [r["time"] for r in starts if r["time"] > t]
    return later[0] + step_wall - t if later and later[0] <= end else None


def straggler_result(model: ModelSim, record: RunRecord, calibration: Calibration, records: list[dict],
                     t_end: float) -> dict:
    """What slow nodes did to the model in the window, measured and by the goodput model."""
    scenario, scale, t0 = record.scenario, record.scenario.scale, record.t0
    step_wall = model.step_s / scale
    starts = [r for r in records if r.get("event") == "start"]
    slowed = lost = 0.0
    exposed: dict[str, float] = {}  # node -> the wall time it held the model back
    previous = None  # the step of the line (or start) before: a line's interval is the steps since
    for r in records:
        if r.get("event") == "start":
            previous = r["step"]
        elif "loss" in r and previous is not None:
            steps, previous = r["step"] - previous, r["step"]
            if r.get("slowest_excess_pct", 0) > 0 and t0 < r["time"] <= t_end:
                elapsed = r["step_time_s"] * steps
                slowed += elapsed
                lost += elapsed - steps * step_wall
                exposed[r["slowest_node"]] = exposed.get(r["slowest_node"], 0.0) + elapsed
    events = [r for r in records if r.get("event") in ("straggler", "evict") and t0 < r["time"] <= t_end]
    detected = [r for r in events if r["event"] == "straggler"]
    evicted = [r for r in events if r["event"] == "evict"]
    detection, eviction, restarted = [], [], []
    for event in detected:
        arrived = max((x["time"] for x in record.stragglers if x["node"] == event["node"] and "skipped" not in x
                       and x["time"] <= event["time"]), default=t0)
        run_start = max((x["time"] for x in starts if x["time"] <= event["time"]), default=t0)
        detection.append((event["time"] - max(arrived, run_start)) * scale)
        if any(e["node"] == event["node"] and e["step"] == event["step"] for e in evicted):
            eviction.append(_resumed_after(starts, event["time"], step_wall, t_end))
            restarted.append(event["time"])
    operated = [x for x in record.stragglers if x.get("operator_model") == model.name and x["operator"] <= t_end]
    operator = [_resumed_after(starts, x["operator"], step_wall, t_end) for x in operated]
    restarted += [x["operator"] for x in operated]
    guess = predicted_stragglers(model, record, calibration, (t_end - t0) * scale / DAY_S)
    slowdown = guess.slowdown
    hold_s = guess.detect_wall_s if scenario.evict else guess.unattended_s
    # given: each node met holding the model back for the model's time, or as long as it did if shorter (it
    # turned slow near the window's end, or the job was down meanwhile), then each restart (eviction or person)
    given_slow = sum(min(hold_s, wall * scale) * slowdown / (1 + slowdown) for wall in exposed.values())
    return {
        "met": len(exposed), "nodes": sorted(exposed), "expected": guess.expected,
        "slowed_h": slowed * scale / 3600, "lost_h": lost * scale / 3600,
        "detected": len(detected), "detection_h": [d / 3600 for d in detection],
        "detection_predicted_h": guess.detect_wall_s / 3600,
        "evicted": len(evicted), "eviction_h": [e * scale / 3600 if e is not None else None for e in eviction],
        "eviction_predicted_h": guess.evict_s / 3600,
        "operator_h": [o * scale / 3600 if o is not None else None for o in operator],
        "drained_as": [x.get("reason_after", "") for x in record.stragglers if x["node"] in exposed],
        "lost_slowed_given_h": given_slow / 3600,
        "lost_predicted_h": guess.lost_h_evicted if scenario.evict else guess.lost_h_unattended,
        "lost_given_h": (given_slow + (len(evicted) + len(operated)) * guess.evict_s) / 3600,
        # restarts after an eviction or a person's requeue (wall time), each with its resume as measured
        "restarts": list(zip(restarted, eviction + operator)), "evict_s": guess.evict_s,
    }


def _progress_at(steps: list[dict], t: float, step_wall: float, since: float = 0.0) -> float | None:
    """The step reached at ``t`` by a run logging ``steps`` since ``since``: the last line, plus the steps
    of the time after it (lines come every log.interval steps)."""
    before = [r for r in steps if since <= r["time"] <= t]
    if not before:
        return None
    return before[-1]["step"] + (t - before[-1]["time"]) / step_wall


def model_result(model: ModelSim, record: RunRecord, calibration: Calibration) -> dict:
    scale, t0 = record.scenario.scale, record.t0
    step_wall = model.step_s / scale
    records = record.metrics.get(model.name, [])
    steps = [r for r in records if "loss" in r]
    starts = [r for r in records if r.get("event") == "start"]
    complete = next((r for r in records if r.get("event") == "complete" and r["time"] <= record.end), None)
    failures = [f for f in record.failures if f.get("model") == model.name and t0 <= f["time"] <= record.end]
    first = _progress_at(steps, t0, step_wall, since=max((s["time"] for s in starts if s["time"] <= t0), default=0))
    if first is None:  # no line yet: the first start
        start = max((s for s in starts if s["time"] <= t0), key=lambda s: s["time"])
        first = start["step"] + (t0 - start["time"]) / step_wall
    t_end = complete["time"] if complete else record.end
    slow = straggler_result(model, record, calibration, records, t_end)
    # a failure, an eviction or a person's requeue stopped the job; the last of them before its last start?
    last_start = max((s["time"] for s in starts if s["time"] <= t_end), default=t0)
    stopped = max([f["time"] for f in failures] + [at for at, _ in slow["restarts"]], default=-math.inf)
    if complete:
        last = complete["step"]
    elif last_start > stopped:  # training at the end
        last = _progress_at(steps, t_end, step_wall, since=last_start)
        if last is None:
            start = next(s for s in starts if s["time"] == last_start)
            last = start["step"] + (t_end - last_start) / step_wall
    else:  # waiting to restart: it will resume from its latest checkpoint
        last = record.final[model.name]["latest_step"]
    window = (t_end - t0) * scale
    productive = (last - first) * model.step_s
    resumes = []
    for failure in failures:
        later = [s["time"] for s in starts if s["time"] > failure["time"]]
        resumes.append((later[0] + step_wall - failure["time"]) * scale if later and later[0] <= record.end else None)
    share = _share(model, record)
    guess = predicted(model, record, calibration)
    days = window / DAY_S
    # the failures that did happen, each of its kind; one too near the end loses only the time left
    # "given resumes": the same with each failure's measured time to resume in place of the calibrated one
    # stragglers: the slowed time by the goodput model, and each eviction's (or a person's) restart, which
    # saved first: no rework; measured, one not resumed by the end lost the rest of the window
    lost_given = lost_resumed = slow["lost_slowed_given_h"] * 3600
    stops = [(at, None, resume) for at, resume in slow.pop("restarts")]  # wall seconds to resume
    stops += [(f["time"], f, resume / scale if resume is not None else None) for f, resume in zip(failures, resumes)]
    down_until = -math.inf  # the restart under way: a failure meanwhile shares it, its measured resume counted once
    for at, f, resume in sorted(stops, key=lambda stop: stop[0]):
        if f is None:
            left = (t_end - at) * scale
            lost_given += min(slow["evict_s"], left)
            measured = resume * scale if resume is not None else left
        else:
            g = predicted(model, record, calibration, f["kind"])
            left = g.rework_s + (t_end - f["time"]) * scale
            lost_given += min(g.lost_per_failure_s, left)
            # not resumed by the end: down for the rest of the window, as measured (not the model's guess)
            measured = min(g.rework_s + resume * scale, left) if resume is not None else left
        if at >= down_until:
            lost_resumed += measured
            down_until = at + resume if resume is not None else math.inf
    ettr_given = max(0.0, 1 - lost_given / window) if window else 0.0
    ettr_resumed = max(0.0, 1 - lost_resumed / window) if window else 0.0
    final = record.final.get(model.name, {})
    end = "complete" if complete else (
        "training" if final.get("job_state") == "RUNNING" and last_start > stopped
        else f"{final.get('job_state', '?').lower()} ({final.get('reason', '')})")
    gave_up = [r for r in records if r.get("event") == "recovery" and r.get("action") == "stop"]
    return {
        "model": model.name, "nodes": model.nodes, "gpus": model.gpus, "window_days": days,
        "checkpoint_every_steps": model.every, "checkpoint_interval_h": model.every * model.step_s / 3600,
        "failures": len(failures), "failure_kinds": [f["kind"] for f in failures],
        "expected_failures": guess.failures_per_day * days,
        "ettr": productive / window if window else 0.0, "ettr_predicted": guess.ettr, "ettr_given_failures": ettr_given,
        "ettr_given_resumes": ettr_resumed,
        "resume_h": [r / 3600 if r is not None else None for r in resumes],
        "resume_predicted_h": (guess.recovery_s + guess.replacement_wait_s) / 3600, "recovery_h": guess.recovery_s / 3600,
        "restart_wall_s": {kind: calibration.recovery(model.name, kind) for kind in KINDS},
        "measured_kinds": sorted(calibration.recovery_wall.get(model.name, {})),
        "lost_gpu_h": (window - productive) / 3600 * model.gpus,
        "lost_gpu_h_predicted": (1 - guess.ettr) * window / 3600 * model.gpus,
        "lost_gpu_h_given_failures": (1 - ettr_given) * window / 3600 * model.gpus,
        "max_nodes": share["max_nodes"], "starved_h": share["starved_wall"] * scale / 3600,
        "held_h": share["held_wall"] * scale / 3600, "end": end, "gave_up": bool(gave_up),
        "kept_share": share["max_nodes"] <= model.nodes and share["starved_wall"] <= SCHEDULER_CYCLE_WALL,
        "stuck": bool(gave_up) or not (complete or final.get("job_state") in ("RUNNING", "PENDING", "CONFIGURING",
                                                                              "COMPLETING", "REQUEUED")),
        "plan_ettr": model.plan.ettr, "stragglers": slow,
    }


def _share(model: ModelSim, record: RunRecord) -> dict:
    """The most nodes the model held, and its longest wait with enough nodes idle (hold aside), wall s."""
    max_nodes, starved, longest, held, previous = 0, 0.0, 0.0, 0.0, None
    for sample in record.timeline:
        entry = sample["models"].get(model.name, {"running": 0, "pending": ""})
        max_nodes = max(max_nodes, entry["running"])
        dt = sample["time"] - previous if previous is not None else 0.0
        previous = sample["time"]
        waiting = not entry["running"] and entry["pending"]
        if waiting and entry["pending"] == HOLD_REASON:
            held += dt
        if waiting and entry["pending"] != HOLD_REASON and sample["idle"] >= model.nodes:
            starved += dt
            longest = max(longest, starved)
        else:
            starved = 0.0
    return {"max_nodes": max_nodes, "starved_wall": longest, "held_wall": held}


def results(record: RunRecord, calibration: Calibration) -> list[dict]:
    return [model_result(model, record, calibration) for model in record.models]


def within(measured: float, expected: float, tolerance: float = TOLERANCE) -> bool:
    return abs(measured - expected) <= tolerance * abs(expected)


def _hours(values: list, digits: int = 1) -> str:
    done = [v for v in values if v is not None]
    text = "/".join(f"{v:.{digits}f}" for v in done) or "-"
    return text + (" +down" if len(done) < len(values) else "")


def format_table(rows: list[dict], record: RunRecord, calibration: Calibration) -> str:
    s = record.scenario
    lines = [
        f"{s.spares} spare(s): {len(rows)} models on {sum(r['nodes'] for r in rows) + s.spares} nodes, "
        f"{s.days:g} simulated days in {s.wall(s.days * DAY_S):.0f} s (x{s.scale:g}), {s.failures_per_1000_node_days:g} failures per "
        f"1,000 node-days, seed {s.seed}; effective replacement {calibration.replacement * s.scale / 3600:.2f} h "
        f"({calibration.replacement:.1f} s here; {s.replacement_min:g} min scaled + the local boot), recovery per model below "
        f"(plan {record.models[0].plan.recovery_s / 60:g} min)",
        "",
        "| model | nodes | ckpt h | recovery h (s here: GPU/node/first node) | failures (expected) | ETTR sim | ETTR predicted | "
        "given failures | resume h (predicted) | GPU-h lost sim | predicted | given failures | max nodes | "
        "waited idle h | end |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['nodes']} | {r['checkpoint_interval_h']:.1f} | {r['recovery_h']:.1f} "
            f"({'/'.join(format(r['restart_wall_s'][k], '.0f') for k in KINDS)}) | {r['failures']} "
            f"({r['expected_failures']:.2f}) | {r['ettr']:.1%} | {r['ettr_predicted']:.1%} | "
            f"{r['ettr_given_failures']:.1%} | {_hours(r['resume_h'])} ({r['resume_predicted_h']:.1f}) | "
            f"{r['lost_gpu_h']:,.0f} | {r['lost_gpu_h_predicted']:,.0f} | {r['lost_gpu_h_given_failures']:,.0f} | "
            f"{r['max_nodes']}/{r['nodes']} | {r['starved_h']:.2f} | {r['end']} |")
    mode = ("evicted by the trainer" if s.evict
            else f"unattended: drained and requeued by a person after {s.straggler_unattended_h:g} h")
    lines += ["", f"Stragglers: {s.stragglers_per_1000_node_days:g} per 1,000 node-days, each "
              f"{s.straggler_slowdown:.0%} slower, {mode}; "
              f"{sum('skipped' not in x for x in record.stragglers)} slow node(s), "
              f"{sum(bool(x.get('model')) for x in record.stragglers)} in a job when they turned slow",
              "",
              "| model | slow nodes met (expected) | slowed h | lost while slowed h | given stragglers | "
              "detection h (predicted) | evicted | eviction h (predicted) | requeued by a person, resumed h | "
              "lost h with restarts: given stragglers | predicted, expected stragglers |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g = r["stragglers"]
        lines.append(
            f"| {r['model']} | {g['met']} ({g['expected']:.2f}) | {g['slowed_h']:.2f} | {g['lost_h']:.2f} | "
            f"{g['lost_slowed_given_h']:.2f} | {_hours(g['detection_h'], 2)} ({g['detection_predicted_h']:.2f}) | "
            f"{g['evicted']} | {_hours(g['eviction_h'])} ({g['eviction_predicted_h']:.1f}) | "
            f"{_hours(g['operator_h'])} | "
            f"{g['lost_given_h']:.2f} | {g['lost_predicted_h']:.2f} |")
    return "\n".join(lines)
