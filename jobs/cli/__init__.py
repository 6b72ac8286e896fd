"""The command-line convention every entry point follows (documented in docs/cli.md):

    exit 0   done, or the check passed
    exit 1   the check ran and found a problem (a bad shard, a slow mount, wrong collective results)
    exit 2   bad input or usage: nothing was checked or done as asked
    stderr   ``error: <what went wrong> — <how to fix it>``

``ArgumentParser`` gives argparse's own usage errors that form (argparse already exits 2), and
``fail`` prints one and returns 2. ``progress`` shows progress on long steps.
"""

from __future__ import annotations

import argparse
import sys

OK, CHECK_FAILED, BAD_INPUT = 0, 1, 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with usage errors as ``error: <what> — see <prog> --help`` (exit 2)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(BAD_INPUT, f"error: {message} — see {self.prog} --help\n")


def fail(what: object, fix: str = "") -> int:
    """Print ``error: <what> — <fix>`` on stderr and return BAD_INPUT (``return fail(...)``).

    Without ``fix``, ``what`` must already say how to fix it (the project's exceptions do).
    """
    print(f"error: {what}" + (f" — {fix}" if fix else ""), file=sys.stderr, flush=True)
    return BAD_INPUT
