"""The figures README and docs/ quote come from one source each, so none of them can go stale unseen:

- a command's output pasted in a page is marked ``<!-- output of: COMMAND -->`` and equals a fresh run
  (refresh: ``.venv/bin/python scripts/refresh_doc_outputs.py``);
- README's times for ``make demo`` and ``make test`` are docs/testing.md's "Current figures";
- no page quotes a count of ``make test-fast``'s tests (it changes with every test; docs/testing.md gives
  the command that counts them);
- the number of pytest processes the docs say ``make test`` and ``scripts/test_all.sh tests/<area>`` start
  is the number scripts/test_all.sh starts, run with a stand-in Python that only records its calls.
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NUMBERS = {word: n for n, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty".split())}


def refresh_module():
    spec = importlib.util.spec_from_file_location("refresh_doc_outputs", ROOT / "scripts/refresh_doc_outputs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def stale_outputs(doc: Path, text: str) -> list[str]:
    """The commands whose output pasted in ``text`` differs from a fresh run, each with the first line that differs."""
    refresh, stale = refresh_module(), []
    for block in refresh.pasted_outputs(text):
        today, pasted = refresh.output_of(block.command), [line.rstrip() for line in block.lines]
        if pasted != today:
            first = next((i for i, (a, b) in enumerate(zip(pasted, today)) if a != b), min(len(pasted), len(today)))
            stale.append(f"{doc.relative_to(ROOT)}: {block.command}, line {first + 1} of its output: pasted "
                         f"{pasted[first] if first < len(pasted) else '(nothing)'!r}, today "
                         f"{today[first] if first < len(today) else '(nothing)'!r}")
    return stale


def test_pasted_outputs_are_what_the_commands_print_today():
    stale = [problem for doc in DOCS for problem in stale_outputs(doc, doc.read_text())]
    assert not stale, "\n".join(stale) + "\nrefresh them: .venv/bin/python scripts/refresh_doc_outputs.py"


def test_every_pasted_plan_is_marked():
    """The plan's output pasted without its mark would never be checked: docs/deploy.md and docs/cluster.md
    hold prod's, marked."""
    refresh = refresh_module()
    marked = {}
    for doc in DOCS:
        text = doc.read_text()
        blocks = refresh.pasted_outputs(text)
        marked[doc.relative_to(ROOT).as_posix()] = [b.command for b in blocks]
        covered = {i for b in blocks for i in range(b.first, b.end)}
        for number, line in enumerate(text.splitlines()):
            if line.startswith("Plan for ") and number not in covered:
                raise AssertionError(f"{doc.relative_to(ROOT)}:{number + 1}: a pasted plan without its "
                                     "<!-- output of: python -m cluster_config plan ... --> mark")
    for doc in ("docs/deploy.md", "docs/cluster.md"):
        assert "python -m cluster_config plan --env prod" in marked[doc], doc


def current_figure(name: str) -> int:
    """A value of docs/testing.md's "Current figures" table, in seconds."""
    text = (ROOT / "docs/testing.md").read_text()
    assert "## Current figures" in text, "docs/testing.md has no Current figures section, the one source of the times"
    section = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    row = next((line for line in section.splitlines() if line.startswith(f"| {name}")), None)
    assert row, f"docs/testing.md's Current figures has no row for {name}"
    return int(re.search(r"\| ([\d,]+) s \|", row)[1].replace(",", ""))


def readme_times(readme: str) -> tuple[int, int, int]:
    """README's quick start: make test's minutes, make demo's minutes (in words) and seconds."""
    test_minutes = int(re.search(r"make test +# [^\n]*~(\d+) minutes", readme)[1])
    demo = re.search(r"`make demo` takes about (\w+) minutes[^(]*\(([\d,]+) s", readme)
    assert demo, "README no longer says how long make demo takes, with the seconds measured"
    return test_minutes, NUMBERS[demo[1]], int(demo[2].replace(",", ""))


def test_readme_quotes_the_recorded_times():
    test_minutes, demo_minutes, demo_seconds = readme_times((ROOT / "README.md").read_text())
    assert demo_seconds == current_figure("`make demo`"), "README's make demo time is not docs/testing.md's"
    assert demo_minutes == round(demo_seconds / 60)
    assert test_minutes == round(current_figure("`make test`") / 60), "README's make test time is not docs/testing.md's"


def test_readmes_quick_start_names_the_fast_tests():
    """Two main commands in the quick start's block, `make test-fast` right after it."""
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = quick.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in block.splitlines()] == [["make", "demo"], ["make", "test"]]
    after = quick.split("```", 2)[2].strip().split("\n\n", 1)[0]
    assert "`make test-fast`" in after, "README's quick start does not name make test-fast right after its block"


def test_no_page_quotes_a_count_of_the_fast_tests():
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if "make test-fast" in line:
                assert not re.search(r"\b\d[\d,]* tests\b", line), \
                    f"{doc.relative_to(ROOT)}:{number}: a count of make test-fast's tests, stale at the next test"


def processes_started(tmp_path: Path, *args: str) -> int:
    """How many pytest processes scripts/test_all.sh starts, with a Python that records its calls and passes."""
    log = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexit 0\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    proc = subprocess.run(["bash", str(ROOT / "scripts/test_all.sh"), *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PY": str(fake)}, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    log.unlink()
    assert all(call.startswith("-m pytest") for call in calls), calls
    return len(calls)


def claimed_processes(text: str) -> list[tuple[str, int]]:
    """Each "<number> (pytest) processes" the text says of make test or test_all.sh, with the sentence or table
    cell it is in."""
    claims = []
    for piece in re.split(r"(?<=[.:;])\s|\|", text.replace("\n", " ")):
        if not re.search(r"`make test`|test_all\.sh", piece):
            continue
        for word in re.findall(r"\b(\w+) (?:pytest )?processes\b", piece):
            if word in NUMBERS:
                claims.append((piece.strip(), NUMBERS[word]))
    return claims


def test_the_docs_count_the_processes_test_all_starts(tmp_path):
    everything, one_area = processes_started(tmp_path), processes_started(tmp_path, "tests/cdk")
    claims = [(doc, piece, n) for doc in DOCS for piece, n in claimed_processes(doc.read_text())]
    assert claims, "the docs no longer say how many processes make test runs"
    for doc, piece, n in claims:
        expected = one_area if ("tests/<area>" in piece or "an area" in piece or "one area" in piece) else everything
        assert n == expected, \
            f"{doc.relative_to(ROOT)}: {piece!r} says {n} processes; scripts/test_all.sh starts {expected}"
