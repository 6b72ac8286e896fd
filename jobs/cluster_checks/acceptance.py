"""The acceptance run's report: every check with its threshold and source, and one go / no-go.

    python -m cluster_checks.acceptance report DIR [--out OUT]
    python -m cluster_checks.acceptance drill-args --ranks N   (the drill's allocation-dependent overrides)

``jobs/acceptance.sh`` runs the checks and leaves their raw results in DIR; this module turns them
into ``report.json``, ``report.txt`` (the table) and ``report.png`` (one bar per check), written to
OUT (default DIR). Exit status: 0 go, 1 no-go, 2 bad input (no DIR or no ``expected.json``).

DIR holds (every part optional except ``expected.json``; a part that is missing makes its checks
"not measured", never absent, so no check is skipped silently):

    expected.json             what the run must cover: {"gpu": true, "queues": {"gpu": 2, "cpu": 1},
                              "layouts": ["model7", ...], "mounts": ["/fsx/data", ...], "job": "1234"}
    nodes/<node>.json         one per node (``node_checks.NodeRecord``): node_health.sh's exit code and
                              output, the jobs venv, the driver's and torch's CUDA versions, ECC counters
    nccl/inter_node/*_perf.log   nccl-tests (NCCL_DEBUG=INFO) across 2 nodes, as jobs/nccl_tests.sh runs it
    nccl/intra_node/*_perf.log   the same on 1 node (8 GPUs over NVLink)
    nccl/tcp_control/*_perf.log  a 2-node run forced onto TCP sockets (NCCL_NET=Socket): the transport
                              check must refuse it
    nccl/pytorch/*.log        the trainer's own NCCL (torch's, not the system NCCL nccl-tests links) at
                              NCCL_DEBUG=INFO: one file per rank of the drill's uninterrupted run
    storage/summary.json      python -m cluster_checks.fsx_perf --out DIR/storage (jobs/fsx_perf.sh)
    layouts/<name>.json       one per production layout, shrunk (``layout_checks.layout_checks`` lists the keys)
    drill/drill.json          python -m cluster_checks.acceptance drill (``drill.drill_record`` lists the keys)

Each part is judged by its own module (``node_checks``, ``network_checks``, ``storage_checks``,
``layout_checks``, ``drill``), the go / no-go by ``verdict``, the table and the plot by
``acceptance_report``. Torch is not imported.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import fields
from pathlib import Path
from typing import Mapping, Optional

from cli import ArgumentParser, fail
from cluster_checks.acceptance_report import render_table, write_report
from cluster_checks.drill import drill_checks, drill_overrides, drill_record, training_workers
from cluster_checks.layout_checks import layout_checks
from cluster_checks.network_checks import network_checks
from cluster_checks.node_checks import NodeRecord, node_checks
from cluster_checks.storage_checks import storage_checks
from cluster_checks.verdict import GO, Report, not_measured


class BadInput(ValueError):
    pass


def _known(cls, data: Mapping) -> dict:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _read_json(path: Path) -> Optional[dict]:
    """The file's JSON object; None if absent. A file that is there but unreadable raises BadInput."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path} is not valid JSON ({exc}) — the step that wrote it was cut off; rerun it") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path} holds {type(data).__name__}, not a JSON object — rerun the step that wrote it")
    return data


