"""The local two-node Slurm cluster: cluster.sh brings it up and down, client.py drives it from Python
and waits for jobs, training_demo.py runs the training demo on it, demo_data.py builds its dataset.

This side runs the job payloads and their packages: jobs/ is put on the import path here, as on
the cluster (jobs/env.sh), so ``python -m local_cluster.<module>`` works from the repository root.
"""

import sys
from pathlib import Path

_JOBS = str(Path(__file__).resolve().parent.parent / "jobs")
if _JOBS not in sys.path:
    sys.path.insert(0, _JOBS)
