"""The suite's time by kind and by file, as the Markdown tables in docs/testing.md.

    SUITE_TIMES=/tmp/times.jsonl make test      # each test appends a line (tests/conftest.py)
    python scripts/suite_times.py /tmp/times.jsonl [--files N]   # N: only the N slowest files
    python scripts/suite_times.py /tmp/times.jsonl --slow-over S > tests/slow_tests.txt

--slow-over S lists the tests outside the local cluster that took more than S seconds of wall or CPU
time: tests/conftest.py marks them slow, which keeps them out of `make test-fast`.

Wall time is each test's own (setup, call, teardown); the four processes of `make test` (the tests on
the default local cluster, those on a second one, tests/training/ without a cluster, the rest) run side
by side, so the suite's wall time is the longest of them, not the sum. CPU time is the pytest process's and its
waited-for children's: the local cluster's jobs run under slurmd, not pytest, so their CPU is not in it.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

# What a test is, from where it lives; the first match wins. The local-cluster tests are those
# marked slurm, wherever they live.
KINDS = [
    ("tests/deploy/", "emulated account (ParallelCluster's validators)"),
    ("tests/cdk/test_checkov.py", "CDK synth and checkov"),
    ("tests/cdk/", "CDK synth and checkov"),
    ("tests/cluster_config/test_cluster_stack.py", "CDK synth and checkov"),
    ("tests/benchmarks/", "benchmark smoke"),
    ("tests/training/", "torch.distributed on CPUs (gloo)"),
    ("tests/storage_validation/", "torch.distributed on CPUs (gloo)"),
    ("tests/cluster_checks/", "torch.distributed on CPUs (gloo)"),
]
LOCAL_CLUSTER = "local cluster (real Slurm)"
UNIT = "unit"


def kind_of(record: dict) -> str:
    if record["slurm"]:
        return LOCAL_CLUSTER
    return next((kind for prefix, kind in KINDS if record["test"].startswith(prefix)), UNIT)


TRAINING = "tests/training/"  # make test runs these, outside the clusters, in a process of their own


def part_name(cluster: str) -> str:
    if cluster == TRAINING:
        return "tests/training/ without a cluster"
    if not cluster:
        return "the rest without a cluster"
    return "on the default cluster" if cluster == "default" else f"on the second cluster ({cluster})"


def tables(records: list[dict], files: int | None = None) -> str:
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    by_file: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0, ""])
    for r in records:
        for row in (by_kind[kind_of(r)], by_file[r["test"].split("::")[0]]):
            row[0] += 1
            row[1] += r["wall_s"]
            row[2] += r["cpu_s"]
        by_file[r["test"].split("::")[0]][3] = kind_of(r)
    parts: dict[str, float] = defaultdict(float)
    for r in records:  # lines written before the second cluster carry no "cluster": the default one ran them
        parts[r.get("cluster", "default") if r["slurm"] else TRAINING if r["test"].startswith("tests/training/") else ""] += r["wall_s"]
    lines = [
        "Minutes of tests in each process of `make test`: "
        + "; ".join(f"{part_name(name)}: {wall / 60:.1f}" for name, wall in sorted(parts.items(), key=lambda kv: -kv[1])) + ".",
        "",
        "| kind | tests | wall (s) | CPU (s) |",
        "|---|---:|---:|---:|",
    ]
    for kind, (n, wall, cpu) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {kind} | {n} | {wall:.0f} | {cpu:.0f} |")
    lines += ["", "| file | kind | tests | wall (s) | CPU (s) |", "|---|---|---:|---:|---:|"]
    for path, (n, wall, cpu, kind) in sorted(by_file.items(), key=lambda kv: -kv[1][1])[:files]:
        lines.append(f"| `{path}` | {kind} | {n} | {wall:.0f} | {cpu:.0f} |")
    return "\n".join(lines)


def slow_list(records: list[dict], seconds: float) -> str:
    slow = sorted(r["test"] for r in records if not r["slurm"] and max(r["wall_s"], r["cpu_s"]) > seconds)
    return (f"# Tests over {seconds:g} s of wall or CPU time in a measured run of `make test`, marked slow by\n"
            "# tests/conftest.py (out of `make test-fast`). Regenerate: docs/testing.md.\n" + "\n".join(slow) + "\n")


def main(argv: list[str]) -> int:
    option = argv[1] if len(argv) == 3 else None
    if len(argv) not in (1, 3) or option not in (None, "--files", "--slow-over"):
        print(__doc__, file=sys.stderr)
        return 2
    records = [json.loads(line) for line in Path(argv[0]).read_text().splitlines() if line.strip()]
    if option == "--slow-over":
        print(slow_list(records, float(argv[2])), end="")
    else:
        print(tables(records, int(argv[2]) if option else None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
