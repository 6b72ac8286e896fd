"""Validation loss on the held-out split, every ``eval.every`` steps, over every rank's share of it.

The split is made at preprocessing (``python -m data_pipeline.tokenize --val-fraction``: whole
documents, by a hash of their text) and lives in ``<data.path>/val``. Each rank reads its own
contiguous share through the same ``TokenLoader`` as training (split by rank, deterministic), always
from its first batch, so every evaluation scores exactly the same tokens: a resumed run reports the
same ``val_loss`` at the same step as an uninterrupted one. ``eval.batches`` caps the micro-batches
per rank (0: the whole share). Loss is summed over tokens and all-reduced with the token count, so
``val_loss`` is the mean over every evaluated token of every rank; ``perplexity`` is its exp.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from data_pipeline.loader import DatasetError, TokenLoader, read_dataset_meta

from training.parallel import distributed
from training.config import Config
from training.models.llama import compute_loss


class Evaluator:
    def __init__(self, cfg: Config, d: distributed.Dist, vocab_size: int):
        self.cfg, self.d = cfg, d
        try:
            read_dataset_meta(cfg.eval.path)
        except DatasetError as exc:
            raise DatasetError(f"eval.every is {cfg.eval.every} but there is no validation split: {exc}. Tokenize "
                               "with --val-fraction (jobs/preprocess.sh: VAL_FRACTION), point eval.path at one, "
                               "or set eval.every=0") from None
        dp_rank, dp_size = distributed.data_parallel_rank(d, cfg.train.tensor_parallel)  # a TP group reads alike
        self.loader = TokenLoader(cfg.eval.path, batch_size=cfg.train.micro_batch_size, seq_len=cfg.data.seq_len,
                                  rank=dp_rank, world_size=dp_size, num_workers=0, seed=cfg.data.seed,
                                  pin_memory=d.on_gpu, vocab_size=vocab_size)
        share = self.loader.batches_per_epoch  # the same on every rank: the loader splits evenly
        self.batches = min(cfg.eval.batches, share) if cfg.eval.batches else share
        self._start = self.loader.state_dict()  # batch 0 of this rank's share
        self.evaluations = 0  # done so far by this process (the first one compiles the layers for eval mode)

    def due(self, step: int) -> bool:
        """At every ``eval.every`` steps and at the end of training (not on a stop: the resumed run will)."""
        every = self.cfg.eval.every
        return bool(every) and (step % every == 0 or step == self.cfg.train.steps)

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """Mean loss over this evaluation's tokens on every rank; called on every rank at once."""
        start = time.perf_counter()
        self.loader.load_state_dict(self._start)
        was_training = model.training
        model.eval()
        totals = torch.zeros(2, dtype=torch.float64, device=self.d.device)  # loss sum, tokens
        batches = iter(self.loader)
        for _ in range(self.batches):
            batch = next(batches)
            inputs = batch["input_ids"].to(self.d.device, non_blocking=True)
            labels = batch["labels"].to(self.d.device, non_blocking=True)
            with distributed.autocast(self.d, self.cfg.train.parallelism), distributed.loss_parallel(self.cfg.train):
                totals[0] += compute_loss(model, inputs, labels, reduction="sum").double()
            totals[1] += labels.numel()
        model.train(was_training)
        # FSDP keeps the norm and output head gathered after a forward (reshard_after_forward=False: training's
        # backward reshards them): put back the shards the optimizer owns, as a training step leaves them. Else the
        # gathered copies hold their memory until the next step and the corruption checks
        # (training/resilience/replicas.py) would read other tensors than the optimizer's.
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        dist.all_reduce(totals)
        totals /= self.cfg.train.tensor_parallel  # the ranks of one tensor-parallel group scored the same tokens
        loss = (totals[0] / totals[1]).item()
        self.evaluations += 1
        return {"val_loss": loss, "perplexity": math.exp(min(loss, 700.0)), "val_tokens": int(totals[1].item()),
                "eval_s": time.perf_counter() - start}
