"""The seeded straggler study: the trainer's rule (training/resilience/straggler_rule.py) on simulated
intervals of model7's size (34 nodes x 8 GPUs), healthy noise fitted to the H200 probe
(local_cluster/stand_ins/probe_noise.py), and one fault at a time.

Each interval every rank gets a compute probe and a host probe (the fitted noise), a data wait (a share of the
interval, lognormal with median ``DATA_WAIT_SHARE``) and an arrival at the gather (normal, ``ARRIVAL_SD`` of the
interval); a fault changes one node's ranks:

  at_margin      the node's GPUs ``margin`` slower (the goodput model's straggler), every interval
  slow_30pct     30 % slower
  one_gpu        one of its GPUs 30 % slower (the others healthy)
  slow_4_of_5    30 % slower in 4 of every 5 intervals (from a random phase)
  loader         the node's ranks wait 20 % of each interval longer for data (a starved loader)
  link           the node's ranks reach the gather 20 % of an interval late (a slow link)

Per fault ``runs`` runs, each until the node is named or ``cap`` intervals: detected within the target, the
interval it was named at (median, p95), false alarms (another node, or the wrong cause). And one healthy run of
``days`` days of intervals with, every ``SAVE_EVERY`` intervals, a checkpoint's jitter (each node independently
up to ``SAVE_JITTER`` slower in every figure for that interval) and, every ``HICCUP_EVERY`` intervals, a host
hiccup: one rank for 5 intervals in a row, its host probe 1.5-3x, its compute probe 1.2x, its data wait and
arrival 10 % of the interval late (a long writer thread). Everything drawn from ``seed``: the same figures
every run. The previous rule (the slowest rank over the margin 5 intervals in a row) runs beside it on the
same figures for comparison.

The healthy figures besides the compute probe are assumptions (no measurement of them on the GPU machines):
the host probe the compute probe's noise, the data wait and arrivals as above.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from local_cluster.stand_ins import probe_noise
from training.config import TrainConfig
from training.resilience.straggler_rule import Figures, NodeRule

RULE = TrainConfig()  # the trainer's defaults: prod's rule

NODES, GPUS = 34, 8  # model7: 34 nodes x 8 H200
DATA_WAIT_SHARE, DATA_WAIT_SPREAD, ARRIVAL_SD = 0.002, 0.5, 0.002
SAVE_EVERY, SAVE_JITTER, HICCUP_EVERY, HICCUP_LENGTH = 6, 0.20, 100, 5


@dataclass(frozen=True)
class Fault:
    name: str
    cause: str  # what the rule must name
    slowdown: float
    target: int  # intervals within which it must be named
    pattern: int = 0  # 0: every interval; n: slow in n-1 of every n
    ranks: int = GPUS  # how many of the node's ranks (from its first)


def faults(margin: float) -> list[Fault]:
    return [Fault("at_margin", "gpu", margin, 10), Fault("slow_30pct", "gpu", 0.30, 5),
            Fault("one_gpu", "gpu", 0.30, 10, ranks=1),
            Fault("slow_4_of_5", "gpu", 0.30, 20, pattern=5), Fault("loader", "storage", 0.20, 10),
            Fault("link", "network", 0.20, 10)]


@dataclass
class Study:
    margin: float = RULE.straggler_margin
    intervals: int = RULE.straggler_intervals
    window: int = RULE.straggler_window
    interval_s: float = 235.0  # model7: log.interval 10 x ~23.5 s a step
    runs: int = 200
    cap: int = 25
    days: float = 14.0
    seed: int = 1

    @property
    def hosts(self) -> list[str]:
        return [f"node{n:02d}" for n in range(NODES) for _ in range(GPUS)]

    def rule(self) -> NodeRule:
        return NodeRule(self.hosts, margin=self.margin, intervals=self.intervals, window=self.window)

    def healthy(self, rng: np.random.Generator, length: int) -> dict[str, np.ndarray]:
        shape = (length, NODES * GPUS)
        return {"probe": probe_noise.ratios(rng, shape), "host": probe_noise.ratios(rng, shape),
                "wait": self.interval_s * DATA_WAIT_SHARE * rng.lognormal(0.0, DATA_WAIT_SPREAD, shape),
                "arrival": self.interval_s * rng.normal(0.0, ARRIVAL_SD, shape)}

    def judge(self, f: dict[str, np.ndarray], rule: NodeRule, stop=None) -> list[tuple[int, list]]:
        """Feed the intervals to the rule; (interval, its new findings) for each interval with any."""
        out = []
        for t in range(len(f["probe"])):
            new = rule.update(Figures(f["probe"][t].tolist(), f["host"][t].tolist(), f["wait"][t].tolist(),
                                      f["arrival"][t].tolist(), self.interval_s)).new
            if new:
                out.append((t + 1, new))
                if stop and stop(new):
                    break
        return out

    def run_fault(self, fault: Fault) -> dict:
        rng = np.random.default_rng([self.seed, sum(map(ord, fault.name))])
        every = self.healthy(rng, self.runs * self.cap)  # all runs' intervals at once: run i has rows i*cap...
        nodes = rng.integers(NODES, size=self.runs).tolist()
        phases = rng.integers(max(fault.pattern, 1), size=self.runs).tolist()
        detected, false_alarms, legacy = [], 0, []
        for run, (node, phase) in enumerate(zip(nodes, phases)):
            f = {k: v[run * self.cap:(run + 1) * self.cap] for k, v in every.items()}
            ranks = slice(node * GPUS, node * GPUS + fault.ranks)
            slow = np.ones(self.cap, dtype=bool)
            if fault.pattern:
                slow = (np.arange(self.cap) + phase) % fault.pattern != 0
            x = np.where(slow, fault.slowdown, 0.0)[:, None]
            if fault.cause == "gpu":
                f["probe"][:, ranks] *= 1 + x
            elif fault.cause == "storage":
                f["wait"][:, ranks] += x * self.interval_s
            else:
                f["arrival"][:, ranks] += x * self.interval_s
            name = f"node{node:02d}"
            found = self.judge(f, self.rule(), stop=lambda new: any(n.node == name for n in new))
            hit = [t for t, new in found for n in new if n.node == name and n.cause == fault.cause]
            detected.append(hit[0] if hit else math.inf)
            false_alarms += sum(1 for t, new in found for n in new if n.node != name or n.cause != fault.cause)
            if fault.cause == "gpu":
                legacy.append(self.previous_rule(f["probe"], node))
        return {**summary(detected, fault.target), "false_alarms": false_alarms, "cause": fault.cause,
                "slowdown": fault.slowdown, **({"previous_rule": summary(legacy, fault.target)} if legacy else {})}

    def previous_excess(self, probe: np.ndarray) -> tuple[list[int], list[float]]:
        """The rule before this one, its figure: per interval the slowest rank and its probe over the median of
        the other ranks', minus 1."""
        ranked = np.sort(probe, axis=1)
        others = ranked[:, :-1]
        n = others.shape[1]
        median = others[:, n // 2] if n % 2 else (others[:, n // 2 - 1] + others[:, n // 2]) / 2
        return probe.argmax(axis=1).tolist(), (ranked[:, -1] / median - 1).tolist()

    def previous_streaks(self, probe: np.ndarray) -> list[tuple[int, int]]:
        """(interval, rank) where the previous rule reported: the slowest rank over the margin 5 in a row."""
        suspect, over, out = -1, 0, []
        for t, (slowest, excess) in enumerate(zip(*self.previous_excess(probe))):
            over = over + 1 if excess > self.margin and slowest == suspect else int(excess > self.margin)
            suspect = slowest if excess > self.margin else -1
            if over == 5:
                out.append((t + 1, slowest))
        return out

    def previous_rule(self, probe: np.ndarray, node: int) -> float:
        reports = self.previous_streaks(probe)
        return reports[0][0] if reports and reports[0][1] // GPUS == node else math.inf

    def run_healthy(self) -> dict:
        rng = np.random.default_rng([self.seed, 0])
        length = int(self.days * 86400 / self.interval_s)
        f = self.healthy(rng, length)
        saves = np.arange(SAVE_EVERY - 1, length, SAVE_EVERY)
        jitter = rng.uniform(0.0, SAVE_JITTER, (len(saves), NODES)).repeat(GPUS, axis=1)
        for key in ("probe", "host"):
            f[key][saves] *= 1 + jitter
        for key in ("wait", "arrival"):
            f[key][saves] += jitter * self.interval_s
        hiccups = 0
        for start in range(HICCUP_EVERY // 2, length - HICCUP_LENGTH, HICCUP_EVERY):
            rank, span = int(rng.integers(NODES * GPUS)), slice(start, start + HICCUP_LENGTH)
            f["host"][span, rank] *= rng.uniform(1.5, 3.0)
            f["probe"][span, rank] *= 1.2
            f["wait"][span, rank] += 0.1 * self.interval_s
            f["arrival"][span, rank] += 0.1 * self.interval_s
            hiccups += 1
        found = self.judge(f, self.rule())
        legacy = len(self.previous_streaks(f["probe"]))
        return {"days": self.days, "intervals": length, "node_days": round(NODES * length * self.interval_s / 86400, 1),
                "saves": len(saves), "hiccups": hiccups,
                "false_evictions": sum(len(new) for _, new in found),
                "findings": [f"interval {t}: {n.node} {n.cause} {100 * n.excess:.1f} %" for t, new in found for n in new],
                "previous_rule_false_evictions": legacy}

    def run(self) -> dict:
        return {"setup": {"nodes": NODES, "gpus_per_node": GPUS, "margin": self.margin, "intervals": self.intervals,
                          "window": self.window, "interval_s": self.interval_s, "runs": self.runs, "cap": self.cap,
                          "seed": self.seed, "noise_sigma": round(probe_noise.SIGMA, 5),
                          "noise_tail": [probe_noise.TAIL_SHARE, probe_noise.TAIL_LOW, probe_noise.TAIL_HIGH]},
                "faults": {fault.name: self.run_fault(fault) for fault in faults(self.margin)},
                "healthy": self.run_healthy()}


def summary(detected: list[float], target: int) -> dict:
    ordered = sorted(detected)
    found = [d for d in ordered if math.isfinite(d)]
    p95 = ordered[math.ceil(0.95 * len(ordered)) - 1]
    return {"runs": len(ordered), "within_target": sum(d <= target for d in ordered), "target": target,
            "missed": len(ordered) - len(found),
            "median": statistics.median(ordered) if len(found) > len(ordered) / 2 else None, "p95": p95 if math.isfinite(p95) else None}


def table(result: dict) -> str:
    s = result["setup"]
    lines = [f"Straggler study: {s['nodes']} nodes x {s['gpus_per_node']} GPUs, rule: a node's median figure over the "
             f"margin {s['margin']:g} (less the noise allowance) in {s['intervals']} of the last {s['window']} log "
             f"intervals; {s['runs']} runs per fault, each up to {s['cap']} intervals; seed {s['seed']}.", "",
             "| fault | cause named | target (intervals) | within target | missed | false alarms | median | p95 | "
             "previous rule: within target, median |", "|---|---|---|---|---|---|---|---|---|"]

    def cell(v):
        return "-" if v is None else f"{v:g}"

    for name, r in result["faults"].items():
        old = r.get("previous_rule")
        prev = f"{old['within_target']}/{old['runs']}, {cell(old['median'])}" if old else "(no such cause)"
        lines.append(f"| {name} ({r['cause']} +{100 * r['slowdown']:.0f} %) | {r['cause']} | {r['target']} | "
                     f"{r['within_target']}/{r['runs']} | {r['missed']} | {r['false_alarms']} | {cell(r['median'])} | "
                     f"{cell(r['p95'])} | {prev} |")
    h = result["healthy"]
    lines += ["", f"Healthy: {h['days']:g} days ({h['intervals']} intervals, {h['node_days']:g} node-days), "
              f"{h['saves']} checkpoints with up to {100 * SAVE_JITTER:.0f} % jitter per node, {h['hiccups']} host "
              f"hiccups of {HICCUP_LENGTH} intervals on one rank: {h['false_evictions']} false eviction(s) "
              f"(previous rule: {h['previous_rule_false_evictions']})."]
    return "\n".join(lines)
