"""Per-environment settings (``<env>.yaml`` + ``settings.py``) and the ParallelCluster config built from them."""
