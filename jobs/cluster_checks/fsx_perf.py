"""Measure each FSx mount from every node of a Slurm allocation, then print one summary.

Run by ``jobs/fsx_perf.sh`` inside the allocation (it locates or builds IOR and picks the tool)::

    python3 -m cluster_checks.fsx_perf --out DIR --tool ior --ior BIN --mdtest BIN \\
        --nodes 2 --tasks-per-node 8 --expect /fsx/data=7031 /fsx/data /fsx/checkpoints

Per mount, two measurements with the same meaning whichever tool runs them:

- sequential bandwidth, file per process: every task writes its own file (fsync at the end,
  so the figure includes reaching the servers), then reads a file that a task on *another*
  node wrote, so the client's page cache cannot serve it (IOR ``-C``; fio reads the next
  node's files);
- metadata rates: every task creates, stats (the next node's files) and removes small files
  (mdtest ``-F -C -T -r -N``; fio's filecreate, filestat and filedelete engines).

Raw outputs stay under ``DIR/raw/<mount>/``; ``DIR/summary.txt`` and ``DIR/summary.json`` hold the
table. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from cli import ArgumentParser
from .fsx_report import (DEFAULT_MIN_RATIO, FAILED, MISSING, MountResult, assess, exit_code,
                         parse_expectations, render_table, to_json)
from .io_results import (ResultsError, fio_aggregate_mb_s, fio_aggregate_ops, load_fio_json,
                         parse_ior_json, parse_ior_text, parse_mdtest)

# fio runs once per node; each process learns its node's index and the next node's, which name
# the files it writes and the files it reads back (see the jobfiles below).
FIO_WRAPPER = ('export FSX_PERF_SELF="$SLURM_NODEID" '
               'FSX_PERF_PEER="$(( (SLURM_NODEID + 1) % SLURM_NNODES ))"; exec fio "$@"')
FIO_PHASES = ("write", "read", "create", "stat", "remove")


def parse_size(text: str) -> int:
    """``16m`` / ``16g`` / ``512k`` / ``1048576`` -> bytes (binary units, as IOR and fio read them)."""
    match = re.fullmatch(r"(\d+)([kmgt]?)i?b?", text.strip().lower())
    if not match:
        raise ValueError(f"{text!r} is not a size; write e.g. 16m or 16g")
    return int(match.group(1)) * 1024 ** " kmgt".index(match.group(2) or " ")


def mount_fs_type(path: str, mounts_table: str | None = None) -> str:
    """File system type of the mount holding ``path`` (longest matching mount point)."""
    if mounts_table is None:
        mounts_table = Path("/proc/self/mounts").read_text()
    target = os.path.realpath(path)
    best, fs_type = "", "unknown"
    for line in mounts_table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].encode().decode("unicode_escape")  # \040 is a space in mount points
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fs_type = point, fields[2]
    return fs_type


def slug(mount: str) -> str:
    return mount.strip("/").replace("/", "_") or "root"


# --- commands ----------------------------------------------------------------------------------

def ior_command(launcher: list[str], ior: str, work: Path, raw: Path, xfer: str, block: str,
                seconds: int) -> list[str]:
    return [*launcher, ior, "-a", "POSIX", "-w", "-r",
            "-F",   # file per process
            "-C",   # read back what a task on another node wrote
            "-e",   # fsync after writing
            "-g",   # barriers between phases, so each phase is timed alone
            "-t", xfer, "-b", block, "-i", "1",
            "-D", str(seconds), "-O", "stoneWallingWearOut=1",  # cap each phase's duration
            "-o", str(work / "ior" / "data"),
            "-O", "summaryFormat=JSON", "-O", f"summaryFile={raw / 'ior.json'}"]


def mdtest_command(launcher: list[str], mdtest: str, work: Path, files_per_task: int,
                   tasks_per_node: int) -> list[str]:
    return [*launcher, mdtest, "-F", "-C", "-T", "-r",
            "-u",                          # one directory per task
            "-N", str(tasks_per_node),     # stat files of a task on the next node
            "-n", str(files_per_task), "-i", "1", "-d", str(work / "mdtest")]


def fio_jobfile(phase: str, work: Path, *, tasks_per_node: int, xfer: str, block: str, seconds: int,
                files_per_task: int) -> str:
    """fio job for one phase; ``${FSX_PERF_SELF}``/``${FSX_PERF_PEER}`` are expanded by fio."""
    owner = "${FSX_PERF_PEER}" if phase in ("read", "stat") else "${FSX_PERF_SELF}"
    common = [f"filename_format=node{owner}.$jobname.$jobnum.$filenum",
              f"numjobs={tasks_per_node}", "group_reporting=1"]
    if phase in ("write", "read"):
        specific = [f"directory={work / 'seq'}", "ioengine=psync", f"bs={xfer}", f"runtime={seconds}"]
        if phase == "write":
            specific += ["rw=write", f"size={block}", "end_fsync=1"]
        else:
            specific += ["rw=read", "invalidate=1"]  # size: the written files' own
        name = "seq"
    else:
        engine = {"create": "filecreate", "stat": "filestat", "remove": "filedelete"}[phase]
        specific = [f"directory={work / 'md'}", f"ioengine={engine}", "filesize=4k",
                    f"nrfiles={files_per_task}", "openfiles=1", "fallocate=none",
                    "create_on_open=1"]  # create at open (timed), never lay files out beforehand
        name = "md"
    return "\n".join(["[global]", *common, *specific, f"[{name}]", ""])


# --- measuring ---------------------------------------------------------------------------------

class Runner:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.job = os.environ.get("SLURM_JOB_ID", str(os.getpid()))

    def _run(self, command: list[str], stdout: Path, stderr: Path) -> None:
        with (stdout.parent / "commands.txt").open("a") as log:
            log.write(shlex.join(command) + "\n")
        with stdout.open("w") as out, stderr.open("w") as err:
            result = subprocess.run(command, stdout=out, stderr=err)
        if result.returncode:
            tail = stderr.read_text().strip().splitlines()[-3:]
            raise ResultsError(f"{Path(command[0]).name} ... {Path(command[-1]).name} exited with "
                               f"{result.returncode}; {stderr}: {' | '.join(tail) or '(empty)'}")

    def measure(self, mount: str) -> MountResult:
        args = self.args
        result = MountResult(mount=mount, tool=args.tool)
        if not os.path.isdir(mount):
            result.status = MISSING
            result.notes.append(f"does not exist on {socket.gethostname()}: not mounted, or not in this "
                                "cluster's configuration (set FSX_PERF_MOUNTS)")
            return result
        result.fs_type = mount_fs_type(mount)
        if result.fs_type != "lustre":
            result.notes.append(f"{result.fs_type}, not Lustre: these figures describe that file system, "
                                "not FSx")
        needed = args.nodes * args.tasks_per_node * parse_size(args.block)
        free = shutil.disk_usage(mount).free
        if needed > free // 2:
            result.status = FAILED
            result.notes.append(f"the test writes {needed / 2**30:,.1f} GiB but only {free / 2**30:,.1f} GiB "
                                "are free; lower FSX_PERF_BLOCK (bytes per task)")
            return result
        raw = args.out / "raw" / slug(mount)
        raw.mkdir(parents=True, exist_ok=True)
        work = Path(mount) / ".fsx_perf" / self.job
        try:
            (work / "seq").mkdir(parents=True, exist_ok=True)  # exists after a requeue
            (work / "md").mkdir(exist_ok=True)
            if args.tool == "ior":
                self._measure_ior(work, raw)
            else:
                self._measure_fio(work, raw)
            collect(raw, result)
        except (OSError, ResultsError) as exc:
            result.status = FAILED
            result.notes.append(str(exc))
        finally:
            shutil.rmtree(work, ignore_errors=True)
            with contextlib.suppress(OSError):
                work.parent.rmdir()  # only when no other job's folder is left in it
        return result

    def _measure_ior(self, work: Path, raw: Path) -> None:
        a = self.args
        launcher = ["srun", f"--mpi={a.srun_mpi}", f"--nodes={a.nodes}", f"--ntasks-per-node={a.tasks_per_node}",
                    "--kill-on-bad-exit=1", *a.srun_option]
        self._run(ior_command(launcher, a.ior, work, raw, a.xfer, a.block, a.seconds),
                  raw / "ior.txt", raw / "ior.err")
        self._run(mdtest_command(launcher, a.mdtest, work, a.files_per_task, a.tasks_per_node),
                  raw / "mdtest.txt", raw / "mdtest.err")

    def _measure_fio(self, work: Path, raw: Path) -> None:
        a = self.args
        for phase in FIO_PHASES:
            jobfile = raw / f"fio-{phase}.fio"
            jobfile.write_text(fio_jobfile(phase, work, tasks_per_node=a.tasks_per_node, xfer=a.xfer,
                                           block=a.block, seconds=a.seconds, files_per_task=a.files_per_task))
            command = ["srun", f"--nodes={a.nodes}", f"--ntasks={a.nodes}", "--ntasks-per-node=1",
                       "--kill-on-bad-exit=1", *a.srun_option, f"--output={raw}/fio-{phase}-%t.json",
                       f"--error={raw}/fio-{phase}-%t.err",
                       "bash", "-c", FIO_WRAPPER, "fio", "--output-format=json", str(jobfile)]
            self._run(command, raw / f"fio-{phase}.srun.out", raw / f"fio-{phase}.srun.err")


def collect(raw: Path, result: MountResult) -> MountResult:
    """Fill ``result`` from the raw outputs in ``raw`` (IOR+mdtest or fio); ResultsError if unusable."""
    if (raw / "ior.json").is_file() and (raw / "ior.json").stat().st_size:
        bandwidth = parse_ior_json((raw / "ior.json").read_text())
    elif (raw / "ior.txt").is_file():
        bandwidth = parse_ior_text((raw / "ior.txt").read_text())
    else:
        bandwidth = None
    if bandwidth is not None:
        result.tool = "ior+mdtest"
        result.write_mb_s, result.read_mb_s = bandwidth.write_mb_s, bandwidth.read_mb_s
        rates = parse_mdtest(_read(raw / "mdtest.txt"))
        result.creates_per_s, result.stats_per_s, result.removes_per_s = (
            rates.creates_per_s, rates.stats_per_s, rates.removes_per_s)
        return result
    phases = {}
    for phase in FIO_PHASES:
        files = sorted(raw.glob(f"fio-{phase}-*.json"))
        if not files:
            raise ResultsError(f"{raw}: neither IOR output (ior.json, ior.txt) nor fio {phase} results "
                               f"(fio-{phase}-<task>.json)")
        phases[phase] = [load_fio_json(path.read_text(), str(path)) for path in files]
    result.tool = "fio"
    result.write_mb_s = fio_aggregate_mb_s(phases["write"], "write")
    result.read_mb_s = fio_aggregate_mb_s(phases["read"], "read")
    result.creates_per_s = fio_aggregate_ops(phases["create"])
    result.stats_per_s = fio_aggregate_ops(phases["stat"])
    result.removes_per_s = fio_aggregate_ops(phases["remove"])
    return result


def _read(path: Path) -> str:
    if not path.is_file():
        raise ResultsError(f"{path} is missing: the tool did not run")
    return path.read_text()


# --- entry point -------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m cluster_checks.fsx_perf", description=__doc__.split("\n")[0])
    p.add_argument("mounts", nargs="+", help="mount points to test, e.g. /fsx/data /fsx/checkpoints")
    p.add_argument("--out", type=Path, required=True, help="folder for raw outputs and the summary")
    p.add_argument("--tool", choices=("ior", "fio"), required=True)
    p.add_argument("--ior", default="ior")
    p.add_argument("--mdtest", default="mdtest")
    p.add_argument("--srun-mpi", default="pmix", help="srun --mpi plugin for IOR/mdtest")
    p.add_argument("--srun-option", action="append", default=[],
                   help="an srun option for the measuring steps, e.g. Pyxis's --container-image=... (repeatable)")
    p.add_argument("--nodes", type=int, default=int(os.environ.get("SLURM_JOB_NUM_NODES", "1")))
    p.add_argument("--tasks-per-node", type=int, default=1)
    p.add_argument("--xfer", default="16m", help="transfer size per I/O call")
    p.add_argument("--block", default="16g", help="bytes written per task")
    p.add_argument("--seconds", type=int, default=120, help="cap on each bandwidth phase")
    p.add_argument("--files-per-task", type=int, default=1000)
    p.add_argument("--expect", default="", help="provisioned MB/s per mount: /fsx/data=7031,/fsx/logs=2343")
    p.add_argument("--min-ratio", type=float, default=DEFAULT_MIN_RATIO)
    p.add_argument("--note", action="append", default=[], help="a line for the report (repeatable)")
    args = p.parse_args(argv)
    try:
        parse_size(args.xfer), parse_size(args.block)
        args.expected = parse_expectations(args.expect)
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runner = Runner(args)
    results = []
    for mount in dict.fromkeys(m.rstrip("/") or "/" for m in args.mounts):
        print(f"fsx_perf: measuring {mount} with {args.tool} ...", flush=True)
        results.append(assess(runner.measure(mount), args.expected.get(mount), args.min_ratio))
    notes = list(args.note)
    if not args.expected:
        notes.append("no provisioned throughput given (FSX_EXPECTED_MB_S): nothing compared")
    unused = sorted(set(args.expected) - {r.mount for r in results})
    if unused:
        notes.append(f"FSX_EXPECTED_MB_S names mounts that were not tested: {', '.join(unused)}")
    header = (f"FSx performance, job {runner.job}: {args.nodes} node(s) x {args.tasks_per_node} task(s), "
              f"{args.tool}, transfer {args.xfer}, {args.block} per task, {args.files_per_task} files per task, "
              f"flag below {args.min_ratio:.0%} of provisioned")
    table = render_table(results, header) + "".join(f"note: {n}\n" for n in notes)
    (args.out / "summary.txt").write_text(table)
    (args.out / "summary.json").write_text(to_json(
        results, job=runner.job, nodes=args.nodes, tasks_per_node=args.tasks_per_node, tool=args.tool,
        transfer=args.xfer, block_per_task=args.block, files_per_task=args.files_per_task,
        min_ratio=args.min_ratio, notes=notes))
    print(table, end="")
    print(f"fsx_perf: raw outputs and summary.json in {args.out}")
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
