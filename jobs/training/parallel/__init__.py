"""Parallelism: how the model is spread over the ranks, and what that costs in collectives.

  distributed    process groups, device mesh, FSDP2/HSDP/DDP x tensor parallel, compile, rank agreement
  communication  the least collective traffic of a layout, per layer and per step (counts, bytes); torch-free
"""
