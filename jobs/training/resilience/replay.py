"""The sampled replay: a rank that computes a wrong value once, without an error, is caught by computing again.

A transient compute error on one rank (a flipped bit in an ALU, a register, an SRAM cell) leaves every
copy of the state equal: its wrong gradient is reduced into every replica, so the sentinel
(training/resilience/replicas.py) cannot see it, and under FSDP x TP (model7) there are no replicas at all.
Every ``train.replay_every`` steps the first micro-batch of the step is run twice, forward and backward on
the same inputs with the same RNG state, and each rank compares digests of the two runs before the
optimizer step:

- its own, local results: the loss and the gradient arriving at the embedding's output (every layer's
  backward of activations passes through it). These differ only on the rank (or the TP group) that
  computed wrong, so the mismatch names it and its node;
- the gradients of its parameters (its shard under FSDP, reduced over the data-parallel ranks when the
  micro-batch reduces them): a wrong weight gradient shows here, on every rank the reduction reached.

The replayed gradients replace the original ones (they are bit-identical when nothing went wrong), so a
clean run trains exactly as without the replay. A mismatch stops the run before the optimizer step,
as a replica mismatch does: the suspect ranks report their nodes, nothing is saved, and the requeued job
resumes from ``latest``. Where no local digest differs, the rank cannot be told: the run restarts without
draining a node.

Bit-exact comparison needs a reproducible computation: on a CPU, or on GPUs with ``train.deterministic``.
GPU kernels that reduce with atomics (fused attention backwards) differ run to run by rounding; there the
replay compares each digest to ``train.replay_tolerance`` (relative, on float64 sums of squares), or is off.
Errors it cannot see: one outside the replayed micro-batch, and a fault that computes the same wrong value
both times (a stuck unit): both runs agree.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from training.parallel.distributed import Dist
from training.resilience.replicas import ReplicaMismatch, bit_sum


class Replay:
    """``check`` runs one micro-batch's forward and backward twice and compares; ``due`` says when."""

    def __init__(self, model: nn.Module, d: Dist, hosts: list[str], *, every: int, tolerance: float):
        self.model, self.d, self.hosts, self.every, self.tolerance = model, d, hosts, every, tolerance
        self.embedding = next(m for name, m in model.named_modules() if name.endswith("embed_tokens"))
        self.replays = 0

    def due(self, step: int) -> bool:
        """Whether the step about to be taken (``step`` + 1) replays its first micro-batch."""
        return (step + 1) % self.every == 0

    def check(self, step: int, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``run()`` (one micro-batch's forward and backward into zeroed gradients) twice; its loss, once
        both agree. Raises ReplicaMismatch on every rank if any rank's runs differ."""
        rng = _rng_state(self.d)
        loss, local = self._run(run)
        original = (local, self._gradients())
        self.model.zero_grad(set_to_none=True)
        _set_rng_state(self.d, rng)
        loss, local = self._run(run)
        replayed = (local, self._gradients())
        self.replays += 1
        mine = torch.tensor([int(self._differ(original[0], replayed[0])), int(self._differ(original[1], replayed[1]))])
        flags = torch.zeros(self.d.world_size * 2, dtype=mine.dtype)
        dist.all_gather_into_tensor(flags, mine, group=self.d.control_group)
        flags = flags.view(self.d.world_size, 2)
        if not flags.any():
            return loss
        local_ranks = flags[:, 0].nonzero().flatten().tolist()
        grad_ranks = flags[:, 1].nonzero().flatten().tolist()
        named = ", ".join(f"rank {r} on {self.hosts[r]}" for r in local_ranks)
        if local_ranks:
            who = f"its loss or activation gradients differ on {named}"
        else:
            who = f"only the reduced gradients differ (on {len(grad_ranks)} ranks): the computing rank cannot be told"
        raise ReplicaMismatch(
            f"replay of step {step + 1}'s first micro-batch differs from its first run: {who}. Silent data "
            f"corruption in a computation: the run stops before the optimizer step, without saving, and resumes "
            f"from the last checkpoint", suspects=tuple(local_ranks),
            summary=f"replay of step {step + 1} differs" + (f" on {named}" if local_ranks else ""))

    def _run(self, run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss and this rank's local digest: the loss and the gradient at the embedding's output."""
        arriving: list[torch.Tensor] = []

        def keep_gradient(module, args, output):
            if output.requires_grad:
                output.register_hook(lambda grad: arriving.append(self._digest(grad)))

        handle = self.embedding.register_forward_hook(keep_gradient)
        try:
            loss = run()
        finally:
            handle.remove()
        return loss, torch.stack([self._digest(loss), *arriving]).cpu()

    def _gradients(self) -> torch.Tensor:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        return torch.stack([self._digest(g) for g in grads]).cpu() if grads else torch.zeros(0)

    def _digest(self, tensor: torch.Tensor) -> torch.Tensor:
        """Bit-exact: the bits summed as integers (int64); with a tolerance: the float64 sum of squares."""
        local = (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach()
        if self.tolerance == 0:
            return bit_sum(local)
        return local.double().square().sum()

    def _differ(self, first: torch.Tensor, second: torch.Tensor) -> bool:
        if first.shape != second.shape:
            return True
        if self.tolerance == 0:
            return bool((first != second).any())
        scale = torch.maximum(first.abs(), second.abs()).clamp_min(torch.finfo(torch.float64).tiny)
        return bool(((first - second).abs() > self.tolerance * scale).any())


def _rng_state(d: Dist) -> dict:
    return {"cpu": torch.get_rng_state(), **({"cuda": torch.cuda.get_rng_state(d.device)} if d.on_gpu else {})}


def _set_rng_state(d: Dist, state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], d.device)
