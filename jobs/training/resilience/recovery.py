"""What the batch script does when training ends: finish, relaunch, requeue, or stop for a human.

    python -m training.resilience.recovery start  LOG_DIR [--relaunch K --nodes LIST]  # each start of the training step
    python -m training.resilience.recovery decide LOG_DIR --exit RC --status STATUS [--reason-file FILE]
                                                  [--nodes-up N --train-nodes M] [--ended-at EPOCH]
                                                  [--min-nodes K --gpus-per-node G -- TRAINER ARGUMENTS]
    python -m training.resilience.recovery grow   LOG_DIR --nodes N --full M   # a planned stop to train on M again

``decide`` prints one word for jobs/train.sh — ``complete``, ``relaunch``, ``requeue``, ``user-error`` or ``give-up`` —
or ``fewer NODES MICRO_BATCH``, and explains itself on stderr. Every (re)start and every decision is an event line in ``LOG_DIR/metrics.jsonl``
(``{"event": "launch" | "recovery", ...}``), next to the trainer's own lines, so one file tells
the story of a run: when it restarted, why, and on which nodes.

Classification of an ending:
  * exit 0, STATUS complete                     -> complete (back up)
  * exit 0, STATUS stopped (time limit, SIGUSR1) -> requeue; planned, not counted against the budget
  * the trainer reported a user error (exit 2: bad config, data or checkpoint; it writes the
    message to ``--reason-file``)               -> user-error: the job exits 2, no requeue (it
                                                   would fail the same way)
  * anything else (a rank killed, a NCCL/gloo error, the progress watchdog, a lost node)
                                                -> relaunch: train.sh starts the training step again in
    the same allocation (same job id, no requeue, no wait for nodes) on ``--train-nodes`` of its
    ``--nodes-up`` healthy nodes, resuming from ``latest``; at most ``MAX_RELAUNCHES`` (default 3)
    times per allocation (a requeue brings new nodes and a fresh count). With the relaunches
    spent, or fewer healthy nodes than training needs (no spare left for a lost one) -> requeue, unless
    the run may go on with fewer nodes (``--min-nodes``, models.<m>.min_nodes): then ``fewer``, the largest
    number of the healthy nodes, at least ``--min-nodes``, on which the global batch stays the same
    (``fewer_nodes``: the micro-batch lowered where that is what divides it; more micro-batches each step),
    resuming from the snapshots resharded to the smaller world. A global batch that divides on none of them
    is refused with its reason, and the job requeues as before. A failure while on fewer nodes is decided the
    same way against the nodes it trains on (``--train-nodes``): fewer still, down to ``--min-nodes``, else a
    requeue. The batch script grows back with a planned stop (the state kept in the nodes' memory) and requeue
    once Slurm has nodes for the whole allocation again (``grow``).
    Either is one recovery of the retry budget: at most ``MAX_RECOVERIES`` (default 5) of this job
    within ``RECOVERY_WINDOW_HOURS`` (default 24); then give-up with a message, so a crash loop ends.
The budget belongs to one job id (one run): a new submission, after a human looked, starts afresh.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

USER_ERROR = 2  # the trainer's exit code for bad input (config, data, checkpoint of another model)


def fewer_nodes(cfg, nodes_up: int, gpus_per_node: int, min_nodes: int) -> tuple[int, int, str]:
    """(nodes, micro-batch, '') for a run of training config ``cfg`` going on with fewer nodes: the most of
    ``nodes_up``, at least ``min_nodes``, on which its global batch is kept (tensor-parallel and HSDP groups
    whole, the batch a whole number of micro-batches per data-parallel rank), with the largest micro-batch
    up to its own that allows it (a smaller one never needs more memory); (0, 0, why) if there is none."""
    from training.config import ConfigError  # here: the other commands need nothing but the standard library

    for nodes in range(nodes_up, max(min_nodes, 1) - 1, -1):
        for micro in range(cfg.train.micro_batch_size, 0, -1):
            trial = cfg.model_copy(update={"train": cfg.train.model_copy(update={"micro_batch_size": micro})})
            try:
                trial.grad_accum_steps(nodes * gpus_per_node)
            except ConfigError:
                continue
            return nodes, micro, ""
    return 0, 0, (f"the global batch {cfg.train.global_batch_size} divides on none of {max(min_nodes, 1)} to {nodes_up} "
                  f"nodes of {gpus_per_node} GPUs (train.tensor_parallel {cfg.train.tensor_parallel}, micro-batch "
                  f"{cfg.train.micro_batch_size} or less)")


def _append(log_dir: Path, record: dict) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def _job() -> dict:
    return {"job": os.environ.get("SLURM_JOB_ID", ""), "restart_count": int(os.environ.get("SLURM_RESTART_COUNT", 0) or 0),
            "nodes": os.environ.get("SLURM_JOB_NODELIST", socket.gethostname())}


def recoveries(log_dir: Path, job: str, since: float) -> list[dict]:
    """This job's earlier recoveries after a failure (relaunches and requeues) since ``since`` (epoch seconds)."""
    path = log_dir / "metrics.jsonl"
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if (record.get("event") == "recovery" and record.get("action") in ("relaunch", "requeue") and not record.get("planned")
                and record.get("job") == job and record.get("time", 0) >= since):
            found.append(record)
    return found


