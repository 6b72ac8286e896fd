"""The GPU proof's lever stages: each lever of docs/training.md (Levers) on and off, on a recipe's 2-layer run.

Every run of a recipe starts from the same weights (``train.seed``) and reads the same seeded sequences
(``training.layout_check``), one micro-batch per step, so the runs differ only by the lever. Per lever the
report gives MFU and peak memory (allocated and reserved) against the recipe's bf16 run of the same stage, and
for float8 the losses of both over every step against ``LOSS_TOLERANCE``. What one GPU cannot show: async TP
(its overlap needs a node's 8 GPUs), bf16 gradient reduction and reducing once per step (nothing to reduce on
one rank): the acceptance run on the cluster measures those.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LOSS_STEPS = 50  # float8 against bf16: at least this many steps on the same data
# Each step's float8 loss within 0.05 nats + 3 % of the bf16 run's: float8's rounding (e4m3 forward, e5m2
# gradients, dynamic scales) moves a loss by a few parts in a thousand early on (torchtitan's float8 loss curves);
# a wiring fault (a layer left unscaled, a wrong cast) moves it by far more.
LOSS_ABS_TOLERANCE, LOSS_REL_TOLERANCE = 0.05, 0.03


@dataclass(frozen=True)
class Lever:
    name: str  # in the stage's name: lever:<recipe>:<name>
    settings: tuple[str, ...] = ()  # config overrides that turn it on
    env: dict = field(default_factory=dict)  # environment of the run (the allocator's)
    steps: int = 20
    limit_s: int = 120

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.name)

    def run(self, cpu: bool) -> dict:
        """The layout check's step counts: a short steady state, or LOSS_STEPS for a loss comparison."""
        steps = 4 if cpu else self.steps
        return {"steps": steps, "warmup": 1 if cpu else min(5, steps // 4), "compile_steps": 1, "compile_check": False}

    def overrides(self, cpu: bool) -> list[str]:
        return list(self.settings)


BF16 = Lever("bf16", steps=LOSS_STEPS, limit_s=150)  # the baseline every lever of its recipe is compared with
FLOAT8 = (Lever("float8=tensorwise", ("train.float8=tensorwise",), steps=LOSS_STEPS, limit_s=150),
          Lever("float8=rowwise", ("train.float8=rowwise",), steps=LOSS_STEPS, limit_s=150))
OTHERS = (
    Lever("fused_adamw", ("optim.fused=true",)),
    Lever("loss_chunks=8", ("train.loss_chunks=8",)),
    Lever("expandable_segments", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    # The recomputation policy: every layer, and none (the recipe's own is the baseline).
    Lever("recompute_every_layer", ("train.activation_checkpointing=true", "train.activation_checkpointing_every=1")),
    Lever("recompute_none", ("train.activation_checkpointing=false",)),
)
LEVERS = (BF16, *FLOAT8, *OTHERS)


def levers_for(largest: bool) -> tuple[Lever, ...]:
    """Every recipe: bf16 and tensorwise float8; the largest recipe (the 70B's) also rowwise and the others."""
    return LEVERS if largest else (BF16, FLOAT8[0])


def cpu_levers() -> tuple[Lever, ...]:
    """The CPU mode (make test): the same stages at tiny widths; float8 records its refusal there."""
    return (BF16, FLOAT8[0], OTHERS[1])


def _peak(r: dict, key: str) -> float | None:
    return r.get(key) if r.get("status") == "done" and not r.get("error") else None


def lever_comparisons(results: dict) -> list[dict]:
    """Each lever stage against its recipe's bf16 stage: MFU, peak memory, and for float8 the losses."""
    out = []
    for name, r in results.items():
        if not name.startswith("lever:") or name.endswith(":bf16"):
            continue
        _, recipe, lever = name.split(":", 2)
        base = results.get(f"lever:{recipe}:bf16", {})
        row = {"recipe": recipe, "lever": lever, "status": r.get("status")}
        if r.get("status") != "done" or r.get("error"):
            row["summary"] = f"not measured: {r.get('error') or r.get('why') or r.get('status')}"[:300]
            out.append(row)
            continue
        for key in ("mfu", "peak_memory_gib", "peak_reserved_gib"):
            on, off = _peak(r, key), _peak(base, key)
            row[key] = on
            row[f"{key}_bf16"] = off
            row[f"{key}_ratio"] = on / off if on and off else None
        parts = []
        if row["mfu_ratio"]:
            parts.append(f"MFU {100 * row['mfu']:.1f} % vs {100 * row['mfu_bf16']:.1f} % (x {row['mfu_ratio']:.3f})")
        if row["peak_memory_gib_ratio"]:
            parts.append(f"peak {row['peak_memory_gib']:.1f} vs {row['peak_memory_gib_bf16']:.1f} GiB")
        if row["peak_reserved_gib_ratio"]:
            parts.append(f"reserved {row['peak_reserved_gib']:.1f} vs {row['peak_reserved_gib_bf16']:.1f} GiB")
        if lever.startswith("float8"):
            row.update(losses_agree(r.get("losses") or [], base.get("losses") or []))
            parts.append(row["loss_summary"])
        row["summary"] = "; ".join(parts) or "no figures"
        out.append(row)
    return out


def losses_agree(low: list[float], bf16: list[float]) -> dict:
    """Float8's losses against bf16's, step by step (the same data and init): within the tolerance at every step."""
    steps = min(len(low), len(bf16))
    if steps < LOSS_STEPS:
        return {"losses_agree": None, "loss_summary": f"losses of {steps} common steps: fewer than {LOSS_STEPS}"}
    worst = max(abs(a - b) - (LOSS_ABS_TOLERANCE + LOSS_REL_TOLERANCE * abs(b)) for a, b in zip(low, bf16))
    largest = max(abs(a - b) for a, b in zip(low, bf16))
    agree = worst <= 0
    return {"losses_agree": agree, "loss_steps": steps, "loss_max_abs_difference": largest,
            "loss_summary": f"losses over {steps} steps {'agree' if agree else 'DIFFER'}: max |float8 - bf16| "
                            f"{largest:.3f} (tolerance {LOSS_ABS_TOLERANCE:g} + {LOSS_REL_TOLERANCE:.0%})"}
