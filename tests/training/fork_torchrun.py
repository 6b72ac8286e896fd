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
"""

from __future__ import annotations

import runpy
import signal
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


if __name__ == "__main__":
    sys.exit(main())
