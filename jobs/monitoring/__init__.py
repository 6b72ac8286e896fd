"""Monitoring on the head node: what alerts and the dashboard read (docs/monitoring.md).

Modules:
  exporter     ``python -m monitoring.exporter``: each model's training, Slurm and the file systems as
               Prometheus metrics in the node exporter's textfile folder; torch-free
  slurm        Slurm's commands (controller, database, nodes, jobs, restarts), each with a timeout
  filesystems  statvfs of the shared file systems, and the bytes of a checkpoint folder
"""
