"""The command outputs pasted in README and docs/, kept to what the commands print today.

A fenced block right after a line ``<!-- output of: python -m MODULE ARGS -->`` holds that command's output
(after an optional first line ``$ python -m MODULE ARGS``); tests/test_doc_commands.py fails when one
differs from a fresh run. Only ``python -m`` commands of the checkout, which need no AWS and no cluster.

    .venv/bin/python scripts/refresh_doc_outputs.py            # rewrite every stale block
    .venv/bin/python scripts/refresh_doc_outputs.py --check    # exit 1 naming each stale block
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^<!-- output of: (.+?) -->$")


@dataclass
class Pasted:
    command: str
    first: int        # index of the block's first line of output (after the fence and any prompt line)
    end: int          # index of the closing fence
    lines: list[str]  # the pasted output


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def pasted_outputs(text: str) -> list[Pasted]:
    lines, found = text.splitlines(), []
    for i, line in enumerate(lines):
        mark = MARK.match(line.strip())
        if not mark:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            raise ValueError(f"line {i + 1}: {line.strip()} is not followed by a fenced block")
        first = i + 2 + (lines[i + 2].strip() == f"$ {mark[1]}")
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        found.append(Pasted(mark[1], first, end, lines[first:end]))
    return found


def output_of(command: str) -> list[str]:
    argv = shlex.split(command)
    if argv[:2] != ["python", "-m"]:
        raise ValueError(f"{command}: only python -m commands of the checkout are run")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "jobs"), str(REPO)])}
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{command} exits {proc.returncode}: {proc.stderr[-2000:]}")
    return [line.rstrip() for line in proc.stdout.rstrip("\n").splitlines()]


def refreshed(text: str) -> tuple[str, list[str]]:
    """The text with every pasted output replaced by today's, and the commands whose output changed."""
    lines, stale = text.splitlines(), []
    for block in reversed(pasted_outputs(text)):
        today = output_of(block.command)
        if [line.rstrip() for line in block.lines] != today:
            stale.append(block.command)
            lines[block.first:block.end] = today
    return "\n".join(lines) + ("\n" if text.endswith("\n") else ""), stale[::-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each stale block")
    args = parser.parse_args(argv)
    failed = False
    for doc in documents():
        text = doc.read_text()
        new, stale = refreshed(text)
        for command in stale:
            print(f"{doc.relative_to(REPO)}: the output of {command} is {'stale' if args.check else 'refreshed'}")
        if stale and not args.check:
            doc.write_text(new)
        failed = failed or bool(stale)
    return 1 if failed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
