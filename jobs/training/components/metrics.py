"""Per-interval training metrics, computed in one place, written to the log, TensorBoard and JSONL.

Per log interval: loss, learning rate, grad norm, tokens/s (per device and total) and MFU (GPU only,
against the device's dense bf16 peak) over the interval's training time (checkpoint blocking and
evaluation left out), data-wait share (time blocked fetching the next batch over step time),
checkpoint blocking time, and memory (GPU: the interval's peak allocated; CPU: peak resident set). The log
line starts with ``step N/total`` and ends with the run's elapsed time and ETA; the samples
checksum (which data rank 0 saw, for the exact-resume tests) goes to metrics.jsonl only, as does
the ``time`` (epoch seconds) of every line there: the head node's exporter tells a stall by it.
Weights & Biases is used only when WANDB_API_KEY is set (imported lazily; see ``Tracker``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import time
import zlib
from pathlib import Path

import torch
from atomic_file import write_atomic

log = logging.getLogger(__name__)

# Dense bf16 peak FLOP/s per device, for MFU (vendor datasheets, without sparsity).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "A10G": 125e12, "L40S": 362e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def memory_gib(device: torch.device) -> float:
    """GPU: the most the allocator handed out since the last call (the interval's peak: start-up and
    compile transients leave the figure once their interval is logged). CPU: the process's peak resident set."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class Metrics:
    """Accumulates one interval; ``emit`` is called on every rank (loss is averaged), writes on rank 0."""

    def __init__(self, *, log_dir: str, tensorboard_dir: str, is_main: bool, world_size: int, device: torch.device,
                 tokens_per_step: int, flops_per_token: float, run_name: str, config: dict, start_step: int = 0,
                 total_steps: int, wandb_project: str = ""):
        self.is_main, self.world_size, self.device = is_main, world_size, device
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.start_step, self.total_steps = start_step, total_steps
        self.run_start = self.clock()
        self.peak = peak_flops(device)
        self._reset()
        self._tb = self._wandb = None
        self._jsonl = None
        if is_main:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            self._jsonl = open(Path(log_dir) / "metrics.jsonl", "a")
            from torch.utils.tensorboard import SummaryWriter

            # A resumed run repeats the steps after its checkpoint: drop the earlier run's events for them.
            self._tb = SummaryWriter(tensorboard_dir, purge_step=start_step or None)
            if os.environ.get("WANDB_API_KEY"):
                self._wandb = Tracker(project=wandb_project or run_name, name=run_name, config=config,
                                      checkpoint_dir=config["checkpoint"]["dir"], log_dir=log_dir)

    clock = staticmethod(time.perf_counter)

    def _reset(self) -> None:
        self.steps = 0
        self.data_wait = self.checkpoint_block = 0.0
        self.samples_crc = 0
        self.interval_start = self.clock()

    def add_step(self, *, data_wait: float, samples: int) -> None:
        self.steps += 1
        self.data_wait += data_wait
        self.samples_crc = zlib.crc32(samples.to_bytes(4, "little"), self.samples_crc)

    def add_checkpoint_block(self, seconds: float) -> None:
        self.checkpoint_block += seconds

    def emit(self, step: int, *, loss: float, lr: float, grad_norm: float, extra: dict | None = None) -> dict:
        """Summarize the interval since the last emit (step = optimizer steps done) and reset."""
        # Wall time of the interval, not summed per-step timers: on a GPU the host runs ahead of
        # the device, and only the interval's end (loss.item()) is a synchronization point. Training
        # time leaves out what is not training, as evaluation is left out (emit_eval): checkpoint
        # blocking is reported beside it, and goodput counts it.
        elapsed = self.clock() - self.interval_start
        train_time = max(elapsed - self.checkpoint_block, 1e-9)
        tokens = self.tokens_per_step * self.steps
        record = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens_per_s": tokens / train_time,
            "tokens_per_s_per_device": tokens / train_time / self.world_size,
            "step_time_s": train_time / max(self.steps, 1),
            "data_wait_pct": 100 * self.data_wait / train_time,
            "checkpoint_block_s": self.checkpoint_block,
            "memory_gib": memory_gib(self.device),
            "samples_crc": self.samples_crc,  # CRC-32 of rank 0's input ids in the interval
            **(extra or {}),  # per-rank timing (training/resilience/stragglers.py)
        }
        if self.peak:
            record["mfu_pct"] = 100 * record["tokens_per_s_per_device"] * self.flops_per_token / self.peak
        self._reset()
        if self.is_main:
            log.info("%s %s", self._progress(step), " ".join(f"{k}={_fmt(v)}" for k, v in record.items()
                                                             if k not in ("step", "samples_crc")))
            self._jsonl.write(json.dumps({**record, "time": time.time()}) + "\n")
            self._jsonl.flush()
            for key, value in record.items():
                if key not in ("step", "samples_crc") and not isinstance(value, str):  # a straggler's node, cause
                    self._tb.add_scalar(f"train/{key}", value, step)
            if self._wandb:
                self._wandb.log(record, step=step)
        return record

    def emit_eval(self, step: int, record: dict, seconds: float) -> None:
        """A validation result (training/components/evaluate.py) to the log, metrics.jsonl and TensorBoard (``val/``).
        The ``seconds`` it took are left out of the training interval's tokens/s."""
        self.interval_start += seconds
        if self.is_main:
            log.info("step %d %s", step, " ".join(f"{k}={_fmt(v)}" for k, v in record.items()))
            self._jsonl.write(json.dumps({"step": step, **record, "time": time.time()}) + "\n")
            self._jsonl.flush()
            for key, value in record.items():
                self._tb.add_scalar(f"val/{key}", value, step)
            if self._wandb:
                self._wandb.log({f"val/{k}": v for k, v in record.items()}, step=step)

    def _progress(self, step: int) -> str:
        """``step 120/1000 (elapsed 0:02:10, eta 0:15:53)``: ETA from this run's mean step time so far."""
        elapsed = self.clock() - self.run_start
        done, left = step - self.start_step, max(self.total_steps - step, 0)
        eta = _duration(elapsed / done * left) if done > 0 else "?"
        return f"step {step}/{self.total_steps} (elapsed {_duration(elapsed)}, eta {eta})"

    def event(self, **fields) -> None:
        """A one-off line (resume, stop, checkpoint) in the JSONL log, for tools and tests."""
        if self.is_main:
            self._jsonl.write(json.dumps({"event": fields.pop("kind"), "time": time.time(), **fields}) + "\n")
            self._jsonl.flush()

    def close(self) -> None:
        if self.is_main:
            self._jsonl.close()
            self._tb.close()
            if self._wandb:
                self._wandb.finish()


