"""The trainer with silent data corruption injected on one rank, as a faulty GPU or its memory makes it.

    torchrun ... tests/training/corruption_faults.py KIND RANK STEP [ARG] --config ... (the trainer's arguments)

KIND:
  optim    after the optimizer step STEP, one bit of the first matrix's ``exp_avg`` flipped: memory
           corrupted at rest, just before the save of that step
  param    after the optimizer step STEP, one bit of the parameter whose name contains ARG flipped
           (the rank's local tensor: a TP-replicated norm weight under FSDP x TP)
  compute  from step STEP on, one activation of the first decoder layer's output perturbed in one of
           every ARG forward passes of the rank: a transient compute error, not a stored one
"""

from __future__ import annotations

import sys

import torch

from training import train

kind, rank, at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
arg = sys.argv[4] if kind in ("param", "compute") else None
trainer_args = sys.argv[5:] if arg is not None else sys.argv[4:]
train_step, forward_backward = train.Trainer.train_step, train.Trainer.forward_backward


def flip(tensor: torch.Tensor) -> None:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    with torch.no_grad():
        words = local.data.view(torch.int32).view(-1)
        words[0] = words[0] ^ (1 << 20)  # one mantissa bit of the first element


def corrupting_train_step(self, batches):
    result = train_step(self, batches)
    if self.step == at and self.d.rank == rank and kind in ("optim", "param"):
        if kind == "optim":
            name, param = next((n, p) for n, p in self.model.named_parameters() if p.dim() == 2)
            flip(self.optimizer.state[param]["exp_avg"])
            name += ":exp_avg"
        else:
            name, param = next((n, p) for n, p in self.model.named_parameters() if arg in n)
            flip(param)
        print(f"corruption_faults: flipped a bit of {name} on rank {rank} after step {at}", flush=True)
    return result


calls = 0


def perturbed_forward_backward(self, batch, *, sync_grads):
    global calls
    if kind != "compute" or self.d.rank != rank or self.step + 1 < at:
        return forward_backward(self, batch, sync_grads=sync_grads)
    calls += 1
    if calls % int(arg):
        return forward_backward(self, batch, sync_grads=sync_grads)
    layer = next(m for n, m in self.model.named_modules() if n.endswith("layers.0"))

    def perturb(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        bump = torch.zeros_like(hidden)
        bump.view(-1)[0] = 1e-2
        return (hidden + bump, *output[1:]) if isinstance(output, tuple) else hidden + bump

    handle = layer.register_forward_hook(perturb)
    try:
        print(f"corruption_faults: perturbed an activation on rank {rank} in step {self.step + 1}", flush=True)
        return forward_backward(self, batch, sync_grads=sync_grads)
    finally:
        handle.remove()


train.Trainer.train_step = corrupting_train_step
train.Trainer.forward_backward = perturbed_forward_backward
sys.exit(train.main(trainer_args))
