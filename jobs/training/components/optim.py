"""AdamW with decoupled weight decay on matrices only, and a cosine learning-rate schedule with warmup.

The schedule is a pure function of the step, so resuming needs nothing but the step number.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from training.config import OptimConfig

log = logging.getLogger("training")


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    # Norm gains and biases are vectors: decaying them toward zero only hurts (nanoGPT, GPT-3).
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused(params, cfg))


def fused(params: list[torch.Tensor], cfg: OptimConfig) -> bool | None:
    """``optim.fused`` where the parameters are on CUDA; None (torch's choice: foreach) otherwise, said once in
    the log, so a CPU rehearsal of a GPU config runs the same update."""
    if not cfg.fused:
        return None
    if params and params[0].device.type == "cuda":
        return True
    log.info("optim.fused: AdamW's fused kernel is used on CUDA only; this run's parameters are on %s: foreach",
             params[0].device.type if params else "no device")
    return None


def lr_at(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr`` at ``total_steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