class Tracker:
    """Weights & Biases on rank 0, which must not take training down: if wandb fails (no network, a bad
    key, its service gone), that is one warning line and the run goes on without it; nothing is raised,
    so the job is neither failed nor requeued for it.

    Bounded by wandb's own timeouts: start-up waits at most ``WANDB_INIT_TIMEOUT`` seconds (default 30,
    wandb's is 90; the other ranks wait that long in their first collective, well within the start-up
    timeout), ``log`` only hands the record to wandb's service process, and the end of the run waits at
    most 30 s for the upload (what is left stays under <log.dir>/wandb for ``wandb sync``). wandb runs its
    service as a separate program and sets no signal handlers here, so SIGUSR1/SIGTERM (signals.py) stay
    the trainer's; its console capture is off, the log already is the job's .err file."""

    def __init__(self, *, project: str, name: str, config: dict, checkpoint_dir: str, log_dir: str):
        self._run = None
        try:
            import wandb  # only when keyed: importing it takes seconds

            self._run = wandb.init(
                project=project, name=name, id=run_id(Path(checkpoint_dir), name), resume="allow",
                config=config, dir=log_dir,
                settings=wandb.Settings(init_timeout=float(os.environ.get("WANDB_INIT_TIMEOUT", 30)),
                                        finish_timeout=30, console="off", silent=True))
            log.info("W&B run %s", self._run.url or self._run.id)
        except Exception as exc:
            self._disable(exc)

    def __bool__(self) -> bool:
        return self._run is not None

    def log(self, record: dict, step: int) -> None:
        try:
            self._run.log(record, step=step)
        except Exception as exc:
            self._disable(exc)

    def finish(self) -> None:
        try:
            self._run.finish()
        except Exception as exc:
            self._disable(exc)

    def _disable(self, exc: Exception) -> None:
        log.warning("W&B tracking off for the rest of this run (training goes on): %s: %s",
                    type(exc).__name__, (str(exc).splitlines() or [""])[0])
        self._run = None


def run_id(checkpoint_dir: Path, name: str) -> str:
    """The W&B run id of this checkpoint lineage: made on its first start and kept in the checkpoint
    folder, so a requeued job (which resumes from that folder) continues the same W&B run, and a run
    started afresh in a new folder is a new W&B run. W&B ids take letters, digits, ``-`` and ``_``."""
    path = checkpoint_dir / "wandb_run_id"
    if path.exists():
        return path.read_text().strip()
    new_id = f"{re.sub(r'[^A-Za-z0-9_-]', '-', name)}-{os.urandom(4).hex()}"
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, new_id + "\n")
    return new_id


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
