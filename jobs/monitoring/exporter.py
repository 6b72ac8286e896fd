"""The head node's exporter: each model's training, Slurm and the file systems as Prometheus metrics.

    python -m monitoring.exporter --textfile-dir /var/lib/prometheus/node-exporter     # a round every 30 s
    python -m monitoring.exporter --textfile-dir /tmp/llm --once                      # one round, by hand

Each round writes ``<textfile dir>/llm.prom`` atomically (a temporary file beside it, renamed over
it), which the node exporter's textfile collector serves. docs/monitoring.md is the contract: the
metrics, their labels and meaning. The sources are what outlives a job:

- the jobs bundle's ``models/cluster.json`` (training/cluster.py): the models, the deadline, the
  stall floor, the spare nodes; without one, the models are the folders in ``--logs``;
- ``<logs>/<model>/metrics.jsonl``: the trainer's records and training/resilience/recovery.py's events, read
  incrementally (each round reads only what was appended since the last; of the records only the
  last few are parsed), so a long log costs little; the config its newest run logged
  (``<model>_<job>.err``, read the same way), else the job's ``models/<model>.yaml``;
- ``<checkpoints>/<model>/latest`` and ``STATUS``; the size of each named checkpoint, measured once;
- Slurm's commands (monitoring/slurm.py), each with a timeout;
- statvfs of each file system.

A source that fails leaves the rest as it is: its ``*_up`` metric goes to 0 (Slurm's controller,
the accounting database), what depends on it is left out, and its error goes to stderr once, again
only when it changes. Torch-free: it runs in the jobs environment on the head node.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import time
from collections import Counter, deque
from pathlib import Path

from atomic_file import write_atomic
from cli import ArgumentParser, fail
from monitoring import filesystems, slurm
from training.cluster import Cluster, default_jobs_dir, load_cluster
from training.status import config_line, latest_checkpoint, planned_config, run_logs, run_status

TEXTFILE = "llm.prom"
BASELINE = 20  # finite losses before the last one whose median is the loss baseline
RECENT = 5  # intervals whose median step time is the step time
PENDING = ("PENDING", "REQUEUED", "CONFIGURING")  # on its way (back) to running
CHECKPOINT = re.compile(r"step_(\d+)")

# name: (type, help), in docs/monitoring.md's order.
METRICS = {
    "llm_training_step": ("gauge", "Last logged optimizer step."),
    "llm_training_total_steps": ("gauge", "Steps the run is configured for."),
    "llm_training_loss": ("gauge", "Last logged training loss (may be NaN or +Inf)."),
    "llm_training_loss_baseline": ("gauge", "Median of the (up to) 20 finite losses logged before the last one."),
    "llm_training_val_loss": ("gauge", "Last validation loss."),
    "llm_training_tokens_per_second": ("gauge", "Tokens/s of the last interval, all ranks."),
    "llm_training_mfu_ratio": ("gauge", "Model FLOPs utilisation of the last interval, 0..1 (GPU only)."),
    "llm_training_step_seconds": ("gauge", "Median step time of the last 5 intervals."),
    "llm_training_last_step_timestamp_seconds": ("gauge", "Epoch time of the last logged step (0: none)."),
    "llm_training_last_progress_timestamp_seconds": ("gauge", "max(last logged step, last job (re)start)."),
    "llm_training_stall_floor_seconds": ("gauge", "The shortest stall that alerts (settings alerts.stall_floor_s)."),
    "llm_training_last_checkpoint_timestamp_seconds": ("gauge", "Mtime of the checkpoint latest names (0: none)."),
    "llm_training_last_checkpoint_step": ("gauge", "Step of the checkpoint latest names (0: none)."),
    "llm_training_checkpoint_interval_seconds": ("gauge", "Expected time between checkpoint saves."),
    "llm_training_recoveries_total": ("counter", "Unplanned recoveries (relaunches in the job and requeues after a failure)."),
    "llm_training_last_failure_timestamp_seconds": ("gauge", "Time of the last unplanned failure (0: none)."),
    "llm_training_job_running": ("gauge", "1 if a Slurm job named after the model is RUNNING."),
    "llm_training_job_pending": ("gauge", "1 if one is PENDING, REQUEUED or CONFIGURING."),
    "llm_training_started": ("gauge", "1 once the model's metrics.jsonl has a launch or start."),
    "llm_training_complete": ("gauge", "1 when the trainer wrote STATUS complete."),
    "llm_training_failed": ("gauge", "1 when started, not complete, and no job running or pending."),
    "llm_training_eta_timestamp_seconds": ("gauge", "now + (total - step) x step time."),
    "llm_training_deadline_timestamp_seconds": ("gauge", "First launch + the plan's deadline_days."),
    "llm_training_slowest_rank_excess_ratio": ("gauge", "Last interval: the slowest node's worst figure (gpu, host, storage, network) over the others' median."),
    "llm_training_straggler": ("gauge", "A reported straggler still slowest and over its margin: its excess (labels rank, node)."),
    "llm_slurmctld_up": ("gauge", "1 if scontrol ping says the controller is UP."),
    "llm_slurmdbd_up": ("gauge", "1 if sacctmgr show cluster answers."),
    "llm_slurm_nodes": ("gauge", "Nodes per base state."),
    "llm_slurm_node_unavailable": ("gauge", "1 per node that is down, drained, draining, failing or not responding."),
    "llm_slurm_spare_nodes": ("gauge", "Nodes of the reservation kept as spares."),
    "llm_slurm_jobs": ("gauge", "Jobs by account, QOS, state and pending reason."),
    "llm_slurm_job_restarts": ("gauge", "Slurm's Restarts of each job still known to Slurm."),
    "llm_exporter_last_run_timestamp_seconds": ("gauge", "When the exporter last wrote its file."),
    "llm_fsx_size_bytes": ("gauge", "Size of the file system (statvfs)."),
    "llm_fsx_free_bytes": ("gauge", "Bytes available to users."),
    "llm_fsx_next_write_bytes": ("gauge", "Bytes the running models' next checkpoints will write there."),
}


class Tail:
    """The complete lines appended to a file since the last read. A line still being written waits
    for the next read; a file replaced, truncated or removed starts over."""

    def __init__(self, path: Path):
        self.path, self.offset, self.inode = path, 0, None

    def read(self) -> tuple[list[bytes], bool]:
        """(the new lines, whether what was read before no longer counts)."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                again = st.st_ino != self.inode or st.st_size < self.offset
                if again:
                    self.inode, self.offset = st.st_ino, 0
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            again, self.inode, self.offset = self.inode is not None, None, 0
            return [], again
        end = data.rfind(b"\n") + 1
        self.offset += end
        return data[:end].splitlines(), again


