"""The acceptance run's vocabulary and its one rule: a check's status, and go / no-go over all checks.

Every check module (``node_checks``, ``network_checks``, ``storage_checks``, ``layout_checks``,
``drill``) returns ``Check`` rows; ``Report`` holds them and decides. The rule (``Report.blocking``):
"go" only when no check failed and every check that must run on the target ran and passed. On a
GPU cluster (``gpu=True``) that is every check: a GPU check that says "not measured" there is a
no-go, since it is exactly what the run is for. On a CPU cluster (the local rehearsal,
``gpu=False``) a check that needs a GPU cannot run and says "not measured: no GPU"; that alone does
not block, but every other check must still pass. A CPU "go" means the run and its wiring work,
not that any GPU is fit for training.

The table and the plot of a report are ``acceptance_report``'s.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Optional

PASS, FAIL, NOT_MEASURED = "pass", "fail", "not measured"
GO, NO_GO = "go", "no-go"


@dataclass(frozen=True)
class Check:
    name: str  # "<section>: <what>", e.g. "network: all_reduce across 2 nodes (EFA)"
    status: str  # PASS, FAIL or NOT_MEASURED
    measured: str  # what the run saw, with units ("" when not measured)
    expected: str  # the pass condition, with units
    why: str  # on a fail or not measured: the cause and the runbook's first action; on a pass: context
    source: str  # where the threshold comes from (a publication, a spec, a project file)
    needs_gpu: bool = False  # cannot run on a CPU cluster
    ratio: Optional[float] = None  # measured / expected where both are numbers (the plot's bar)
    limit: Optional[float] = None  # the ratio at which the check passes (the plot's tick)

    @classmethod
    def no_gpu(cls, name: str, expected: str, source: str) -> Check:
        """A GPU check on a cluster without GPUs: it says so instead of disappearing."""
        return cls(name, NOT_MEASURED, "", expected, "no GPU: this check runs on the GPU cluster", source,
                   needs_gpu=True)


def check(name: str, ok: bool, measured: str, expected: str, why_fail: str, source: str, *,
          why_pass: str = "", needs_gpu: bool = False, ratio: Optional[float] = None,
          limit: Optional[float] = None) -> Check:
    """A check that ran: PASS with ``why_pass`` or FAIL with ``why_fail``."""
    return Check(name, PASS if ok else FAIL, measured, expected, why_pass if ok else why_fail, source,
                 needs_gpu, ratio, limit)


def not_measured(name: str, expected: str, why: str, source: str, needs_gpu: bool = False) -> Check:
    """A check with nothing to judge: ``why`` names the step that left no result."""
    return Check(name, NOT_MEASURED, "", expected, why, source, needs_gpu)


@dataclass
class Report:
    gpu: bool  # the cluster under test has GPUs: every check must run and pass
    checks: list[Check] = field(default_factory=list)
    context: dict = field(default_factory=dict)  # job id, folder: copied into report.json

    def blocking(self) -> list[Check]:
        """The checks that make it a no-go (see the module's docstring for the rule)."""
        return [c for c in self.checks
                if c.status == FAIL or (c.status == NOT_MEASURED and (self.gpu or not c.needs_gpu))
                or c.status not in (PASS, FAIL, NOT_MEASURED)]

    @property
    def verdict(self) -> str:
        # No checks at all says nothing about the cluster: not a go.
        return GO if self.checks and not self.blocking() else NO_GO

    def as_dict(self) -> dict:
        return {**self.context, "verdict": self.verdict, "gpu": self.gpu,
                "blocking": [c.name for c in self.blocking()],
                "checks": [asdict(c) for c in self.checks]}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2) + "\n"
