"""Cluster validation helpers run by the sbatch payloads in jobs/.

- ``collectives``: torch.distributed collective benchmark with per-rank correctness checks.
- ``nccl_tests``: parser for nccl-tests output and the EFA transport check.
- ``results``: the shared result row, bus-bandwidth formulas, table / CSV / JSON output.
- ``plot``: bus bandwidth vs message size as a PNG.
"""
