"""Train a Llama-style causal LM over packed token shards; resumes from the latest checkpoint.

    torchrun --nproc-per-node=2 -m training.train --config jobs/training/configs/tiny.yaml train.steps=50

Run under Slurm by jobs/train.sh. On exit, rank 0 writes ``<checkpoint.dir>/STATUS``: ``complete``
(all steps done, final checkpoint saved) or ``stopped`` (a signal asked to stop; a checkpoint of
the last finished step was saved), which the batch script uses to back up or requeue.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import logging
import os
import sys
import time
import zlib
from pathlib import Path
from typing import NoReturn

import torch
from atomic_file import write_atomic
from cli import ArgumentParser, fail
from data_pipeline.loader import DatasetError, TokenLoader, check_compatible, read_dataset_meta
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from training.parallel import distributed

from training.models import hf_weights

from training.resilience import heartbeat, node_suspect, replay, replicas, stragglers
from training.checkpoints.checkpointer import CheckpointInUse, CheckpointMismatch, Checkpointer, NoRoomForCheckpoint, NothingLoadable
from training.checkpoints.snapshot import Snapshots, planned_grow_stop
from training.config import Config, ConfigError, config_keys, load_config
from training.components.determinism import set_determinism
from training.components.evaluate import Evaluator
from training.components.metrics import Metrics
from training.models.llama import allocate, build_model, compute_loss, count_parameters, flops_per_token, hf_config, init_weights
from training.components.optim import build_optimizer, lr_at, set_lr
from training.models.presets import resolve
from training.resilience.signals import StopRequest
from training.resilience.watchdog import ProgressWatchdog

log = logging.getLogger("training")


def train(cfg: Config, d: distributed.Dist) -> str:
    """Run until ``train.steps`` or a stop request; returns the final status."""
    return Trainer(cfg, d).train()


def build(cfg: Config, model_config, d: distributed.Dist, mesh, *, mixed_precision: bool | None = None,
          allocating=contextlib.nullcontext(), initialize: bool = True):
    """The parallelized, initialized model and its optimizer, as every rank of the job builds them.

    Shared with the dry run (``training.dry_run``), which forces the GPU choices on a CPU and
    allocates inside its fake-tensor mode (``allocating``) without drawing values (``initialize``:
    fake tensors hold none; the draw was a quarter of the 70B dry run's time); wrapping works on the
    meta device.
    """
    def fill(model):
        if initialize:
            init_weights(model, model_config, d.device, cfg.train.seed)
        else:
            allocate(model, model_config, d.device)

    model = build_model(model_config)
    if cfg.train.parallelism == "ddp":
        with allocating:
            fill(model)
            model = distributed.parallelize(model, cfg.train, d, mesh, mixed_precision=mixed_precision,
                                            init_sync=initialize)
            return model, build_optimizer(model, cfg.optim)
    # Shard first, so each rank allocates only its shard.
    model = distributed.parallelize(model, cfg.train, d, mesh, mixed_precision=mixed_precision)
    with allocating:
        fill(model)
        return model, build_optimizer(model, cfg.optim)


EVICTED = 1  # a worker's exit code after evicting a straggler's node: a failure, requeued by jobs/train.sh


class NodeEvicted(RuntimeError):
    """The run leaves a node it judged faulty (a straggler), after saving: it should resume elsewhere."""


def keep_compile_cache(checkpoint_dir: str) -> None:
    """torch.compile's caches in the model's checkpoint folder on shared storage (unless the environment names
    another): a requeued job, on any node, reuses the compiled layers instead of compiling them again."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(checkpoint_dir) / "compile_cache"))


class Trainer:
    """Built once (``__init__``), then ``train`` loops over ``train_step``, which runs ``forward_backward``
    on each micro-batch. Checkpoint state and resume are ``app_state`` and ``_resume``."""

    def __init__(self, cfg: Config, d: distributed.Dist):
        # First: a signal during start-up is not lost, and the data-loader workers forked later inherit
        # the handler, so Slurm's SIGTERM to every process of the step does not kill them before the save.
        self.stop = StopRequest()
        self.cfg, self.d = cfg, d
        # A rank with no step within the window dumps its stacks and exits, so the job recovers.
        self.watchdog = ProgressWatchdog(log_dir=cfg.log.dir, rank=d.rank, init_timeout_s=cfg.train.init_timeout_s,
                                         floor_s=cfg.train.watchdog_floor_s, factor=cfg.train.watchdog_factor,
                                         failure_file=os.environ.get("TRAIN_FAILURE_FILE"), on_gpu=d.on_gpu).start()
        # A node that stops answering (lost) ends the step within train.peer_timeout_s, not train.timeout_s.
        self.heartbeat = heartbeat.start(rank=d.rank, world_size=d.world_size, peer_timeout_s=cfg.train.peer_timeout_s,
                                         collective_timeout_s=cfg.train.timeout_s,
                                         failure_file=os.environ.get("TRAIN_FAILURE_FILE"))
        if d.is_main:
            log.info("config %s", json.dumps(cfg.to_dict(), sort_keys=True))

        if cfg.train.async_tp and not d.on_gpu:
            raise ConfigError("train.async_tp needs GPUs (symmetric memory over NVLink); set train.async_tp: false here")
        set_determinism(cfg.train.deterministic)  # before the first matmul: cuBLAS reads its setting then
        keep_compile_cache(cfg.checkpoint.dir)
        meta = read_dataset_meta(cfg.data.path)
        self.arch = resolve(cfg.model.preset)
        vocab_size = self.arch.vocab or cfg.model.vocab_size or -(-meta.vocab_size // 64) * 64
        check_compatible(meta, seq_len=cfg.data.seq_len, vocab_size=vocab_size)
        model_config = hf_config(self.arch, vocab_size, cfg.data.seq_len)
        total_params, _ = count_parameters(model_config)
        log.info("model %s: %.3gM parameters, vocab %d, %s x tensor parallel %d over %d ranks on %s", cfg.model.preset,
                 total_params / 1e6, vocab_size, cfg.train.parallelism, cfg.train.tensor_parallel, d.world_size, d.device)

        self.mesh = distributed.device_mesh(d, cfg.train)
        self.model, self.optimizer = build(cfg, model_config, d, self.mesh)
        if cfg.train.deterministic and cfg.train.parallelism == "ddp":
            distributed.reduce_each_parameter(self.model)  # sums independent of DDP's bucket layout
        self.accum = cfg.grad_accum_steps(d.world_size)
        dp_rank, dp_size = distributed.data_parallel_rank(d, cfg.train.tensor_parallel)
        self.loader = TokenLoader(cfg.data.path, batch_size=cfg.train.micro_batch_size, seq_len=cfg.data.seq_len,
                                  rank=dp_rank, world_size=dp_size, num_workers=cfg.data.num_workers,
                                  seed=cfg.data.seed, pin_memory=d.on_gpu, vocab_size=vocab_size,
                                  timeout_s=cfg.data.timeout_s, global_batch_size=cfg.train.global_batch_size)
        # What must match to resume: the model's shape, and the global batch (the data order depends on it).
        identity = {"preset": cfg.model.preset, "vocab_size": vocab_size, "seq_len": cfg.data.seq_len,
                    "global_batch_size": cfg.train.global_batch_size,
                    "layers": model_config.num_hidden_layers, "hidden": model_config.hidden_size}
        # HSDP: the ranks holding copies of this rank's shards; only replica 0 reads and writes them.
        replicate_group = self.mesh["dp_replicate"].get_group() if cfg.train.parallelism == "hsdp" else None
        self.ckpt = Checkpointer(cfg.checkpoint.dir, keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save,
                                 d=d, identity=identity, replicate_group=replicate_group)
        # A snapshot is one rank's shard: it loads on the model and parallelism that wrote it, on any world size.
        self.snapshots = Snapshots(cfg.checkpoint.snapshot_dir, cfg.name, every=cfg.checkpoint.snapshot_every, d=d, layout={
            **identity, "parallelism": cfg.train.parallelism, "tensor_parallel": cfg.train.tensor_parallel,
            "world_size": d.world_size}) if cfg.checkpoint.snapshot_every else None
        with self.watchdog.allow(cfg.train.init_timeout_s):  # reading a large checkpoint takes minutes
            fresh = self.ckpt.latest_step() < 0 and not self.ckpt.steps()
            self.step = self._resume_from_snapshot()
            if self.step:
                fresh = False
            else:
                self.step = self._resume()
            if fresh and cfg.model.init_from:
                self.start_from_released_weights()
            elif cfg.model.init_from:
                log.info("model.init_from %s is ignored: %s already holds this run's checkpoints, and it resumed from "
                         "step %d (the released weights start a run only once, as its step 0)",
                         cfg.model.init_from, self.ckpt.dir, self.step)
        self.evaluator = Evaluator(cfg, d, vocab_size) if cfg.eval.every else None
        hosts = distributed.hostnames(d)
        self.evict_stragglers = stragglers.evicts(cfg.train.straggler_evict, on_gpu=d.on_gpu)
        self.rank_timing = stragglers.RankTiming(d, hosts, margin=cfg.train.straggler_margin,
                                                 intervals=cfg.train.straggler_intervals,
                                                 window=cfg.train.straggler_window)
        # Corruption checks: state at rest and its copies before every save, a sampled replay of computation.
        self.at_rest, self.sentinels = None, []
        if cfg.train.replica_check_every:
            self.at_rest = replicas.AtRest(self.model, self.optimizer, d.rank, hosts[d.rank])
            self.sentinels = replicas.sentinels(cfg.train.parallelism, cfg.train.tensor_parallel, self.mesh, d,
                                                self.model, self.optimizer, hosts)
        self.replay = None
        if cfg.train.replay_every and (not d.on_gpu or cfg.train.deterministic or cfg.train.replay_tolerance):
            self.replay = replay.Replay(self.model, d, hosts, every=cfg.train.replay_every,
                                        tolerance=cfg.train.replay_tolerance)
        elif cfg.train.replay_every and d.is_main:
            log.warning("replay check: off (GPU kernels that are not deterministic differ run to run; set "
                        "train.deterministic: true, or train.replay_tolerance to compare within it)")
        self.metrics = Metrics(log_dir=cfg.log.dir, tensorboard_dir=cfg.log.tensorboard_dir, is_main=d.is_main,
                               world_size=d.world_size, device=d.device,
                               tokens_per_step=cfg.train.global_batch_size * cfg.data.seq_len,
                               flops_per_token=flops_per_token(model_config, cfg.data.seq_len), run_name=cfg.name,
                               config=cfg.to_dict(), start_step=self.step, total_steps=cfg.train.steps,
                               wandb_project=cfg.log.wandb_project)

    def train(self) -> str:
        """The loop: one optimizer step, the stop vote, maybe log, maybe checkpoint."""
        cfg, d, ckpt, metrics = self.cfg, self.d, self.ckpt, self.metrics
        metrics.event(kind="start", step=self.step, world_size=d.world_size, resumed=self.step > 0,
                      resumed_from=self.metrics_resume)
        self.snapshot_noted = self.snapshots.last_written if self.snapshots else -1
        batches = iter(self.loader)
        stopping = kept = False  # kept: the state held in memory for the requeue, not saved (snapshots.hold)
        first_step, last_save = self.step, time.monotonic()
        while self.step < cfg.train.steps and not stopping:
            loss, grad_norm, lr = self.train_step(batches)
            self.watchdog.step_done(self.step)
            if self.step == first_step + 1:  # start-up is over: the short collective timeout from now on
                distributed.set_timeout(d, cfg.train.timeout_s)
            ckpt.poll()
            self.note_snapshot()
            stopping = distributed.any_rank(self.stop.requested, d)
            last_step = self.step == cfg.train.steps
            last = last_step or stopping
            evict = None  # the straggler whose node this run leaves, after saving
            if self.step % cfg.log.interval == 0 or last:
                ranks = self.rank_timing.interval(metrics.data_wait, metrics.clock() - metrics.interval_start)
                for found in ranks.new:
                    self.report_straggler(found)
                if self.evict_stragglers and not last:  # the same figures on every rank: the same choice
                    remaining_s = (cfg.train.steps - self.step) * ranks.interval_s / cfg.log.interval
                    evict = next((f for f in ranks.standing if stragglers.worth_evicting(
                        f, remaining_s=remaining_s, cost_s=cfg.train.straggler_evict_cost_s)), None)
                metrics.emit(self.step, loss=distributed.mean_over_ranks(loss.item(), d), lr=lr,
                             grad_norm=grad_norm.item(), extra=ranks.fields())
            if self.evaluator and self.evaluator.due(self.step):
                # An evaluation is no training step; the first one compiles every layer again (eval mode),
                # so its collectives get the start-up timeout, as the watchdog gives it the start-up window.
                first = self.evaluator.evaluations == 0
                with (self.watchdog.allow(cfg.train.init_timeout_s),
                      distributed.collective_timeout(d, cfg.train.init_timeout_s) if first else contextlib.nullcontext()):
                    result = self.evaluator.evaluate(self.model)
                metrics.emit_eval(self.step, result, result["eval_s"])
            due = self.step % cfg.checkpoint.every == 0 or last
            if stopping and not last_step and self.snapshots and distributed.any_rank(planned_grow_stop(), d):
                # Growing back onto the whole allocation: the state crosses the requeue in the nodes' memory.
                with self.watchdog.allow(cfg.train.init_timeout_s):
                    kept = self.snapshots.hold(self.step, self.app_state())
                due = due and not kept
            if cfg.checkpoint.every_minutes and not due:  # on any rank's clock, so all ranks save together
                due = distributed.any_rank(time.monotonic() - last_save >= 60 * cfg.checkpoint.every_minutes, d)
            if self.at_rest and (due or evict or self.step % cfg.train.replica_check_every == 0):
                self.check_replicas()  # before a save: no checkpoint holds changed state or disagreeing copies
            if due or evict:
                with self.watchdog.allow(cfg.train.init_timeout_s):  # a final save is synchronous, an eviction's too
                    metrics.add_checkpoint_block(ckpt.save(self.step, self.app_state(), wait=last or evict is not None,
                                                           meta=self.replica_meta()))
                last_save = time.monotonic()
            elif self.snapshots and self.snapshots.due(self.step) and not last:
                self.snapshots.poll()
                metrics.add_checkpoint_block(self.snapshots.take(self.step, self.app_state()))
            if evict:
                self.evict(evict)

        with self.watchdog.allow(cfg.train.init_timeout_s):
            ckpt.close()
            if self.snapshots:  # this step is on the file system (or kept for the requeue): the others are of no use
                self.snapshots.close(remove=not kept)
        self.watchdog.close()
        if self.heartbeat:  # this node has finished: the others, maybe still saving, do not count it lost
            self.heartbeat.close()
        status = "complete" if self.step >= cfg.train.steps else "stopped"
        if stopping:
            log.warning("stopped at step %d on %s after %s", self.step, self.stop.signal_name or "another rank's signal",
                        "keeping its state in the nodes' memory for the requeue" if kept else "saving a checkpoint")
        metrics.event(kind=status, step=self.step, signal=self.stop.signal_name, **({"kept_in_memory": True} if kept else {}))
        metrics.close()
        if d.is_main:
            write_atomic(ckpt.dir / "STATUS", status + "\n")
        return status

    def note_snapshot(self) -> None:
        """A ``snapshot`` event once a snapshot in memory is whole on every node (its writer reports it)."""
        if not self.snapshots:
            return
        self.snapshots.poll()
        if self.snapshots.last_written > self.snapshot_noted:
            self.snapshot_noted = self.snapshots.last_written
            self.metrics.event(kind="snapshot", step=self.snapshot_noted, write_s=round(self.snapshots.last_write_s, 3))

    def straggler_line(self, found: stragglers.Finding) -> str:
        return stragglers.describe(found, margin=self.cfg.train.straggler_margin)

    def report_straggler(self, found: stragglers.Finding) -> None:
        """Once per episode: the node that held the others back, and why, in straggler_intervals of the window."""
        if self.d.is_main:
            log.warning("%s", self.straggler_line(found))
        self.metrics.event(kind="straggler", step=self.step, rank=found.rank, node=found.node, cause=found.cause,
                           excess_pct=round(100 * found.excess, 1), intervals=found.counted,
                           window=found.window, scope=found.scope, margin_pct=100 * self.cfg.train.straggler_margin)

    def evict(self, found: stragglers.Finding) -> None:
        """Leave the straggler's node: the checkpoint of this step is saved (by every rank, synchronously);
        the straggler's rank reports its node to the epilog, which drains it; FAILURE says why, and every
        rank exits non-zero, so jobs/train.sh requeues the job (a recovery, counted against the retry
        budget: a run that finds a straggler on every allocation ends) and it resumes from this step."""
        why = f"{self.straggler_line(found)}; saved step {self.step}, evicting the node"
        if self.d.rank == found.rank:  # the node's first rank speaks for it
            node_suspect.report(why)
        self.metrics.event(kind="evict", step=self.step, rank=found.rank, node=found.node, cause=found.cause,
                           reason="straggler", excess_pct=round(100 * found.excess, 1))
        if self.d.is_main:
            log.error("%s: exiting for the job to be requeued on other nodes", why)
            _report_failure(why)
        distributed.any_rank(False, self.d)  # the report and FAILURE written before any rank exits (srun then ends all)
        with self.watchdog.allow(self.cfg.train.init_timeout_s):
            self.ckpt.close()
        self.watchdog.close()
        self.metrics.close()
        raise NodeEvicted(why)

    def check_replicas(self) -> None:
        """The at-rest and copy checks on every rank; all ranks stop together if any rank's state is corrupt."""
        mismatch = None
        # Every one (the copies' are collectives); the copies' verdict first: every rank of a group reaches it.
        for check in (*(s.check for s in self.sentinels), self.at_rest.check):
            try:
                check(self.step)
            except replicas.ReplicaMismatch as exc:
                mismatch = mismatch or exc
        if not distributed.any_rank(mismatch is not None, self.d):
            return
        self.stop_for_corruption(mismatch)

    def stop_for_corruption(self, mismatch: replicas.ReplicaMismatch | None) -> NoReturn:
        """Stop every rank without saving: the suspects report their nodes to the epilog, the run exits to be
        requeued and resumes from `latest` (verified at its step). ``mismatch``: None where another rank found it."""
        if self.snapshots:  # taken since the copies last agreed: the relaunch reads the (checked) file system
            self.snapshots.discard()
        if mismatch is not None and self.d.rank in mismatch.suspects:
            # No save: this state is suspect; the requeued job resumes from `latest`, saved at or before
            # the last step the copies agreed at (every save is preceded by a check).
            node_suspect.report(f"sdc: rank {self.d.rank}: {mismatch.summary}")
        distributed.any_rank(False, self.d)  # every suspect's report written before any rank exits
        if mismatch is None:
            raise replicas.ReplicaMismatch(f"another rank's state is corrupt after step {self.step}: stopping with it")
        log.error("%s", mismatch)
        self.metrics.event(kind="replica_mismatch", step=self.step, message=str(mismatch))
        _report_failure(f"sdc: {mismatch}")
        raise mismatch

    def replica_meta(self) -> dict:
        """What a checkpoint records of the checks: ``verified`` (its state was checked at its step: at rest and,
        where there are copies, across them) and the step its copies were last seen to agree."""
        if self.at_rest is None:
            return {"verified": False, "replicas_checked": False}
        if not self.sentinels:
            return {"verified": True, "replicas_checked": False}
        agreed = min(s.last_agreed for s in self.sentinels)
        return {"verified": agreed == self.step, "replicas_checked": True, "replicas_agreed_at": agreed}

    def train_step(self, batches) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer step over ``accum`` micro-batches; returns the loss (summed), grad norm and lr."""
        lr = lr_at(self.step, self.cfg.train.steps, self.cfg.optim)
        set_lr(self.optimizer, lr)
        loss_sum, data_wait, samples = torch.zeros((), device=self.d.device), 0.0, 0
        for micro in range(self.accum):
            wait_start = self.metrics.clock()
            batch = next(batches)
            data_wait += self.metrics.clock() - wait_start
            samples = zlib.crc32(batch["input_ids"].numpy().tobytes(), samples)  # which data this rank saw
            if micro == 0 and self.replay and self.replay.due(self.step):
                loss_sum += self.replayed(batch)
            else:
                loss_sum += self.forward_backward(batch, sync_grads=micro == self.accum - 1)
        grad_norm = distributed.clip_grad_norm(self.model, self.cfg.optim.grad_clip)
        if self.at_rest:  # the state as the last step left it, before the optimizer reads it
            self.at_rest.before_step()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if self.at_rest:
            self.at_rest.record(self.step)
        self.metrics.add_step(data_wait=data_wait, samples=samples)
        return loss_sum, grad_norm, lr

    def replayed(self, batch: dict) -> torch.Tensor:
        """The first micro-batch run twice and compared (training/resilience/replay.py). FSDP/HSDP reduce its
        gradients into their shards at once (DDP keeps them local until the last micro-batch), so zeroing
        the gradients between the runs leaves no partial sum behind."""
        sync = self.accum == 1 or self.cfg.train.parallelism != "ddp"
        try:
            return self.replay.check(self.step, lambda: self.forward_backward(batch, sync_grads=sync))
        except replicas.ReplicaMismatch as exc:  # raised on every rank
            self.stop_for_corruption(exc)

    def forward_backward(self, batch: dict, *, sync_grads: bool) -> torch.Tensor:
        """Loss of one micro-batch (already divided by ``accum``), gradients accumulated into the model."""
        inputs = batch["input_ids"].to(self.d.device, non_blocking=True)
        labels = batch["labels"].to(self.d.device, non_blocking=True)
        with (distributed.gradient_sync(self.model, sync_grads, self.cfg.train.grad_reduce),
              distributed.autocast(self.d, self.cfg.train.parallelism), distributed.loss_parallel(self.cfg.train)):
            loss = compute_loss(self.model, inputs, labels, chunks=self.cfg.train.loss_chunks) / self.accum
            loss.backward()
        return loss.detach()

    def app_state(self, rank_keys: tuple[int, ...] | None = None) -> dict:
        """Everything a resume needs. Per-rank items (RNG, loader position) live under per-rank keys.

        ``rank_keys``: whose per-rank items to load (default: this rank's own).
        """
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optim": optim_state, "step": self.step}
        for r in rank_keys if rank_keys is not None else (self.d.rank,):
            rng = {"cpu": torch.get_rng_state()}
            if self.d.on_gpu:
                rng["cuda"] = torch.cuda.get_rng_state(self.d.device)
            state[f"rank{r}"] = {"rng": rng, "loader": self.loader.state_dict()}
        return state

    def start_from_released_weights(self) -> None:
        """Overwrite the initialized weights with a Hugging Face checkpoint's, then save them as step 0, which
        records where they came from: from here on a restart is the ordinary resume, and never reads them again."""
        cfg = self.cfg
        source = hf_weights.load(self.model, cfg.model.init_from, self.arch, cfg.model.preset)
        log.info("weights from %s: this rank read %.3g GB", cfg.model.init_from, source["bytes_read_by_rank"] / 1e9)
        self.ckpt.save(0, self.app_state(), wait=True, meta={"init_from": source})
        # Saving built AdamW's state with one zero step (get_state_dict's initialization): start it afresh.
        self.optimizer = build_optimizer(self.model, cfg.optim)

    def _resume(self) -> int:
        """Load the newest loadable checkpoint; the step to continue from (0: no checkpoint).

        On the world size it was saved at, every rank loads its own RNG and loader position. On
        another world size, DCP reshards model and optimizer state to the new layout, every rank
        reads rank 0's loader position (all ranks have consumed the same number of steps) and the
        loader maps it to its own place in the data order; RNG states do not carry over (training
        draws no random numbers after initialization).
        """
        self.step = 0
        self.metrics_resume = {"source": "none", "step": 0}
        if self.ckpt.latest_step() < 0 and not self.ckpt.steps():
            # building the state initializes optimizer moments: only when there is something to load
            log.info("no checkpoint in %s: starting from step 0", self.ckpt.dir)
            return 0
        loaded: dict = {}

        def state_for(meta: dict) -> dict:
            same_world = meta.get("world_size") == self.d.world_size
            loaded["same_world"], loaded["saved_world"] = same_world, meta.get("world_size")
            loaded["state"] = self.app_state(None if same_world else (0,))
            return loaded["state"]

        if self.ckpt.load(state_for) is None:  # raises NothingLoadable rather than start again
            self.optimizer = build_optimizer(self.model, self.cfg.optim)  # discard initialized moments
            return 0
        state = loaded["state"]
        if not loaded["same_world"]:
            log.warning("resuming on %d ranks from a checkpoint of %s ranks: model and optimizer resharded, "
                        "data position remapped", self.d.world_size, loaded["saved_world"])
        self._load(state, same_world=loaded["same_world"])
        self.metrics_resume = {"source": "checkpoint", "step": int(state["step"])}
        return int(state["step"])

    def _resume_from_snapshot(self) -> int:
        """The step of the newest snapshot in memory that every rank can load, if newer than the file system's
        latest checkpoint (or as new), loaded; 0 where there is none (training/checkpoints/snapshot.py). One
        written on another world size is resharded and loaded as ``_resume`` loads a checkpoint of one."""
        self.step = 0  # app_state's, until a state is loaded
        if self.snapshots is None:
            return 0
        restored = self.snapshots.restore(lambda world: self.app_state(None if world == self.d.world_size else (0,)),
                                          not_before=self.ckpt.latest_step())
        if restored is None:
            return 0
        state, step, how = restored
        self._load(state, same_world=how["saved_world"] == self.d.world_size)
        self.metrics_resume = {"source": "snapshot", "step": step, **how}
        return step

    def _load(self, state: dict, *, same_world: bool) -> None:
        """Put a loaded state (``app_state``'s form) into model, optimizer, RNG and data loader."""
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if int(state["step"]) == 0:  # model.init_from's step 0: its optimizer state is a placeholder, as above
            self.optimizer = build_optimizer(self.model, self.cfg.optim)
        if same_world:
            mine = state[f"rank{self.d.rank}"]
            torch.set_rng_state(mine["rng"]["cpu"])
            if self.d.on_gpu:
                torch.cuda.set_rng_state(mine["rng"]["cuda"], self.d.device)
        else:
            mine = state["rank0"]
        try:
            self.loader.load_state_dict(mine["loader"])
        except ValueError as exc:
            raise CheckpointMismatch(f"{exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.train", description=__doc__.splitlines()[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="config keys (section.key=default  meaning):\n" + config_keys())
    parser.add_argument("--config", help="YAML config file (see jobs/training/configs/)")
    parser.add_argument("--model", action="append", help="the model whose job this is (jobs/train.sh passes it): the "
                        "run takes its name, folders and data.path from jobs/models/MODEL.yaml; given once")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_intermixed_args(argv)  # overrides may come before and after a later --config
    if args.model and len(args.model) > 1:  # argparse would take the last: a job of one model run as another
        message = (f"--model given more than once ({', '.join(args.model)}): a model's job is the model its script "
                   f"names (jobs/train_{args.model[0]}.sh passes --model {args.model[0]}); remove --model from the "
                   f"job's arguments, and to train another model submit its own jobs/train_<model>.sh")
        _report_user_error(message)
        return fail(message)
    try:
        cfg = load_config(args.config, args.overrides, model=args.model[0] if args.model else None)
    except ConfigError as exc:
        _report_user_error(f"config error: {exc}")
        return fail(exc, "see --help for every key")
    faulthandler.enable(all_threads=True)  # a crash or an abort (NCCL timeout) prints every thread's stack
    try:
        d = distributed.init(cfg.train.init_timeout_s)
    except ConfigError as exc:  # more ranks than GPUs
        _report_user_error(str(exc))
        return fail(exc)
    logging.basicConfig(level=logging.INFO if d.is_main else logging.WARNING,
                        format=f"%(asctime)s [rank{d.rank}] %(levelname)s %(name)s: %(message)s")
    try:
        train(cfg, d)
    # Bad input, or another job writing this model's checkpoints: exit 2, no requeue (docs/cli.md).
    except (ConfigError, DatasetError, CheckpointMismatch, NoRoomForCheckpoint, NothingLoadable, CheckpointInUse,
            hf_weights.WeightsError) as exc:
        _report_user_error(str(exc))
        if d.is_main:
            return fail(exc)
        log.error("%s", exc)
        return 2
    except NodeEvicted:  # already said why, saved and closed everything: exit non-zero for jobs/train.sh to requeue
        logging.shutdown()
        os._exit(EVICTED)
    except Exception:  # an infrastructure failure (a peer died, a collective timed out): leave at once,
        log.exception("training failed")  # an orderly exit can wait on the dead peer or on loader workers
        logging.shutdown()
        os._exit(1)
    finally:
        distributed.shutdown()
    return 0


def _report_user_error(message: str) -> None:
    """Tell jobs/train.sh that this failure needs a human, not a requeue (torchrun's exit code cannot)."""
    _report_failure(f"user: {message}")


def _report_failure(line: str) -> None:
    """Tell jobs/train.sh why the run stopped (``user: ...``, ``sdc: ...``): a line of TRAIN_FAILURE_FILE."""
    path = os.environ.get("TRAIN_FAILURE_FILE")
    if path:
        try:
            with open(path, "w") as f:
                f.write(line + "\n")
        except OSError as exc:
            log.warning("could not write %s: %s", path, exc)


if __name__ == "__main__":
    sys.exit(main())