def _loads(line: bytes | None) -> dict | None:
    try:
        return json.loads(line) if line else None
    except ValueError:
        return None  # cut short by a crash


class RunLog:
    """What a model's metrics.jsonl says so far. Events are parsed as they come (they are few);
    of the training records only those the metrics need, from the end."""

    def __init__(self, path: Path):
        self.tail = Tail(path)
        self._start_over()

    def _start_over(self) -> None:
        self.started = False
        self.first_start: float | None = None  # the first launch (or start): the deadline counts from it
        self.last_start = 0.0
        self.recoveries, self.last_failure = 0, 0.0
        self.ending: str | None = None  # why the newest run stopped for good, from its recovery event
        self.recent: deque[bytes] = deque(maxlen=RECENT)  # training records, the newest last
        self.finite: deque[float] = deque(maxlen=BASELINE)  # finite losses logged before the newest
        self.eval: bytes | None = None
        self.straggler: dict | None = None  # the newest straggler event of the current run

    def update(self) -> None:
        lines, again = self.tail.read()
        if again:
            self._start_over()
        train = []
        for line in lines:
            if line.startswith(b'{"event"'):
                self._event(_loads(line))
            elif b'"val_loss"' in line:
                self.eval = line
            elif b'"loss"' in line:
                train.append(line)
        if train:
            before, found = [*([self.recent[-1]] if self.recent else []), *train[:-1]], []
            for line in reversed(before):
                if len(found) == BASELINE:
                    break
                record = _loads(line)
                if record and math.isfinite(record.get("loss", math.nan)):
                    found.append(record["loss"])
            self.finite.extend(reversed(found))
            self.recent.extend(train[-RECENT:])

    def _event(self, record: dict | None) -> None:
        if not record:
            return
        kind, when = record.get("event"), record.get("time")
        if kind == "straggler":
            self.straggler = record
        if kind in ("launch", "start"):
            self.started, self.ending, self.straggler = True, None, None
            if when is not None:
                self.first_start = when if self.first_start is None else min(self.first_start, when)
                self.last_start = max(self.last_start, when)
        elif kind == "recovery":
            action = record.get("action")
            if not record.get("planned"):
                self.last_failure = max(self.last_failure, when or 0.0)
                if action in ("requeue", "relaunch"):  # in the job or by a requeue: either is a recovery
                    self.recoveries += 1
            self.ending = None
            if action == "stop":
                self.ending = ("retry budget spent" if record.get("budget_spent") else
                               "user error" if str(record.get("cause", "")).startswith("user:") else
                               "ended without finishing")

    def records(self) -> list[dict]:
        """The last (up to RECENT) training records, oldest first."""
        return [r for r in map(_loads, self.recent) if r]


