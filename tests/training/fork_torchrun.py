"""torchrun for the CPU tests, with torch, transformers and the trainer imported once.

The same elastic agent, rendezvous, worker environment, failure handling and exit code as the
``torchrun`` command (``torch.distributed.run``), from its own argument parser; the only change is
how a worker starts: forked from this process (``start_method="fork"``) instead of a new Python that
imports torch, transformers and the trainer again. That import is ~4.5 s of CPU per rank, three
quarters of a 4-rank tiny test run. Workers get what a fresh Python has: default signal handlers
(an ignored signal stays ignored, as across exec), ``sys.argv`` of their own and ``__main__``.

    python fork_torchrun.py --nproc-per-node=4 --standalone -m training.train --config ... key=value
    python fork_torchrun.py --nproc-per-node=4 --standalone path/to/script.py args

The local-cluster tests run the real ``torchrun`` command through ``jobs/train.sh``.

    python fork_torchrun.py --serve SOCKET

serves launches instead (tests/training/conftest.py, ``Launched``): the launcher itself is forked from
this process too, which imported torch, transformers and the trainer once for the whole test session,
instead of once per launch (~4.5 s of CPU each, most of what a short test run costs). Each request
names the launcher's arguments, environment, working folder, output and signals to ignore; the
forked launcher is what a fresh ``python fork_torchrun.py ARGS`` would be after its imports: a
session of its own, that environment and folder, default signal handlers. An intermediate process
(the reaper) waits for it and sends its pid, then its exit status, back over the request's connection.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import socket
import sys
import uuid

import training.train  # noqa: F401  (imported here so that every forked worker has it)
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import elastic_launch
from torch.distributed.run import config_from_args, parse_args


def worker(program: str, module: bool, args: list[str]) -> None:
    """One rank: run ``program`` as ``python [-m] program args`` would, in this forked process."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):  # the agent's handlers, not a worker's
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = [program, *args]
    if module:
        runpy.run_module(program, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(program, run_name="__main__")


def main() -> int:
    args = parse_args(sys.argv[1:])
    if args.standalone:  # as torch.distributed.run.run does: a c10d store on a free port of this host
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    config, _, _ = config_from_args(args)
    config.start_method = "fork"
    program = args.training_script
    try:
        elastic_launch(config, worker)(program, bool(args.module), list(args.training_script_args))
    except ChildFailedError as exc:  # what the torchrun command prints and returns
        print(exc.format_msg(), file=sys.stderr, flush=True)
        return 1
    return 0


def serve(path: str) -> None:
    """Fork a launcher for each request on the Unix socket ``path``, until SIGTERM or the parent's end."""
    parent = os.getppid()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(64)
    server.settimeout(1.0)
    reapers = set()
    while not stopping and os.getppid() == parent:
        for pid in list(reapers):  # waited for, so that their CPU counts as the test session's
            if os.waitpid(pid, os.WNOHANG)[0]:
                reapers.discard(pid)
        try:
            conn, _ = server.accept()
        except (TimeoutError, InterruptedError):
            continue
        conn.settimeout(None)
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
        request = json.loads(b"".join(iter(lambda: conn.recv(1 << 16), b"")))
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            server.close()
            reap(conn, request, fds)
        reapers.add(pid)
        conn.close()
        for fd in fds:
            os.close(fd)
    for pid in reapers:
        os.waitpid(pid, 0)


def reap(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """The reaper: fork the launcher, send its pid, wait for it, send its exit status (as Popen's returncode)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        sys.exit(launcher(request, fds))  # unwinds to the interpreter's own exit, as a fresh process ends
    try:
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    finally:  # a test that stopped listening (BrokenPipeError) included: never back into the server's loop
        os._exit(0)


def launcher(request: dict, fds: list[int]) -> int:
    os.setsid()
    for fd, std in zip(fds, (0, 1, 2)):
        os.dup2(fd, std)
    for fd in fds:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_IGN if signum.name in request["ignore"] else signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as at any start
    sys.argv = [__file__, *request["args"]]
    return main()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        sys.exit(main())
