"""Goodput simulation: prod's seven models on 80 local Slurm nodes through two compressed weeks of node
failures and slow nodes, with 0 and with 2 spare nodes, stragglers evicted and (0 spares) unattended, beside
what cluster_config/goodput.py predicts.

    .venv/bin/python -m benchmarks.goodput_simulation [--spares 0 2] [--unattended 0] [--days 14] [--minutes 8]
        [--seed 1] [--failures-per-1000-node-days R] [--stragglers-per-1000-node-days R] [--replacement-min M]
        [--out benchmarks/results/goodput_simulation.json]

It brings up a cluster of its own beside the default one (local_cluster/cluster.sh as LOCAL_CLUSTER_NAME=sim:
80 slurmd in their own namespaces on 10.199.78.0/24, slurmctld, slurmdbd and MariaDB on ports +100,
booting prod's rendered config, so the head node creates prod's accounts and QOS), measures the local
restart and replacement once (every model training, one failure each), runs the days once per spare
count with the trainer evicting stragglers, then once per ``--unattended`` spare count without eviction
(``--minutes`` of wall time each; the same seed, so the same failures and slow nodes) and takes the cluster down;
a cluster already up with these nodes is used and left up. The whole run is bounded (``--limit-minutes``).
Writes the JSON and the tables as Markdown beside it (.md); exits 1 when a model held more than its
share, waited while its share stood idle, got stuck, or its ETTR is off the goodput model's for the
failures and stragglers it had by more than 20 % (``--compare``: with the calibrated restarts, or with each failure's
measured time to resume, which a run compressed so far that one restart is a large part of the window
needs: tests/local_cluster/test_goodput_simulation.py). docs/goodput.md says how to read it.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "jobs")]

from cli import ArgumentParser  # noqa: E402
from cluster_config.goodput import DAY_S  # noqa: E402
from cluster_config.settings import SettingsError  # noqa: E402
from local_cluster.client import unsupported_reason  # noqa: E402
from local_cluster.simulation.cluster import SimCluster  # noqa: E402
from local_cluster.simulation.report import TOLERANCE, format_table, results, within  # noqa: E402
from local_cluster.simulation.run import Scenario, calibrate, plan_models, simulate  # noqa: E402


class OutOfTime(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.goodput_simulation", description=__doc__.splitlines()[0])
    parser.add_argument("--spares", type=int, nargs="+", default=[0, 2],
                        help="spare node counts, one run each, stragglers evicted by the trainer")
    parser.add_argument("--unattended", type=int, nargs="*", default=[0], metavar="SPARES",
                        help="spare node counts, one more run each, stragglers left until a person acts "
                             "(train.straggler_evict=false); none: no such run")
    parser.add_argument("--days", type=float, default=14.0, help="simulated days per run")
    parser.add_argument("--minutes", type=float, default=8.0, help="wall minutes the simulated days take")
    parser.add_argument("--failures-per-1000-node-days", type=float, dest="rate",
                        help="failure rate (default: the settings' goodput.failures_per_1000_node_days)")
    parser.add_argument("--stragglers-per-1000-node-days", type=float, dest="slow_rate",
                        help="slow-node rate (default: the settings' goodput.stragglers_per_1000_node_days)")
    parser.add_argument("--replacement-min", type=float,
                        help="a failed node's replacement, simulated minutes (default: goodput.node_replacement_min)")
    parser.add_argument("--compare", choices=["calibrated", "resumes"], default="calibrated",
                        help="what the ETTR is held to: the goodput model with the calibrated restarts, or with "
                             "each failure's measured time to resume (the rework alone)")
    parser.add_argument("--gpu-share", type=float, default=0.5, help="of the failures, a GPU's; the rest lose the node")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--calibration-rounds", type=int, default=3, choices=(1, 2, 3),
                        help="failures per model measured before the runs (3: each kind for every model)")
    parser.add_argument("--nodes", type=int, help="cluster nodes (default: the plan's gpu_queue.max_count)")
    parser.add_argument("--limit-minutes", type=float,
                        help="stop (and take the cluster down) after this long (default: the runs' minutes + 8 each + 8)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/goodput_simulation.json")
    args = parser.parse_args(argv)
    if args.days <= 0 or args.minutes <= 0 or not 0 <= args.gpu_share <= 1 or min(args.spares + args.unattended) < 0:
        parser.error("--days and --minutes must be > 0, --gpu-share within 0..1, --spares and --unattended >= 0")
    reason = unsupported_reason()
    if reason:
        print(f"error: {reason} — run it as root on a machine with namespaces", file=sys.stderr)
        return 2
    scale = args.days * DAY_S / (args.minutes * 60)
    try:  # a bad --spares fails here, before anything boots
        planned = [plan_models(Scenario(spares=s, days=args.days, scale=scale, failures_per_1000_node_days=args.rate,
                                        replacement_min=args.replacement_min, gpu_share=args.gpu_share,
                                        stragglers_per_1000_node_days=args.slow_rate, evict=evict,
                                        seed=args.seed), nodes=args.nodes)
                   for s, evict in [(s, True) for s in args.spares] + [(s, False) for s in args.unattended]]
    except (SettingsError, ValueError) as exc:
        print(f"error: {exc} — choose other --spares or --nodes", file=sys.stderr)
        return 2
    nodes = args.nodes or planned[0][1].gpu_queue.max_count
    limit = args.limit_minutes or len(planned) * (args.minutes + 8) + 8

    def out_of_time(*_):
        raise OutOfTime(f"not done after --limit-minutes {limit:g}")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(int(limit * 60))
    cluster = SimCluster(nodes=nodes)
    started = time.monotonic()
    result: dict = {"nodes": nodes, "scale": scale, "tolerance": TOLERANCE, "runs": []}
    ok = True
    found_up = cluster.is_up()  # then left up; else started here (after clearing any other shape) and taken down
    try:
        if not found_up:
            cluster.down()
            result["up_s"] = cluster.up()
            print(f"cluster '{cluster.name}' up: {nodes} nodes in {result['up_s']:.0f} s")
        # with the most spares: a node free for each restart, as the model's recovery time means
        models, settings, scenario = max(planned, key=lambda p: (p[2].spares, p[2].evict))
        calibration = calibrate(cluster, models, settings, scenario, rounds=args.calibration_rounds)
        result["calibration"] = asdict(calibration)
        print("calibration, wall s: restart " + "; ".join(
            f"{m} " + ", ".join(f"{k} {v:.1f}" for k, v in kinds.items()) for m, kinds in calibration.recovery_wall.items())
              + f"; replacement {', '.join(f'{s:.1f}' for s in calibration.replacement_wall)}")
        for models, settings, scenario in planned:
            record = simulate(cluster, models, settings, scenario)
            rows = results(record, calibration)
            table = format_table(rows, record, calibration)
            print(table)
            given = "ettr_given_failures" if args.compare == "calibrated" else "ettr_given_resumes"
            ok = ok and all(not r["stuck"] and r["kept_share"] and within(r["ettr"], r[given]) for r in rows)
            result["runs"].append({"scenario": asdict(scenario), "rows": rows, "failures": record.failures,
                                   "stragglers": record.stragglers,
                                   "replacements": record.replacements, "quarantined": record.quarantined,
                                   "usage": record.usage, "wall_s": record.wall_s, "table": table})
    except OutOfTime as exc:
        print(f"error: {exc}; the cluster is taken down", file=sys.stderr)
        ok = False
    finally:
        signal.alarm(0)
        if not found_up:
            down = time.monotonic()
            cluster.down()
            result["down_s"] = time.monotonic() - down
    result["wall_s"] = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text("\n\n".join(run["table"] for run in result["runs"]) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.md')} ({result['wall_s']:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
