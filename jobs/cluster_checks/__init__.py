"""Is the cluster fit to train: its network, storage, input pipeline and, on day one, every part of it
(go / no-go). The measurements and checks the sbatch payloads in jobs/ run.

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

Acceptance (jobs/acceptance.sh), each module importing only those above it:
- ``verdict``: a check (pass, fail, not measured) and the go / no-go rule over all of them.
- ``node_checks``: queues boot, the jobs venv runs, node health, the GPU driver, ECC.
- ``network_checks``: all_reduce across nodes (EFA) and within one (NVLink), the transport, PyTorch's NCCL.
- ``storage_checks``: each FSx mount's throughput against what it is provisioned for.
- ``layout_checks``: each production layout, shrunk: initialization, loss, grad norm, memory, MFU, compile.
- ``drill``: a killed rank recovers with bit-identical losses, a stalled rank is detected.
- ``acceptance_report``: report.txt (the table) and report.png (one bar per check) beside report.json.
- ``acceptance``: the command line: reads the run's results folder, writes the report, runs the drill's steps.
- ``node_record``: what the acceptance run records on each node (health check, jobs venv, driver, ECC).

Fleet sweep (jobs/fleet_sweep.sh):
- ``fleet_sweep``: every node's health check, GPU diagnostics and storage read; the round-robin pairs of the
  all_reduce rounds (run by ``collectives``); the verdict on nodes and links, and the drains.
"""
