"""Parsers for the outputs of IOR, mdtest and fio, reduced to the figures the FSx report shows.

Units: bandwidth in MB/s (10^6 bytes per second, the unit of FSx's provisioned throughput);
IOR prints MiB/s and is converted. Metadata rates in operations per second.

Every parser takes the tool's output as text and raises ``ResultsError`` naming what is
missing when the text is not a finished run (a killed job leaves half an output behind).
Only the standard library is used: the parsers run on cluster nodes with a bare Python.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

MIB = 1024 * 1024
MB = 1_000_000


class ResultsError(ValueError):
    """A benchmark output is missing, truncated or from a failed run."""


@dataclass(frozen=True)
class Bandwidth:
    """Aggregate sequential bandwidth over all clients, MB/s (None: not measured)."""

    write_mb_s: Optional[float]
    read_mb_s: Optional[float]


@dataclass(frozen=True)
class MetadataRates:
    """Aggregate metadata operations per second over all clients."""

    creates_per_s: float
    stats_per_s: float
    removes_per_s: float


# --- IOR ---------------------------------------------------------------------------------------

def parse_ior_text(text: str) -> Bandwidth:
    """Mean write/read bandwidth from IOR's ``Summary of all tests:`` block (IOR 3.x and 4.x).

    Columns are located by their header names, so the IOR 4 ``Stonewall`` columns (absent in
    3.x) do not shift anything. With several tests in one run, the last row of each operation wins.
    """
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip().startswith("Summary of all tests:"))
    except StopIteration:
        raise ResultsError("IOR output has no 'Summary of all tests:' block: the run did not finish "
                           "(look at the job's error output for the reason)") from None
    header: list[str] = []
    rates: dict[str, float] = {}
    for line in lines[start + 1:]:
        fields = line.split()
        if not fields:
            if header:
                break
            continue
        if fields[0] == "Operation":
            header = fields
            continue
        if not header or fields[0] not in ("write", "read"):
            break
        row = dict(zip(header, fields))
        try:
            rates[fields[0]] = float(row["Mean(MiB)"]) * MIB / MB
        except (KeyError, ValueError):
            raise ResultsError(f"IOR summary row has no numeric Mean(MiB) column: {line.strip()!r}") from None
    if not rates:
        raise ResultsError("IOR 'Summary of all tests:' block has no write or read row")
    return Bandwidth(write_mb_s=rates.get("write"), read_mb_s=rates.get("read"))


def parse_ior_json(text: str) -> Bandwidth:
    """Mean write/read bandwidth from IOR's JSON output (``-O summaryFormat=JSON``)."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsError(f"IOR JSON output is not valid JSON ({exc}): the run did not finish") from None
    summary = document.get("summary") if isinstance(document, dict) else None
    if not summary:
        raise ResultsError("IOR JSON output has no 'summary' list: the run did not finish")
    rates: dict[str, float] = {}
    for entry in summary:
        operation = entry.get("operation")
        if operation in ("write", "read"):
            if "bwMeanMIB" not in entry:
                raise ResultsError(f"IOR JSON summary entry for {operation} has no bwMeanMIB")
            rates[operation] = float(entry["bwMeanMIB"]) * MIB / MB
    if not rates:
        raise ResultsError("IOR JSON 'summary' has no write or read entry")
    return Bandwidth(write_mb_s=rates.get("write"), read_mb_s=rates.get("read"))


# --- mdtest ------------------------------------------------------------------------------------

# "   File creation             :      15679.290      15679.290      15679.290          0.000"
# (mdtest 3.x prints the colon, 4.x does not; the four numbers are max, min, mean, std dev).
_MDTEST_ROW = re.compile(r"^\s*([A-Za-z][A-Za-z ]*?)\s*:?\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s*$")


def parse_mdtest(text: str) -> MetadataRates:
    """Mean file create/stat/remove rates from mdtest's ``SUMMARY rate:`` table."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("SUMMARY rate:"))
    except StopIteration:
        raise ResultsError("mdtest output has no 'SUMMARY rate:' table: the run did not finish "
                           "(look at the job's error output for the reason)") from None
    means: dict[str, float] = {}
    for line in lines[start + 1:]:
        if line.startswith(("SUMMARY", "--")) or (means and not line.strip()):
            break
        match = _MDTEST_ROW.match(line)
        if match:
            means[match.group(1)] = float(match.group(4))
    wanted = {"File creation": "creates_per_s", "File stat": "stats_per_s", "File removal": "removes_per_s"}
    missing = [name for name in wanted if name not in means]
    if missing:
        raise ResultsError(f"mdtest 'SUMMARY rate:' table lacks {', '.join(missing)}: "
                           "run mdtest with -F -C -T -r")
    return MetadataRates(**{field: means[name] for name, field in wanted.items()})


# --- fio ---------------------------------------------------------------------------------------

def load_fio_json(text: str, source: str = "fio output") -> dict:
    """fio's ``--output-format=json`` document; fio may print notes before the JSON itself."""
    match = re.search(r"^\{", text, re.MULTILINE)
    if not match:
        raise ResultsError(f"{source}: no JSON document (fio did not run or was killed)")
    try:
        document = json.loads(text[match.start():])
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{source}: truncated or invalid JSON ({exc})") from None
    jobs = document.get("jobs")
    if not jobs:
        raise ResultsError(f"{source}: JSON has no 'jobs'")
    for job in jobs:
        if job.get("error"):
            raise ResultsError(f"{source}: fio job {job.get('jobname')!r} failed with errno "
                               f"{job['error']} (e.g. 28 = no space left, 13 = permission denied)")
    return document


def _totals(documents: list[dict], directions: tuple[str, ...]) -> tuple[int, int, int]:
    """(bytes, operations, slowest runtime in ms) summed over every job of every document."""
    total_bytes = total_ops = slowest_ms = 0
    for document in documents:
        for job in document["jobs"]:
            for direction in directions:
                stats = job.get(direction, {})
                if stats.get("total_ios", 0):
                    total_bytes += int(stats["io_bytes"])
                    total_ops += int(stats["total_ios"])
                    slowest_ms = max(slowest_ms, int(stats["runtime"]))
    return total_bytes, total_ops, slowest_ms


def fio_aggregate_mb_s(documents: list[dict], direction: str) -> float:
    """Aggregate bandwidth of concurrent fio runs (one per node): all bytes / the slowest runtime.

    This is how IOR computes its figure too (aggregate size over the time of the slowest task),
    so a straggler node lowers the result instead of hiding behind the fast ones.
    """
    total_bytes, _, slowest_ms = _totals(documents, (direction,))
    if not total_bytes:
        raise ResultsError(f"fio results have no {direction} I/O")
    if slowest_ms <= 0:
        raise ResultsError(f"fio {direction} finished in under a millisecond: too small to time, "
                           "use a larger size (FSX_PERF_BLOCK)")
    return total_bytes / (slowest_ms / 1000) / MB


def fio_aggregate_ops(documents: list[dict]) -> float:
    """Aggregate operations per second of concurrent fio runs (filecreate/filestat/filedelete).

    Those engines count each file operation as one I/O; which direction carries it differs
    between fio versions, so all directions are summed.
    """
    _, total_ops, slowest_ms = _totals(documents, ("read", "write", "trim"))
    if not total_ops:
        raise ResultsError("fio results have no operations")
    if slowest_ms <= 0:
        raise ResultsError("fio metadata phase finished in under a millisecond: too small to time, "
                           "use more files (FSX_PERF_FILES_PER_TASK)")
    return total_ops / (slowest_ms / 1000)
