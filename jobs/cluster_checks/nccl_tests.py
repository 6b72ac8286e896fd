"""Read nccl-tests output (run with NCCL_DEBUG=INFO) into result rows and check the transport.

    python -m cluster_checks.nccl_tests LOG [LOG ...] --out-dir DIR

A log may hold several tests one after another (jobs/nccl_tests.sh appends all six); each test
starts with nccl-tests' "# Collective test starting: <binary>" line, or is named by its file
(``all_reduce_perf.log``). Rows use the out-of-place columns, as the nccl-tests summary does.

The transport check fails when NCCL used its TCP socket transport instead of the aws-ofi-nccl
(Libfabric) plugin on the efa provider: the usual silent failure when the plugin is missing or
mismatched. Exit status: 0 when every test passed its own data check and ran over EFA, 1 otherwise.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from cli import ArgumentParser, fail
from cluster_checks.results import Row, format_table, write_all

BINARIES = {
    "all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "broadcast_perf": "broadcast",
    "reduce_perf": "reduce", "reduce_scatter_perf": "reduce_scatter", "alltoall_perf": "all_to_all",
}
START = re.compile(r"^# Collective test starting: (\S+)", re.M)
RANK_LINE = re.compile(r"^#\s+Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)", re.M)
# size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
DATA_LINE = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\S+)\s+(-?\d+)\s+"
                       r"([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+"
                       r"([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s*$", re.M)
NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$", re.M)
PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([\w-]+)")
SOCKET = re.compile(r"via NET/Socket|NCCL INFO Using network Socket")


class ParseError(ValueError):
    pass


@dataclass(frozen=True)
class Transport:
    ok: bool
    message: str


def split_tests(text: str, source: str) -> list[tuple[str, str]]:
    """(collective, text) for each test in one log."""
    starts = list(START.finditer(text))
    if not starts:
        binary = Path(source).name.split(".")[0]
        if binary not in BINARIES:
            raise ParseError(f"{source}: no '# Collective test starting' line and the file name "
                             f"does not name an nccl-tests binary ({', '.join(BINARIES)})")
        return [(BINARIES[binary], text)]
    tests = []
    for i, m in enumerate(starts):
        binary = m.group(1)
        if binary not in BINARIES:
            raise ParseError(f"{source}: unknown nccl-tests binary {binary!r}")
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        tests.append((BINARIES[binary], text[m.start():end]))
    return tests


def parse_test(collective: str, text: str, source: str) -> list[Row]:
    world = len(RANK_LINE.findall(text))
    if world == 0:
        raise ParseError(f"{source}: {collective}: no '#  Rank N Group ...' lines; is this nccl-tests output?")
    rows = []
    for m in DATA_LINE.finditer(text):
        size, count, dtype = int(m.group(1)), int(m.group(2)), m.group(3)
        time_us, algbw, busbw, wrong = float(m.group(6)), float(m.group(7)), float(m.group(8)), m.group(9)
        rows.append(Row(collective, size, count, dtype, world, time_us, algbw, busbw,
                        correct=wrong == "0", ranks_checked=world if wrong != "N/A" else 0,
                        method="nccl-tests", backend="nccl"))
    if not rows:
        raise ParseError(f"{source}: {collective}: no result lines (did the test crash? see the log)")
    if re.search(r"^# Out of bounds values : [1-9]", text, re.M):
        rows = [replace(r, correct=False) for r in rows]
    return rows


def parse_logs(paths: list[Path]) -> tuple[list[Row], str]:
    rows, texts = [], []
    for path in paths:
        text = path.read_text(errors="replace")
        texts.append(text)
        for collective, section in split_tests(text, str(path)):
            rows.extend(parse_test(collective, section, str(path)))
    return rows, "\n".join(texts)


def check_transport(text: str) -> Transport:
    """Did NCCL's inter-node traffic go through aws-ofi-nccl on EFA?"""
    networks = sorted(set(NETWORK.findall(text)))
    providers = sorted(set(PROVIDER.findall(text)))
    if SOCKET.search(text):
        return Transport(False, "NCCL fell back to TCP sockets (NET/Socket), not EFA: the aws-ofi-nccl "
                                "plugin was not loaded or found no EFA device. Check that the plugin's "
                                "lib directory is on LD_LIBRARY_PATH (jobs/env.sh), that `fi_info -p efa` "
                                "lists devices, and the 'NET/Plugin' lines in this log.")
    if not networks:
        return Transport(False, "cannot tell which transport NCCL used: no 'NCCL INFO Using network' "
                                "line. Run with NCCL_DEBUG=INFO.")
    if not all("Libfabric" in n or "OFI" in n for n in networks):
        return Transport(False, f"NCCL used network {', '.join(networks)}, not the aws-ofi-nccl "
                                f"(Libfabric) plugin.")
    if providers != ["efa"]:
        found = ", ".join(providers) or "none reported"
        return Transport(False, f"aws-ofi-nccl loaded but the libfabric provider is {found}, not efa.")
    return Transport(True, f"EFA: NCCL network {', '.join(networks)}, libfabric provider efa")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cluster_checks.nccl_tests", description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        rows, text = parse_logs(args.logs)
    except OSError as e:
        return fail(e, "pass the *_perf.log files jobs/nccl_tests.sh wrote")
    except ParseError as e:  # the benchmark ran but did not finish: the check failed
        print(f"problem: {e}", file=sys.stderr)
        return 1
    transport = check_transport(text)
    title = f"nccl-tests: {rows[0].world_size} ranks"
    print(title)
    print(format_table(rows))
    paths = write_all(rows, args.out_dir, title, transport=transport.message, transport_ok=transport.ok)
    print("results:", ", ".join(str(p) for p in paths.values()))
    status = 0
    wrong = sorted({r.collective for r in rows if not r.correct})
    if wrong:
        print(f"problem: nccl-tests found wrong results in {', '.join(wrong)}", file=sys.stderr)
        status = 1
    if transport.ok:
        print(f"transport: {transport.message}")
    else:
        print(f"problem: {transport.message}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