def assemble(results_dir: Path) -> Report:
    """The whole report from a results folder (the layout is in this module's docstring)."""
    if not results_dir.is_dir():
        raise BadInput(f"{results_dir} is not a folder — pass the acceptance job's results folder "
                       "(/fsx/logs/acceptance/<job id>)")
    manifest = _read_json(results_dir / "expected.json")
    if manifest is None or not isinstance(manifest.get("gpu"), bool):
        raise BadInput(f"no expected.json with \"gpu\": true|false in {results_dir} — jobs/acceptance.sh writes it "
                       "first; without it nothing says what the run had to cover")
    gpu = manifest["gpu"]
    records = [NodeRecord(**_known(NodeRecord, {"node": p.stem, **(_read_json(p) or {})}))
               for p in sorted((results_dir / "nodes").glob("*.json"))]
    checks = node_checks(records, manifest.get("queues") or {}, gpu)
    checks += network_checks(results_dir / "nccl", gpu)
    checks += storage_checks(_read_json(results_dir / "storage" / "summary.json"), manifest.get("mounts") or ())
    layouts = manifest.get("layouts") or []
    if not layouts:
        checks.append(not_measured("layouts: production layouts, shrunk", "every layout of the plan",
                                   "expected.json names no layouts", "cluster_config/plan.py"))
    for layout in layouts:
        checks += layout_checks(layout, _read_json(results_dir / "layouts" / f"{layout}.json"), gpu)
    checks += drill_checks(_read_json(results_dir / "drill" / "drill.json"))
    context = {k: manifest[k] for k in ("job",) if k in manifest}
    return Report(gpu, checks, {**context, "results_dir": str(results_dir)})


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m cluster_checks.acceptance", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="write report.json, report.txt and report.png; exit 0 go, 1 no-go")
    rep.add_argument("results_dir", type=Path, help="the acceptance job's results folder")
    rep.add_argument("--out", type=Path, help="where to write the report (default: results_dir)")
    drill = sub.add_parser("drill", help="write drill.json from the recovery and stall runs of jobs/acceptance.sh")
    drill.add_argument("drill_dir", type=Path, help="the results folder's drill/ (runs reference, recovered, stalled)")
    stall = drill.add_mutually_exclusive_group()
    stall.add_argument("--stall-detected-s", type=float, help="seconds from stopping a rank to the run ending "
                       "(omit: it never ended on its own)")
    stall.add_argument("--no-rank-stopped", action="store_true", help="the stalled run never reached the step "
                       "where a rank is stopped: the stall check says not measured")
    drill.add_argument("--timeout-s", type=float, required=True, help="the drill's collective timeout (train.timeout_s)")
    overrides = sub.add_parser("drill-args", help="print the drill's training overrides for its allocation")
    overrides.add_argument("--ranks", type=int, required=True, help="training ranks: nodes x workers per node")
    sig = sub.add_parser("signal", help="signal the training workers on a node (the drill's fault)")
    sig.add_argument("--node", required=True, help="the node whose workers to signal")
    sig.add_argument("--signal", required=True, choices=["KILL", "STOP", "CONT"])
    args = parser.parse_args(argv)
    if args.command == "signal":
        pids = training_workers(args.node)
        for pid in pids:
            os.kill(pid, getattr(signal, f"SIG{args.signal}"))
        print(f"SIG{args.signal} to {len(pids)} training worker(s) on {args.node}: {' '.join(map(str, pids))}")
        return 0 if pids else 1
    if args.command == "drill-args":
        try:
            print(" ".join(drill_overrides(args.ranks)))
        except ValueError as exc:
            return fail(exc)
        return 0
    if args.command == "drill":
        record = drill_record(args.drill_dir, args.stall_detected_s, args.timeout_s, not args.no_rank_stopped)
        (args.drill_dir / "drill.json").write_text(json.dumps(record, indent=1) + "\n")
        stall = f"stall detected in {args.stall_detected_s} s" if record["rank_stopped"] else "no rank stopped"
        print(f"drill: recovered {record['recovered']} (resumed from step {record['resumed_from_step']}), "
              f"{stall} -> {args.drill_dir / 'drill.json'}")
        return 0
    try:
        report = assemble(args.results_dir)
    except BadInput as exc:
        return fail(exc)
    paths = write_report(report, args.out or args.results_dir)
    print(render_table(report), end="")
    print("report:", ", ".join(str(p) for p in paths.values()))
    for check in report.blocking():
        print(f"problem: {check.name}: {check.status}: {check.why}", file=sys.stderr)
    return 0 if report.verdict == GO else 1


if __name__ == "__main__":
    sys.exit(main())
