"""One result row per (collective, message size), shared by the torch benchmark and the nccl-tests parser.

The data only: ``report`` formats and writes rows, ``plot`` draws them; both import this module.

Sizes and bandwidths follow nccl-tests (its PERFORMANCE.md): ``size_bytes`` is the larger of a
rank's input and output buffers (the full gathered buffer for all_gather, the full input for
reduce_scatter, the whole per-rank buffer for all_to_all), algorithm bandwidth is size / time and
bus bandwidth scales it by how much data each rank must move over the slowest link, so the
figure is comparable with the hardware's link speed whatever the number of ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "all_to_all")


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor for ``collective`` over ``world_size`` ranks."""
    n = world_size
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")


@dataclass(frozen=True)
class Row:
    collective: str
    size_bytes: int
    count: int  # elements in the size_bytes buffer
    dtype: str
    world_size: int
    time_us: float  # per operation, slowest rank
    algbw_gbps: float  # GB/s, 1 GB = 1e9 bytes as in nccl-tests
    busbw_gbps: float
    correct: bool  # every checked rank got the expected result
    ranks_checked: int
    method: str  # "native", or how the collective was emulated when the backend lacks it
    backend: str

    @classmethod
    def measured(cls, collective: str, size_bytes: int, count: int, dtype: str, world_size: int,
                 seconds: float, correct: bool, ranks_checked: int, method: str, backend: str) -> Row:
        algbw = size_bytes / seconds / 1e9
        return cls(collective, size_bytes, count, dtype, world_size, seconds * 1e6, algbw,
                   algbw * bus_factor(collective, world_size), correct, ranks_checked, method, backend)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} GiB"