class LoggedConfig:
    """The newest ``config {...}`` line of one Slurm output file, read incrementally."""

    def __init__(self, path: Path):
        self.tail, self.config = Tail(path), None

    def update(self) -> dict | None:
        lines, again = self.tail.read()
        if again:
            self.config = None
        for line in reversed(lines):
            if b" config {" in line and (config := config_line(line.decode(errors="replace"))) is not None:
                self.config = config
                break
        return self.config


class Samples(list):
    def add(self, metric: str, value: float, /, **labels: str) -> None:
        self.append((metric, labels, value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() else repr(value)


def render(samples: list[tuple[str, dict, float]]) -> str:
    """Prometheus text format: each family once, with its HELP and TYPE, in METRICS order."""
    families: dict[str, list[str]] = {}
    for name, labels, value in samples:
        text = ",".join(f'{key}="{_escape(str(v))}"' for key, v in labels.items())
        families.setdefault(name, []).append(f"{name}{{{text}}} {_number(value)}" if text else
                                             f"{name} {_number(value)}")
    lines = []
    for name, (kind, help_text) in METRICS.items():
        if name in families:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *families[name]]
    return "\n".join(lines) + "\n"


class Exporter:
    """One round at a time; keeps what it read (log offsets, checkpoint sizes) between rounds."""

    def __init__(self, *, jobs_dir: Path, logs: Path, checkpoints: Path, mounts: list[str],
                 timeout: float = slurm.TIMEOUT_S):
        self.jobs_dir, self.logs, self.checkpoints, self.mounts = jobs_dir, logs, checkpoints, mounts
        self.timeout = timeout
        self.runs: dict[str, RunLog] = {}
        self.logged: dict[Path, LoggedConfig] = {}
        self.sizes: dict[Path, int] = {}  # checkpoint folder -> bytes: a named checkpoint no longer changes
        self.errors: dict[str, str] = {}  # source -> its last error, reported once

    def _report(self, source: str, error: str | None) -> None:
        """An error on stderr when it first happens or changes, and a line when the source is back."""
        if error is None:
            if self.errors.pop(source, None) is not None:
                print(f"{source}: ok again", file=sys.stderr, flush=True)
        elif self.errors.get(source) != error:
            self.errors[source] = error
            print(f"{source}: {error}", file=sys.stderr, flush=True)

    def _try(self, source: str, fn, *args):
        """``fn(*args)``, or None when it fails. Any failure: the exporter must outlive each of its sources."""
        try:
            result = fn(*args)
        except Exception as exc:
            self._report(source, str(exc) or type(exc).__name__)
            return None
        self._report(source, None)
        return result

    def collect(self, now: float | None = None) -> Samples:
        now = time.time() if now is None else now
        samples = Samples()
        cluster = self._try("cluster file", load_cluster, self.jobs_dir)
        models = list(cluster.models) if cluster else sorted(p.parent.name for p in self.logs.glob("*/metrics.jsonl"))
        jobs = self._slurm(samples, cluster)
        sizes, writing = {}, 0
        for name in models:
            writes = self._try(name, self._model, samples, name, cluster, jobs, now)
            for folder in writes or ():
                sizes[folder] = self.sizes.get(folder) or self._try(f"{name} checkpoint size",
                                                                    filesystems.folder_bytes, folder) or 0
                writing += sizes[folder]
        self.sizes = sizes
        holder = filesystems.holding(self.mounts, self.checkpoints)
        for mount in self.mounts:
            usage = self._try(f"file system {mount}", filesystems.usage, mount)
            if usage:
                samples.add("llm_fsx_size_bytes", usage.size, filesystem=mount)
                samples.add("llm_fsx_free_bytes", usage.free, filesystem=mount)
                samples.add("llm_fsx_next_write_bytes", writing if mount == holder else 0, filesystem=mount)
        samples.add("llm_exporter_last_run_timestamp_seconds", now)
        return samples

    def _slurm(self, samples: Samples, cluster: Cluster | None) -> list[slurm.Job] | None:
        """Slurm's metrics; its jobs, None when unknown."""
        up = self._try("scontrol ping", slurm.controller_up, self.timeout) is not None
        samples.add("llm_slurmctld_up", int(up))
        samples.add("llm_slurmdbd_up", int(self._try("sacctmgr", slurm.database_up, self.timeout) is not None))
        samples.add("llm_slurm_spare_nodes", cluster.spare_nodes if cluster else 0)
        if not up:  # the rest would only wait for their timeouts
            return None
        nodes = self._try("sinfo", slurm.nodes, self.timeout)
        if nodes is not None:
            for state, count in sorted(Counter(n.state for n in nodes).items()):
                samples.add("llm_slurm_nodes", count, state=state)
            for n in nodes:
                if n.unavailable:
                    samples.add("llm_slurm_node_unavailable", 1, node=n.name, state=n.unavailable, reason=n.reason)
        jobs = self._try("squeue", slurm.jobs, self.timeout)
        if jobs is not None:
            for (account, qos, state, reason), count in sorted(Counter(
                    (j.account, j.qos, j.state, j.reason) for j in jobs).items()):
                samples.add("llm_slurm_jobs", count, account=account, qos=qos, state=state, reason=reason)
        for job_id, name, count in self._try("scontrol show job", slurm.restarts, self.timeout) or ():
            samples.add("llm_slurm_job_restarts", count, name=name, job_id=job_id)
        return jobs

    def _config(self, name: str) -> dict | None:
        """The config the model's newest run logged, else the one its job will run."""
        for path in run_logs(self.logs / name, name):
            if (config := self.logged.setdefault(path, LoggedConfig(path)).update()) is not None:
                return config
        return planned_config(self.jobs_dir / "models", name)

    def _model(self, samples: Samples, name: str, cluster: Cluster | None, jobs: list[slurm.Job] | None,
               now: float) -> list[Path]:
        """The model's metrics; the checkpoint folder its next save will be as big as, if it runs."""
        run = self.runs.setdefault(name, RunLog(self.logs / name / "metrics.jsonl"))
        self._try(f"{name} metrics.jsonl", run.update)
        config = self._try(f"{name} config", self._config, name) or {}
        records = run.records()
        last = records[-1] if records else {}
        step, total = last.get("step", 0), config.get("train", {}).get("steps", 0)
        times = [r["step_time_s"] for r in records if "step_time_s" in r]
        step_s = statistics.median(times) if times else None
        checkpoints = self.checkpoints / name
        latest = latest_checkpoint(checkpoints)
        complete = run_status(checkpoints) == "complete"
        add = samples.add

        add("llm_training_step", step, model=name)
        add("llm_training_total_steps", total, model=name)
        if "loss" in last:
            add("llm_training_loss", last["loss"], model=name)
        if run.finite:
            add("llm_training_loss_baseline", statistics.median(run.finite), model=name)
        if evaluation := _loads(run.eval):
            add("llm_training_val_loss", evaluation["val_loss"], model=name)
        if "tokens_per_s" in last:
            add("llm_training_tokens_per_second", last["tokens_per_s"], model=name)
        if "mfu_pct" in last:
            add("llm_training_mfu_ratio", last["mfu_pct"] / 100, model=name)
        if step_s is not None:
            add("llm_training_step_seconds", step_s, model=name)
        if "slowest_excess_pct" in last:
            add("llm_training_slowest_rank_excess_ratio", last["slowest_excess_pct"] / 100, model=name)
            # The trainer reports a straggler node once, after train.straggler_intervals slow intervals of its
            # window; it stays one while the same node (its first rank) is still the slowest and over the margin.
            if (s := run.straggler) and last.get("slowest_rank") == s.get("rank") and \
                    last["slowest_excess_pct"] > s.get("margin_pct", 0):
                add("llm_training_straggler", last["slowest_excess_pct"] / 100, model=name,
                    rank=str(s["rank"]), node=str(s.get("node", "")))
        add("llm_training_last_step_timestamp_seconds", last.get("time", 0), model=name)
        add("llm_training_last_progress_timestamp_seconds", max(last.get("time", 0), run.last_start), model=name)
        if cluster:
            add("llm_training_stall_floor_seconds", cluster.stall_floor_s, model=name)
        add("llm_training_last_checkpoint_timestamp_seconds", latest[1] if latest else 0, model=name)
        match = CHECKPOINT.fullmatch(latest[0]) if latest else None
        add("llm_training_last_checkpoint_step", int(match[1]) if match else 0, model=name)
        every, minutes = (config.get("checkpoint", {}).get(key) for key in ("every", "every_minutes"))
        if every and step_s is not None:
            add("llm_training_checkpoint_interval_seconds", min(every * step_s, minutes * 60 if minutes else math.inf),
                model=name)
        add("llm_training_recoveries_total", run.recoveries, model=name)
        add("llm_training_last_failure_timestamp_seconds", run.last_failure, model=name)
        running = jobs is not None and any(j.name == name and j.state == "RUNNING" for j in jobs)
        if jobs is not None:  # unknown without squeue: not failed, not alive either
            pending = any(j.name == name and j.state in PENDING for j in jobs)
            add("llm_training_job_running", int(running), model=name)
            add("llm_training_job_pending", int(pending), model=name)
            failed = run.started and not complete and not running and not pending
            add("llm_training_failed", int(failed), model=name,
                reason=(run.ending or "ended without finishing") if failed else "")
        add("llm_training_started", int(run.started), model=name)
        add("llm_training_complete", int(complete), model=name)
        if not complete and step_s is not None and total:
            add("llm_training_eta_timestamp_seconds", now + max(total - step, 0) * step_s, model=name)
        if cluster and cluster.deadline_days and run.first_start is not None:
            add("llm_training_deadline_timestamp_seconds", run.first_start + cluster.deadline_days * 86400,
                model=name)
        # Who writes a checkpoint next: the running models; without squeue, every unfinished one (the
        # free-space alert would rather count one too many).
        writes = running if jobs is not None else run.started and not complete
        return [checkpoints / latest[0]] if writes and latest else []

    def write(self, textfile_dir: Path) -> bool:
        """One round into ``textfile_dir``/llm.prom; False if the file could not be written."""
        path = textfile_dir / TEXTFILE
        text = render(self.collect())
        try:
            write_atomic(path, text)
        except OSError as exc:
            self._report(str(path), str(exc))
            return False
        self._report(str(path), None)
        return True


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m monitoring.exporter", description=__doc__.splitlines()[0])
    parser.add_argument("--textfile-dir", type=Path, required=True,
                        help=f"where to write {TEXTFILE}: the node exporter's --collector.textfile.directory")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--interval", type=float, default=30.0, help="seconds between rounds (default: 30)")
    when.add_argument("--once", action="store_true", help="one round, then exit (1 if the file could not be written)")
    parser.add_argument("--jobs-dir", type=Path, default=default_jobs_dir(),
                        help="jobs folder whose models/cluster.json names the models (default: $JOBS_DIR, else "
                             "the bundle holding this code)")
    parser.add_argument("--logs", type=Path, default=os.environ.get("FSX_LOGS", "/fsx/logs"))
    parser.add_argument("--checkpoints", type=Path, default=os.environ.get("FSX_CHECKPOINTS", "/fsx/checkpoints"))
    parser.add_argument("--filesystems", default=",".join(os.environ.get(f"FSX_{name.upper()}", f"/fsx/{name}")
                                                          for name in ("data", "checkpoints", "logs")),
                        help="comma-separated mount points to report (default: $FSX_DATA,$FSX_CHECKPOINTS,$FSX_LOGS)")
    parser.add_argument("--timeout", type=float, default=slurm.TIMEOUT_S,
                        help=f"seconds each Slurm command may take (default: {slurm.TIMEOUT_S:g})")
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.timeout <= 0:
        parser.error("--interval and --timeout must be > 0")
    if not args.textfile_dir.is_dir():
        return fail(f"{args.textfile_dir} is not a folder",
                    "create it, or pass the node exporter's --collector.textfile.directory")
    exporter = Exporter(jobs_dir=args.jobs_dir, logs=args.logs, checkpoints=args.checkpoints,
                        mounts=[m for m in args.filesystems.split(",") if m], timeout=args.timeout)
    while True:
        started = time.monotonic()
        written = exporter.write(args.textfile_dir)
        if args.once:
            return 0 if written else 1
        time.sleep(max(args.interval - (time.monotonic() - started), 0))


if __name__ == "__main__":
    sys.exit(main())
