"""Cluster validation helpers run by the sbatch payloads in jobs/.

Network (jobs/collectives.sh, jobs/nccl_tests.sh):
- ``collectives``: torch.distributed collective benchmark with per-rank correctness checks.
- ``nccl_tests``: parser for nccl-tests output and the EFA transport check.
- ``results``: the shared result row and the bus-bandwidth formulas (data only).
- ``report``: the table, results.csv / results.json, and the plot (``report`` -> ``plot`` -> ``results``).
- ``plot``: bus bandwidth vs message size as a PNG.

Storage (jobs/fsx_perf.sh):
- ``fsx_perf``: runs IOR + mdtest (or fio) on every mount.
- ``io_results``: parsers for IOR, mdtest and fio output.
- ``fsx_report``: measured vs provisioned throughput, the summary table and JSON.

Input pipeline (jobs/input_diagnosis.sh):
- ``input_diagnosis``: measures the loader, host-to-device copies and real training steps.
- ``input_verdict``: the pure verdict (loader-, copy- or compute-bound) and the setting to change.

Acceptance (jobs/acceptance.sh):
- ``acceptance``: every check of the acceptance run with its threshold and source, and one go / no-go
- ``node_record``: what the acceptance run records on each node (health check, jobs venv, driver, ECC)
  (report.json, a table, report.png), built from the other modules' results.
"""
