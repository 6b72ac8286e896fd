"""Per-environment settings (``<env>.yaml`` + ``settings.py``) and the ParallelCluster config built from them.

The planner and the model jobs use the training code's torch-free parts (presets, sizing, the config
model) from ``jobs/``, which the CDK app does not install as a package: it goes on the path here.
"""

import sys
from pathlib import Path

_JOBS = str(Path(__file__).resolve().parent.parent / "jobs")
if _JOBS not in sys.path:
    sys.path.append(_JOBS)
