"""Estimates for the plan, before any GPU is used; torch-free (cluster_config imports them).

  memory      analytic per-GPU memory and checkpoint size of a layout
  throughput  a step's time on the target (compute, exposed communication) and the MFU that follows
"""