LAUNCH_FAILURES = {126: "command not executable", 127: "command not found"}


def decide(log_dir: Path, *, exit_code: int, status: str, reason: str, max_recoveries: int,
           window_hours: float, max_relaunches: int = 0, nodes_up: int = 0, train_nodes: int = 0,
           ended_at: float | None = None, now: float | None = None, fewer=None) -> tuple[str, str]:
    """(action, message) for a training step that ended with ``exit_code`` and ``status`` (at ``ended_at``, epoch
    seconds); ``nodes_up`` of the allocation's nodes are healthy and ``train_nodes`` of them would train a
    relaunched step (0: no relaunch). ``fewer(nodes_up)``: ``fewer_nodes`` for this run, where it may go on
    with fewer nodes than ``train_nodes`` (None: it may not); the action is then ``fewer NODES MICRO_BATCH``."""
    now = time.time() if now is None else now
    job = _job()
    record = {"event": "recovery", "time": now, **job, "exit": exit_code, "status": status,
              **({"step_ended": ended_at} if ended_at else {})}
    if exit_code == 0 and status == "complete":
        return "complete", "training complete"
    if exit_code == 0 and status == "stopped":
        message = "stopped early with a checkpoint saved (time limit or signal): requeueing"
        _append(log_dir, {**record, "cause": "stop request", "action": "requeue", "planned": True})
        return "requeue", message
    if exit_code == 0:
        cause = "training exited 0 without writing STATUS"
    elif reason.startswith("user:"):
        message = (f"training stopped on a user error: {reason.removeprefix('user:').strip()} "
                   f"— fix it and submit again (not requeued: it would fail the same way)")
        _append(log_dir, {**record, "cause": reason, "action": "stop"})
        return "user-error", message
    elif exit_code in LAUNCH_FAILURES and not reason:
        # The shell's own codes: the launcher never ran, on any node a requeue would bring back.
        cause = f"the launcher could not start (srun exit {exit_code}: {LAUNCH_FAILURES[exit_code]})"
        message = (f"{cause} — the jobs' environment on the nodes lacks it (JOBS_VENV, PATH); fix it and "
                   f"submit again (not requeued: it would fail the same way)")
        _append(log_dir, {**record, "cause": cause, "action": "stop"})
        return "user-error", message
    else:
        cause = reason or f"a training process failed (srun exit {exit_code})"
    earlier = recoveries(log_dir, job["job"], now - window_hours * 3600)
    if len(earlier) >= max_recoveries:
        message = (f"retry budget spent: {len(earlier)} recoveries of job {job['job']} in the last "
                   f"{window_hours:g} h (MAX_RECOVERIES={max_recoveries}); last cause: {cause}. Not requeueing: "
                   f"look at the logs (metrics.jsonl events, hang_*.txt), drain or fix what fails, then resubmit "
                   f"to resume from the latest checkpoint")
        _append(log_dir, {**record, "cause": cause, "action": "stop", "budget_spent": True})
        return "give-up", message
    n = len(earlier) + 1
    relaunched = [r for r in earlier if r["action"] == "relaunch" and r.get("restart_count") == job["restart_count"]]
    if not max_relaunches or not train_nodes:
        why_not = ""  # in-job relaunch off (MAX_RELAUNCHES=0), or a caller that cannot relaunch
    elif len(relaunched) >= max_relaunches:
        why_not = f"in-job relaunches spent ({len(relaunched)} of MAX_RELAUNCHES={max_relaunches})"
    elif nodes_up < train_nodes:
        why_not = f"{nodes_up} healthy nodes in the allocation, training needs {train_nodes}"
        nodes, micro, refused = fewer(nodes_up) if fewer and nodes_up else (0, 0, "")
        if refused:
            why_not += f"; not going on with fewer: {refused}"
        elif nodes:
            k = len(relaunched) + 1
            message = (f"recovery {n} of {max_recoveries} in {window_hours:g} h: {cause}; no spare node free: going on "
                       f"with {nodes} of the {train_nodes} nodes in the same job (relaunch {k} of {max_relaunches}), the "
                       f"global batch kept (micro-batch {micro}), from the snapshots resharded; all {train_nodes} again "
                       f"once Slurm has the nodes")
            _append(log_dir, {**record, "cause": cause, "action": "relaunch", "recovery": n, "relaunch": k,
                              "nodes_up": nodes_up, "train_nodes": nodes, "fewer_than": train_nodes,
                              "micro_batch_size": micro})
            return f"fewer {nodes} {micro}", message
    else:
        k = len(relaunched) + 1
        message = (f"recovery {n} of {max_recoveries} in {window_hours:g} h: {cause}; relaunching in the same job "
                   f"(relaunch {k} of {max_relaunches}) on {train_nodes} of {nodes_up} healthy nodes, from latest")
        _append(log_dir, {**record, "cause": cause, "action": "relaunch", "recovery": n, "relaunch": k,
                          "nodes_up": nodes_up, "train_nodes": train_nodes})
        return "relaunch", message
    message = (f"recovery {n} of {max_recoveries} in {window_hours:g} h: {cause}; {why_not + ': ' if why_not else ''}"
               f"requeueing to resume from latest")
    _append(log_dir, {**record, "cause": cause, "action": "requeue", "recovery": n,
                      **({"not_relaunched": why_not} if why_not else {})})
    return "requeue", message


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="log this (re)start of the job, or a relaunch within it")
    start.add_argument("log_dir", type=Path)
    start.add_argument("--relaunch", type=int, default=0, help="the in-job relaunch this start is (0: the job's own start)")
    start.add_argument("--nodes", help="the nodes the step trains on (default: the allocation's)")
    end = sub.add_parser("decide", help="classify how training ended; print complete | relaunch | requeue | user-error | give-up")
    end.add_argument("log_dir", type=Path)
    end.add_argument("--exit", type=int, required=True, dest="exit_code", help="srun's exit code")
    end.add_argument("--status", default="none", help="the trainer's STATUS file content")
    end.add_argument("--reason-file", type=Path, help="where the trainer wrote why it failed (user:/hang:)")
    end.add_argument("--nodes-up", type=int, default=0, help="the allocation's healthy nodes (train.sh: up, not suspect)")
    end.add_argument("--train-nodes", type=int, default=0, help="how many of them a relaunched step trains on (0: none)")
    end.add_argument("--ended-at", type=float, help="when the training step ended (epoch seconds), for the event")
    end.add_argument("--min-nodes", type=int, default=0,
                     help="go on with as few as this many nodes when no spare is free (0: never; models.<m>.min_nodes)")
    end.add_argument("--gpus-per-node", type=int, default=1, help="workers per node (with --min-nodes); after "
                     "--: the trainer's arguments (--config FILE, --model M, overrides), whose config says on how few "
                     "nodes the global batch is kept")
    grow = sub.add_parser("grow", help="log a planned stop that brings a run on fewer nodes back to all of them")
    grow.add_argument("log_dir", type=Path)
    grow.add_argument("--nodes", type=int, required=True, help="the nodes it trains on now")
    grow.add_argument("--full", type=int, required=True, help="the nodes it trains on again after the requeue")
    argv = sys.argv[1:] if argv is None else argv
    trainer_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)

    if args.command == "start":
        launch = {"event": "launch", "time": time.time(), **_job(), "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME", "")}
        if args.nodes:
            launch["nodes"] = args.nodes
        if args.relaunch:
            launch["relaunch"] = args.relaunch
        _append(args.log_dir, launch)
        return 0
    if args.command == "grow":
        _append(args.log_dir, {"event": "recovery", "time": time.time(), **_job(), "cause": "nodes free for the whole "
                               "allocation again", "action": "grow", "planned": True, "train_nodes": args.nodes,
                               "full": args.full})
        return 0
    try:
        max_recoveries = int(os.environ.get("MAX_RECOVERIES", 5))
        max_relaunches = int(os.environ.get("MAX_RELAUNCHES", 3))
        window_hours = float(os.environ.get("RECOVERY_WINDOW_HOURS", 24))
    except ValueError as exc:
        print(f"error: MAX_RECOVERIES / MAX_RELAUNCHES / RECOVERY_WINDOW_HOURS must be numbers ({exc}) — fix the job's environment",
              file=sys.stderr)
        return 2
    reason = ""
    if args.reason_file and args.reason_file.exists():
        reason = args.reason_file.read_text().strip()
    fewer = None
    if args.min_nodes:
        def fewer(up: int) -> tuple[int, int, str]:
            try:
                cfg = trainer_config(trainer_args)
            except Exception as exc:  # noqa: BLE001  (a config that does not load: the trainer says so; wait instead)
                return 0, 0, f"the training config does not load here ({exc})"
            return fewer_nodes(cfg, up, args.gpus_per_node, args.min_nodes)
    action, message = decide(args.log_dir, exit_code=args.exit_code, status=args.status, reason=reason,
                             max_recoveries=max_recoveries, window_hours=window_hours, max_relaunches=max_relaunches,
                             nodes_up=args.nodes_up, train_nodes=args.train_nodes, ended_at=args.ended_at, fewer=fewer)
    print(message, file=sys.stderr)
    print(action)
    return 0


def trainer_config(argv: list[str]):
    """The training config the trainer builds from these arguments (its --config, --model and overrides)."""
    from training.config import load_config

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config")
    parser.add_argument("--model", action="append")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args(argv)
    return load_config(args.config, args.overrides, model=args.model[0] if args.model else None)


if __name__ == "__main__":
    sys.exit(main())
