"""Many ``python -m MODULE ARGS`` command lines run in turn by one Python, as ``python -m`` runs each (runpy,
``run_name="__main__"``): the imports they share (torch, jsii, pydantic) are paid once instead of once a command.
What does not answer as expected there is run again as a command line of its own by the caller, and judged on that."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RUN_IN_TURN = """
import contextlib, io, json, runpy, sys, traceback
answers = []
for module, *args in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [module, *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            status = 1
    answers.append((status, out.getvalue(), err.getvalue()))
sys.__stdout__.write(json.dumps(answers))
"""


def run_in_turn(commands: list[list[str]], *, cwd: Path, env: dict, pythons: int = 2,
                timeout_s: int = 600) -> list[tuple[int, str, str] | None]:
    """(exit status, stdout, stderr) of each ``[module, *args]``, run in turn by ``pythons`` Pythons; None
    for the commands of a Python that did not finish (the caller runs those as command lines)."""
    shares = [list(range(i, len(commands), pythons)) for i in range(pythons)]

    def run(share: list[int]) -> list:
        try:
            done = subprocess.run([sys.executable, "-c", RUN_IN_TURN], input=json.dumps([commands[i] for i in share]),
                                  cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
            return json.loads(done.stdout) if done.returncode == 0 else [None] * len(share)
        except (subprocess.TimeoutExpired, json.JSONDecodeError):
            return [None] * len(share)

    answers: list = [None] * len(commands)
    with ThreadPoolExecutor(max_workers=pythons) as pool:
        for share, found in zip(shares, pool.map(run, shares)):
            for i, answer in zip(share, found):
                answers[i] = tuple(answer) if answer is not None else None
    return answers

