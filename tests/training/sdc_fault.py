"""The trainer with one bit of one parameter flipped on one rank after one step: silent data corruption,
as a GPU or an HBM cell that computes or stores a wrong value without an error makes it.

    torchrun ... tests/training/sdc_fault.py RANK STEP --config ... (the trainer's arguments)

The flip is in the rank's own copy (its local shard under HSDP) of the first matrix, after the
optimizer step: the next replica check must find it. Under Slurm only the job's first start flips it:
the requeue runs on other nodes, whose GPUs compute right (tests/training/sdc_launcher.sh).
"""

from __future__ import annotations

import os
import sys

import torch

from training import train

rank, after = int(sys.argv[1]), int(sys.argv[2])
train_step = train.Trainer.train_step


def corrupting_train_step(self, batches):
    result = train_step(self, batches)
    if self.step == after and self.d.rank == rank and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
        name, param = next((n, p) for n, p in self.model.named_parameters() if p.dim() == 2)
        local = param.to_local() if hasattr(param, "to_local") else param
        with torch.no_grad():
            words = local.data.view(torch.int32).view(-1)
            words[0] = words[0] ^ (1 << 20)  # one mantissa bit of the first element
        print(f"sdc_fault: flipped a bit of {name} on rank {rank} after step {after}", flush=True)
    return result


train.Trainer.train_step = corrupting_train_step
sys.exit(train.main(sys.argv[3:]))
