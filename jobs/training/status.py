"""One view of every model's training: Slurm state, progress, losses, speed, checkpoints, cost so far.

    python -m training.status --env prod                    # the models of the bundle's models/cluster.json
    python -m training.status --png /fsx/logs/status.png    # plus the dashboard's picture, offline
    python -m training.status model1 model7 --logs /fsx/logs --checkpoints /fsx/checkpoints

Reads only what the jobs leave behind, so it is safe to run at any time from the head node:

- Slurm (``squeue``, ``scontrol``; monitoring/slurm.py): the model's job (named after the model), its
  state and restarts;
- ``<logs>/<model>/metrics.jsonl``: step, loss, val_loss, tokens/s, MFU, step time; ``start``
  events (each resume from a checkpoint is one recovery, whether the job relaunched training in its
  own allocation, Slurm requeued the job or someone resubmitted it) and ``recovery`` events (``in-job``:
  how many of them were relaunches inside the running job, same job id, no requeue); device time per
  interval;
- the newest ``<logs>/<model>/<model>_<job>.err`` (or ``.out``): the resolved config the run logged
  (total steps);
- ``<checkpoints>/<model>/latest`` and ``STATUS``: the last complete checkpoint and its age;
- the backup job's log (``<logs>/backups/<model>/backup-<model>_*.out``, in the model user's own folder) or the training log: whether the
  final checkpoint was backed up and verified.

Device-hours count the time of training steps (``step_time_s`` and checkpoint blocking of every
interval, times the ranks of the run), not start-up or time queued; dollars are device-hours at the
cluster's price per GPU. The models and the price come from the jobs bundle's ``models/cluster.json``
(training/cluster.py; ``--jobs-dir`` for another jobs folder, ``--env`` to refuse another
environment's); without one, and without those options, the models are the folders in ``--logs``
and dollars are left out.

The picture (``--png``) shows what the Grafana dashboard shows (docs/monitoring.md): each model's
loss, val_loss, tokens/s, MFU (GPU runs) and progress with its ETA against the deadline, Slurm's
nodes by state (``sinfo``; left out, with a note, when Slurm does not answer) and the free space of
$FSX_DATA, ``--checkpoints`` and ``--logs``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from cli import ArgumentParser, fail
from monitoring import filesystems, slurm
from training.cluster import CLUSTER_FILE, Cluster, add_arguments, default_jobs_dir, load_cluster
from training.config import MODEL_CONFIGS, ConfigError

BACKUP_DONE = "backed up and verified"


@dataclass
class ModelStatus:
    name: str
    job: str = "-"  # "<id> <STATE>" of the newest Slurm job named after the model
    restarts: int = 0  # Slurm requeues of that job
    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    val_loss: float | None = None
    tokens_per_s: float | None = None
    mfu_pct: float | None = None
    step_time_s: float | None = None
    checkpoint: str = "-"
    checkpoint_age_s: float | None = None
    run_status: str = "-"  # STATUS written by the trainer: complete | stopped
    backup: str = "-"
    resumes: int = 0  # starts that resumed from a checkpoint
    relaunches: int = 0  # of the recoveries, those inside the running job (recovery events with action relaunch)
    started_at: float | None = None  # epoch time of the run's first launch (or start)
    device_hours: float = 0.0
    dollars: float | None = None
    history: list[dict] = field(default_factory=list, repr=False)  # training records
    evals: list[dict] = field(default_factory=list, repr=False)  # validation records

    @property
    def recoveries(self) -> int:
        """Resumes of every kind: a relaunch in the job, a requeue (Slurm's restarts), a resubmission."""
        return max(self.resumes, self.restarts + self.relaunches)

    @property
    def eta_s(self) -> float | None:
        if not self.step_time_s or not self.total_steps or self.run_status == "complete":
            return None
        return max(self.total_steps - self.step, 0) * self.step_time_s


def read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a line being written right now
    return records


def summarize_metrics(status: ModelStatus, records: list[dict]) -> None:
    train = [r for r in records if "loss" in r]
    if train:
        last = train[-1]
        status.step, status.loss = last["step"], last["loss"]
        status.tokens_per_s, status.mfu_pct = last.get("tokens_per_s"), last.get("mfu_pct")
        recent = [r["step_time_s"] for r in train[-5:] if "step_time_s" in r]
        status.step_time_s = sum(recent) / len(recent) if recent else None
    evals = [r for r in records if "val_loss" in r]
    if evals:
        status.val_loss = evals[-1]["val_loss"]
    status.evals = evals
    status.resumes = sum(1 for r in records if r.get("event") == "start" and r.get("resumed"))
    status.relaunches = sum(1 for r in records if r.get("event") == "recovery" and r.get("action") == "relaunch")
    starts = [r["time"] for r in records if r.get("event") in ("launch", "start") and "time" in r]
    status.started_at = min(starts, default=None)
    # Device time: each interval's steps x step time (+ checkpoint blocking) x the run's ranks.
    ranks, previous, seconds = 1, 0, 0.0
    for r in records:
        if r.get("event") == "start":
            ranks, previous = r.get("world_size", 1), r.get("step", 0)
        elif "loss" in r:
            seconds += ((r["step"] - previous) * r.get("step_time_s", 0.0) + r.get("checkpoint_block_s", 0.0)) * ranks
            previous = r["step"]
    status.device_hours = seconds / 3600
    status.history = train


def run_logs(log_dir: Path, model: str) -> list[Path]:
    """The Slurm output files of ``model``'s jobs (``<model>_<job>.err`` and ``.out``), newest first."""
    return sorted([*log_dir.glob(f"{model}_*.err"), *log_dir.glob(f"{model}_*.out")],
                  key=lambda p: p.stat().st_mtime, reverse=True)


def config_line(line: str) -> dict | None:
    """The resolved config in the trainer's ``... config {...}`` log line (one per start), else None."""
    at = line.find(" config {")
    if at < 0:
        return None
    try:
        return json.loads(line[at + len(" config "):])
    except ValueError:
        return None


def logged_config(log_dir: Path, model: str) -> dict | None:
    """The resolved config the newest run of ``model`` logged (on stderr)."""
    for out in run_logs(log_dir, model):
        for line in reversed(out.read_text(errors="replace").splitlines()):
            if (config := config_line(line)) is not None:
                return config
    return None


def planned_config(configs: Path, model: str) -> dict | None:
    """The config ``model``'s job will run (``<configs>/<model>.yaml``), None without one."""
    path = configs / f"{model}.yaml"
    if not path.is_file():
        return None
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def total_steps(log_dir: Path, model: str, configs: Path = MODEL_CONFIGS) -> int:
    config = logged_config(log_dir, model) or planned_config(configs, model)  # not started yet: what it will run
    return int(config.get("train", {}).get("steps", 0)) if config else 0


def latest_checkpoint(directory: Path) -> tuple[str, float] | None:
    """(name, mtime) of the checkpoint ``latest`` names, None without one."""
    try:
        name = (directory / "latest").read_text().strip()
        return name, (directory / name).stat().st_mtime
    except OSError:
        return None


def run_status(directory: Path) -> str:
    """``STATUS`` as the trainer wrote it when it ended cleanly (complete | stopped), else "-"."""
    try:
        return (directory / "STATUS").read_text().strip()
    except OSError:
        return "-"


def checkpoint_state(status: ModelStatus, directory: Path, now: float) -> None:
    if latest := latest_checkpoint(directory):
        status.checkpoint, mtime = latest
        status.checkpoint_age_s = now - mtime
    status.run_status = run_status(directory)


def backup_state(logs: Path, model: str, run_status: str, latest: str = "-") -> str:
    """``verified`` when the newest backup log line names the latest checkpoint; an older one is named."""
    candidates = sorted([*logs.glob(f"backups/{model}/backup-{model}_*.out"), *(logs / model).glob(f"{model}_*.out"),
                         *(logs / model).glob(f"{model}_*.err")], key=lambda p: p.stat().st_mtime, reverse=True)
    for path in candidates:
        for line in reversed(path.read_text(errors="replace").splitlines()):
            if BACKUP_DONE in line:
                step = re.search(r"step_\d{8}", line)
                if step and step.group(0) != latest:
                    return f"older: {step.group(0)}"
                return "verified"
            if "training.checkpoints.backup" in line and "ERROR" in line or "BackupError" in line:
                return "FAILED"
    return "not yet" if run_status == "complete" else "-"


def slurm_jobs(names: list[str]) -> dict[str, tuple[str, int]]:
    """Model name -> ("<job id> <STATE>", restarts) of its newest job still known to Slurm; {} without Slurm."""
    try:
        newest = {}
        for job in sorted(slurm.jobs(), key=lambda job: _number(job.id)):
            if job.name in names:
                newest[job.name] = job
        restarts = {job_id: count for job_id, _, count in slurm.restarts()} if newest else {}
    except slurm.SlurmError:
        return {}
    return {name: (f"{job.id} {job.state}", restarts.get(job.id, 0)) for name, job in newest.items()}


def _number(job_id: str) -> int:
    return int(re.match(r"\d*", job_id).group(0) or 0)  # an array task's id is "<job>_<task>"


def collect(models: list[str], logs: Path, checkpoints: Path, price_per_gpu_hour: float | None = None,
            now: float | None = None, configs: Path = MODEL_CONFIGS) -> list[ModelStatus]:
    """``configs``: the jobs folder's models/, whose <model>.yaml gives the steps of a run not started yet."""
    now = time.time() if now is None else now
    jobs = slurm_jobs(models)
    result = []
    for name in models:
        status = ModelStatus(name)
        status.job, status.restarts = jobs.get(name, ("-", 0))
        summarize_metrics(status, read_metrics(logs / name / "metrics.jsonl"))
        status.total_steps = total_steps(logs / name, name, configs)
        checkpoint_state(status, checkpoints / name, now)
        status.backup = backup_state(logs, name, status.run_status, status.checkpoint)
        if price_per_gpu_hour is not None:
            status.dollars = status.device_hours * price_per_gpu_hour
        result.append(status)
    return result


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(statuses: list[ModelStatus]) -> str:
    header = (f"{'model':<8} {'job':<18} {'step':>13} {'loss':>7} {'val_loss':>8} {'tokens/s':>10} {'MFU%':>5} "
              f"{'ETA':>6} {'checkpoint':<14} {'age':>5} {'backup':<20} {'recov':>5} {'in-job':>6} {'dev-h':>8} {'$':>9}")
    lines = [header]
    for s in statuses:
        job = s.job if s.job != "-" else f"- ({s.run_status})" if s.run_status != "-" else "-"
        lines.append(
            f"{s.name:<8} {job:<18} {f'{s.step}/{s.total_steps}':>13} {_num(s.loss, '.4f'):>7} "
            f"{_num(s.val_loss, '.4f'):>8} {_num(s.tokens_per_s, ',.0f'):>10} {_num(s.mfu_pct, '.1f'):>5} "
            f"{_duration(s.eta_s):>6} {s.checkpoint:<14} {_duration(s.checkpoint_age_s):>5} {s.backup:<20} "
            f"{s.recoveries:>5} {s.relaunches:>6} {s.device_hours:>8,.1f} {_num(s.dollars, ',.0f'):>9}")
    return "\n".join(lines)


def figure(statuses: list[ModelStatus], *, now: float | None = None, deadline_days: float | None = None,
           nodes: list[slurm.Node] | None = None, usage: list[filesystems.Usage] = (), notes: list[str] = ()):
    """What the dashboard shows, as one matplotlib figure: the models' loss, val_loss, tokens/s, MFU
    (where logged) and progress with ETA against the deadline; Slurm's nodes by state and the file
    systems' free space where given. ``notes`` (why a panel is left out) go under the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    now = time.time() if now is None else now
    mfu = any("mfu_pct" in r for s in statuses for r in s.history)
    panels = ["training loss", "validation loss", "tokens/s", *(["MFU %"] if mfu else []), "progress",
              *(["nodes by state"] if nodes is not None else []), *(["file systems: free"] if usage else [])]
    rows = -(-len(panels) // 3)
    fig, grid = plt.subplots(rows, 3, figsize=(15, 4 * rows), squeeze=False)
    for ax in grid.flat[len(panels):]:
        ax.remove()
    ax = dict(zip(panels, grid.flat))
    for title, panel in ax.items():
        panel.set_title(title)
        panel.grid(alpha=0.3)
    for s in statuses:
        train = {r["step"]: r for r in s.history}  # a step run again after a resume: the last one counts
        steps = sorted(train)
        if steps:
            ax["training loss"].plot(steps, [train[k]["loss"] for k in steps], label=s.name)
            ax["tokens/s"].plot(steps, [train[k].get("tokens_per_s", float("nan")) for k in steps], label=s.name)
            if mfu:
                ax["MFU %"].plot(steps, [train[k].get("mfu_pct", float("nan")) for k in steps], label=s.name)
        evals = {r["step"]: r["val_loss"] for r in s.evals}
        if evals:
            ax["validation loss"].plot(sorted(evals), [evals[k] for k in sorted(evals)], marker=".", label=s.name)
    for title in ("training loss", "validation loss", "tokens/s", "MFU %"):
        if title in ax:
            ax[title].set_xlabel("step")
            if ax[title].lines:
                ax[title].legend()
    _progress(ax["progress"], statuses, now, deadline_days)
    if nodes is not None:
        _nodes(ax["nodes by state"], nodes)
    if usage:
        _free_space(ax["file systems: free"], usage)
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=9, va="bottom")
    fig.tight_layout(rect=(0, 0.03 * len(notes) / rows, 1, 1))
    return fig


def _when(t: float) -> str:
    return time.strftime("%m-%d %H:%M UTC", time.gmtime(t))


def _progress(ax, statuses: list[ModelStatus], now: float, deadline_days: float | None) -> None:
    """One bar per model: steps done of the total; the ETA, red when it falls after the deadline."""
    names = [s.name for s in statuses]
    done = [s.step / s.total_steps if s.total_steps else 0.0 for s in statuses]
    ax.barh(names, done, color="tab:blue")
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of the steps done")
    for y, s in enumerate(statuses):
        deadline = s.started_at + deadline_days * 86400 if deadline_days and s.started_at else None
        eta = now + s.eta_s if s.eta_s is not None else None
        text = f"{s.step}/{s.total_steps}"
        text += " complete" if s.run_status == "complete" else f", ETA {_when(eta)}" if eta else ""
        text += f", deadline {_when(deadline)}" if deadline else ""
        late = eta is not None and deadline is not None and eta > deadline
        ax.text(0.02, y, text, va="center", fontsize=8, color="tab:red" if late else "black")


def _nodes(ax, nodes: list[slurm.Node]) -> None:
    states = sorted({n.state for n in nodes})
    counts = [sum(1 for n in nodes if n.state == state) for state in states]
    ax.bar(states, counts, color=["tab:red" if state in slurm.UNAVAILABLE else "tab:green" for state in states])
    ax.set_ylabel("nodes")


def _free_space(ax, usage: list[filesystems.Usage]) -> None:
    ax.barh([u.path for u in usage], [100 * u.free / u.size if u.size else 0 for u in usage], color="tab:green")
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.set_xlabel("% free")
    for y, u in enumerate(usage):
        ax.text(1, y, f"{u.free / 2**40:.2f} of {u.size / 2**40:.2f} TiB free", va="center", fontsize=8)


def plot(statuses: list[ModelStatus], out: Path, **views) -> Path:
    """``figure`` (``views``: its keyword arguments) written to ``out``."""
    fig = figure(statuses, **views)
    import matplotlib.pyplot as plt  # after figure() chose the backend

    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def cluster_views(paths: list[str]) -> dict:
    """``figure``'s nodes, usage and notes, from Slurm and the file systems at ``paths``."""
    notes = []
    try:
        nodes = slurm.nodes()
    except slurm.SlurmError as exc:
        nodes = None
        notes.append(f"nodes by state left out: Slurm not reachable (sinfo: {exc})")
    usage = []
    for path in dict.fromkeys(paths):
        try:
            usage.append(filesystems.usage(path))
        except OSError as exc:
            notes.append(f"file system {path} left out: {exc.strerror}")
    return {"nodes": nodes, "usage": usage, "notes": notes}


def read_cluster(jobs_dir: Path | None, env: str | None) -> Cluster | None:
    """The jobs folder's cluster file; a missing one is an error only where --jobs-dir or --env asks for it
    (without it the table still shows the runs in --logs, only no dollars)."""
    if jobs_dir is None and env is None and not (default_jobs_dir() / CLUSTER_FILE).is_file():
        return None
    return load_cluster(jobs_dir, env)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.status", description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="model names (default: the cluster file's, else every folder in --logs)")
    add_arguments(parser)  # --jobs-dir, --env: the cluster file giving the models and the price per GPU-hour
    parser.add_argument("--logs", default=os.environ.get("FSX_LOGS", "/fsx/logs"))
    parser.add_argument("--checkpoints", default=os.environ.get("FSX_CHECKPOINTS", "/fsx/checkpoints"))
    parser.add_argument("--png", help="also write one picture of what the dashboard shows: every model's loss, "
                        "val_loss, tokens/s, MFU and progress, Slurm's nodes, the file systems' free space")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    logs, checkpoints = Path(args.logs), Path(args.checkpoints)
    try:
        cluster = read_cluster(args.jobs_dir, args.env)
    except ConfigError as exc:
        return fail(exc)
    price = cluster.price_per_gpu_hour_usd if cluster else None
    models = args.models or (list(cluster.models) if cluster else [])
    if not models:
        models = sorted(p.parent.name for p in logs.glob("*/metrics.jsonl"))
    if not models:
        return fail(f"no models: no {default_jobs_dir() / CLUSTER_FILE} and no <model>/metrics.jsonl in {logs}",
                    "pass model names, --jobs-dir with a cluster file, or --logs with the runs' folders")
    configs = (args.jobs_dir or default_jobs_dir()) / "models"
    statuses = collect(models, logs, checkpoints, price, configs=configs)
    if args.json:
        print(json.dumps([{k: v for k, v in s.__dict__.items() if k not in ("history", "evals")} | {"eta_s": s.eta_s}
                          for s in statuses], indent=1))
    else:
        print(format_table(statuses))
    if args.png:
        views = cluster_views([os.environ.get("FSX_DATA", "/fsx/data"), args.checkpoints, args.logs])
        deadline_days = cluster.deadline_days if cluster else None
        print(f"picture: {plot(statuses, Path(args.png), deadline_days=deadline_days, **views)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
