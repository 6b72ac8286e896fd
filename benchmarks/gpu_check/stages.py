"""The GPU proof's stages, each run in a process of its own by ``benchmarks.gpu_check``:

    python -m benchmarks.gpu_check.stages STAGE ARGS_JSON RESULT_JSON

A stage returns a dict of figures; a figure it cannot take here is ``None`` with the reason under
``not_measured``. On a CPU (``--cpu``, what ``make test`` runs) every stage takes the same code path
at tiny widths, with gloo and the fake process group, so that none of it rots between GPU runs.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from cli import ArgumentParser
from training.parallel import distributed
from training.config import load_config, read_config_file
from training.models.llama import flops_per_token, hf_config

GIB = 2**30
REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = REPO / "jobs/training/configs/tiny.yaml"


def on_gpu(args: dict) -> bool:
    return torch.cuda.is_available() and not args["cpu"]


def versions() -> dict:
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "cuda": torch.version.cuda, "device": "cpu"}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        nccl = torch.cuda.nccl.version()
        out.update(device=props.name, memory_gib=round(props.total_memory / GIB, 2),
                   nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
                   cudnn=torch.backends.cudnn.version(),
                   capability=f"{props.major}.{props.minor}")
    return out


# --- environment --------------------------------------------------------------------------------------

def _outside_allocator_gib() -> float:
    """Device memory in use that torch's caching allocator does not hold: CUDA context, library workspaces
    allocated outside it, NCCL's buffers."""
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / GIB


def _group_timeout_s(group, device: torch.device) -> float | None:
    try:
        return group._get_backend(device).options._timeout.total_seconds()
    except Exception:  # noqa: BLE001 - a backend without options: not measured
        return None


def environment(args: dict) -> dict:
    """Process groups as the trainer makes them, both flight recorders, the RNG, attention kernels, copies, a snapshot."""
    from training.dry_run import load_model_config

    gpu, r, why = on_gpu(args), {"versions": versions()}, {}
    # cuBLAS is deterministic only with this workspace, set before its first call (train.deterministic's cost)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # Before the process group: the recorders record only when sized at its creation (jobs/train.sh sets them).
    os.environ["TORCH_FR_BUFFER_SIZE"] = os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "200"
    runtime = {}
    if gpu:
        torch.zeros(1, device="cuda")
        runtime["cuda_context"] = _outside_allocator_gib()
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        (a @ a).sum().item()
        runtime["after_cublas"] = _outside_allocator_gib()
    d = distributed.init(args["timeout_s"])  # the trainer's own: NCCL bound to the device with device_id
    t = torch.ones(4, device=d.device)
    dist.all_reduce(t)  # the training backend (NCCL on a GPU)
    distributed.any_rank(False, d)  # the stop vote's gloo group
    if gpu:
        torch.cuda.synchronize()
        runtime["after_nccl"] = _outside_allocator_gib()
        r["runtime_gib"] = runtime
        r["runtime_note"] = ("one NCCL communicator of 1 rank: no peer buffers; the 2-node acceptance run "
                             "carries the several communicators of a real layout")
    else:
        r["runtime_gib"], why["runtime_gib"] = None, "no GPU: CUDA context and NCCL buffers exist only there"
    r["backend"] = dist.get_backend()
    r["bound_device"] = str(getattr(dist.distributed_c10d._get_default_group(), "bound_device_id", None))

    # Mesh groups: created with torch's 30-minute default, then given ours (distributed.device_mesh).
    cfg = load_model_config({}, ["train.parallelism=hsdp", "train.hsdp_shard_size=1"])
    mesh = distributed.device_mesh(d, cfg.train)
    groups = {"default": dist.group.WORLD, "control": d.control_group,
              **{f"mesh:{name}": mesh.get_group(name) for name in mesh.mesh_dim_names}}
    devices = {"control": torch.device("cpu")}  # gloo only; the others run the training backend
    before = {name: _group_timeout_s(g, devices.get(name, d.device)) for name, g in groups.items()}
    distributed.set_timeout(d, args["short_timeout_s"])
    after = {name: _group_timeout_s(g, devices.get(name, d.device)) for name, g in groups.items()}
    r["group_timeouts_s"] = {"start_up": before, "after_first_step": after}
    r["group_timeouts_ok"] = (all(v in (None, float(args["timeout_s"])) for v in before.values())
                              and all(v in (None, float(args["short_timeout_s"])) for v in after.values())
                              and any(v is not None for v in after.values()))

    for part in (flight_recorders, rng_restore, attention_kernels, batch_copies, snapshot_costs):  # one failing keeps the others
        try:
            part(args, gpu, d, r, why)
        except Exception as exc:  # noqa: BLE001 - recorded in the report
            r[part.__name__], why[part.__name__] = None, f"failed: {type(exc).__name__}: {str(exc)[:400]}"
    distributed.shutdown()
    r["not_measured"] = why
    return r


def flight_recorders(args: dict, gpu: bool, d, r: dict, why: dict) -> None:
    """Both flight recorders, as the watchdog dumps them: which collectives each holds."""
    from training.resilience import watchdog

    folder = Path(args["work"]) / "fr"
    folder.mkdir(parents=True, exist_ok=True)
    recorders = {}
    for path in watchdog.dump_flight_recorders(folder, "check", gpu):
        entries = pickle.loads(path.read_bytes()).get("entries", [])
        recorders[path.name] = sorted({e.get("profiling_name", "?") for e in entries})
    r["flight_recorders"] = recorders
    r["flight_recorder_has_training_collective"] = any(
        name.startswith(("nccl:" if gpu else "gloo:")) and "all_reduce" in name
        for name in recorders.get("fr_trace_check.pkl", []))


def rng_restore(args: dict, gpu: bool, d, r: dict, why: dict) -> None:
    """The RNG state a checkpoint saves and a resume restores (Trainer.app_state / _resume)."""
    if gpu:
        state = torch.cuda.get_rng_state(d.device)
        first = torch.randn(1000, device=d.device)
        torch.cuda.set_rng_state(state, d.device)
        r["cuda_rng_restores"] = bool(torch.equal(first, torch.randn(1000, device=d.device)))
    else:
        r["cuda_rng_restores"], why["cuda_rng_restores"] = None, "no GPU"


def _kernels(run) -> list[str]:
    """Names of the device kernels (CPU: operators) that ``run()`` launches."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    return sorted({e.key for e in prof.key_averages() if str(e.device_type).lower().endswith(kind)})


# Kernel-name fragments -> attention implementation; the first that a kernel's name holds names it.
BACKENDS = (("for_cpu", "flash (CPU)"), ("forcpu", "flash (CPU)"), ("cudnn", "cuDNN"), ("flash", "flash"), ("fmha", "memory-efficient"),
            ("efficient", "memory-efficient"), ("_scaled_dot_product_attention_math", "math"))


def _backend(kernels: list[str]) -> str:
    found = {next(label for key, label in BACKENDS if key in k.lower()) for k in kernels
             if any(key in k.lower() for key, _ in BACKENDS)}
    return ", ".join(sorted(found)) or "math (no fused attention kernel)"


def attention_kernels(args: dict, gpu: bool, d, r: dict, why: dict) -> None:
    """For each production shape: which attention kernel the model's own attention selects (forward and
    backward), and whether its backward repeats bit for bit, with and without deterministic algorithms."""
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    from training.components.determinism import set_determinism

    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    out = []
    for shape in args["attention_shapes"]:
        config = hf_config(shape["preset"], 32000, shape["seq_len"])
        config.num_hidden_layers = 1
        with torch.device(device):
            attention = LlamaAttention(config, layer_idx=0).to(dtype)
            rotary = LlamaRotaryEmbedding(config)
        generator = torch.Generator(device=device).manual_seed(0)
        hidden = torch.randn(1, shape["seq_len"], config.hidden_size, device=device, dtype=dtype,
                             generator=generator) * 0.5
        positions = torch.arange(shape["seq_len"], device=device)[None]
        embeddings = rotary(hidden, positions)

        def step() -> torch.Tensor:
            x = hidden.detach().requires_grad_(True)
            attention.zero_grad(set_to_none=True)
            out, _ = attention(x, position_embeddings=embeddings, attention_mask=None)
            out.float().square().mean().backward()
            return torch.cat([x.grad.flatten(), attention.q_proj.weight.grad.flatten()])

        row = {**shape, "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
               "head_dim": config.hidden_size // config.num_attention_heads, "dtype": str(dtype)}
        for label, deterministic in (("default", False), ("deterministic", True)):
            set_determinism(deterministic)  # the trainer's switch (train.deterministic)
            try:
                kernels = _kernels(step)
                repeats = [step() for _ in range(3)]
                row[label] = {"backend": _backend(kernels),
                              "attention_kernels": [k for k in kernels if any(b in k.lower() for b, _ in BACKENDS)],
                              "backward_bitwise_repeatable": all(torch.equal(repeats[0], g) for g in repeats[1:])}
            except Exception as exc:  # noqa: BLE001 - an op without a deterministic version says which
                row[label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            finally:
                torch.use_deterministic_algorithms(False)
                torch.backends.cudnn.deterministic = False
        out.append(row)
        if gpu:
            torch.cuda.empty_cache()
    r["attention"] = out


def batch_copies(args: dict, gpu: bool, d, r: dict, why: dict) -> None:
    """Host-to-device copies of a production micro-batch and of 256 MiB, from pinned and from pageable memory."""
    if not gpu:
        r["batch_copies"], why["batch_copies"] = None, "no GPU: host-to-device copies need one"
        return

    def timed(tensor: torch.Tensor, pinned: bool, repeats: int) -> float:
        source = tensor.pin_memory() if pinned else tensor
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            source.to("cuda", non_blocking=pinned)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    micro, seq = args["batch_shape"]
    batch = torch.randint(0, 32000, (micro, seq))
    big = torch.empty(256 * 2**20, dtype=torch.uint8)
    out = {"micro_batch": {"shape": [micro, seq], "bytes": batch.numel() * 8}}
    for pinned in (False, True):
        key = "pinned" if pinned else "pageable"
        out["micro_batch"][f"{key}_us"] = round(1e6 * timed(batch, pinned, 50), 1)
        out[f"{key}_256mib_gb_s"] = round(big.numel() / timed(big, pinned, 5) / 1e9, 1)
    r["batch_copies"] = out


def snapshot_costs(args: dict, gpu: bool, d, r: dict, why: dict) -> None:
    """A snapshot in memory of 1 GiB of GPU state, through training/checkpoints/snapshot.py: the copy to host
    memory training waits for, the writer's seconds, and a GPU loop's step alone and while the writer works
    (it shares the interpreter with the loop that launches the kernels)."""
    if not gpu:
        r["snapshot"], why["snapshot"] = None, "no GPU: the copy from GPU memory and its effect on a GPU step need one"
        return
    import tempfile

    from training.checkpoints.snapshot import Snapshots

    state = {"model": {f"w{i}": torch.randn(2**24, device="cuda") for i in range(16)}, "step": 1}  # 1 GiB fp32
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def step() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()
        return time.perf_counter() - start

    alone = statistics.median([step() for _ in range(10)])
    during = []
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        taker = Snapshots(shm, "gpu-check", every=1, d=d, layout={})
        blocked = taker.take(1, state)
        while taker._pending and not taker._pending[0].done():
            during.append(step())
        taker.wait()
        taker.close(remove=True)
    r["snapshot"] = {"gib": 1.0, "blocked_s": round(blocked, 4), "copy_gb_s": round(2**30 / blocked / 1e9, 1),
                     "write_s": round(taker.last_write_s, 3), "write_gb_s": round(2**30 / taker.last_write_s / 1e9, 2),
                     "step_s_alone": round(alone, 4),
                     "step_s_during_write": round(statistics.median(during), 4) if during else None}


# --- resume ---------------------------------------------------------------------------------------

def resume(args: dict) -> dict:
    """A tiny FSDP run through the real trainer, saved asynchronously (the pinned stager on a GPU) and
    resumed from its middle checkpoint: the resumed steps' losses and data order against the full run's."""
    from local_cluster import demo_data
    from training.config import TrainConfig
    from training.train import train

    work = Path(args["work"])
    data = demo_data.build(work / "data").path
    os.environ.update(FSX_DATA=str(work), FSX_CHECKPOINTS=str(work / "checkpoints"), FSX_LOGS=str(work / "logs"))
    overrides = [f"data.path={data}", "train.parallelism=fsdp", f"train.steps={args['steps']}",
                 f"checkpoint.every={args['steps'] // 2}", "checkpoint.async_save=true", "log.interval=1",
                 "train.micro_batch_size=8", "optim.warmup_steps=2", "eval.every=0", "data.num_workers=0"]
    deterministic = "deterministic" in TrainConfig.model_fields
    if deterministic:
        overrides.append("train.deterministic=true")
    d = distributed.init(args["timeout_s"])
    runs = {}
    try:
        for name in ("full", "resumed"):
            cfg = load_config(TINY_CONFIG, [*overrides, f"name={name}"])
            if name == "resumed":  # the full run's middle checkpoint, as a requeued job finds it
                middle = f"step_{args['steps'] // 2:08d}"
                target = Path(cfg.checkpoint.dir)
                target.mkdir(parents=True)
                shutil.copytree(runs["full"]["checkpoints"] / middle, target / middle)
                (target / "latest").write_text(middle + "\n")
            start = time.perf_counter()
            status = train(cfg, d)
            records = [json.loads(line) for line in (Path(cfg.log.dir) / "metrics.jsonl").read_text().splitlines()]
            runs[name] = {"status": status, "seconds": time.perf_counter() - start,
                          "checkpoints": Path(cfg.checkpoint.dir),
                          "steps": {r["step"]: (r["loss"], r["samples_crc"]) for r in records if "loss" in r}}
    finally:
        distributed.shutdown()
    full, resumed = runs["full"]["steps"], runs["resumed"]["steps"]
    compared = sorted(s for s in resumed if s > args["steps"] // 2)
    worst = max((abs(resumed[s][0] - full[s][0]) / abs(full[s][0]) for s in compared), default=None)
    return {"device": str(d.device), "deterministic": deterministic, "steps_compared": compared,
            "losses_full": [full[s][0] for s in compared], "losses_resumed": [resumed[s][0] for s in compared],
            "same_data_order": all(resumed[s][1] == full[s][1] for s in compared) and bool(compared),
            "bitwise_equal": all(resumed[s][0] == full[s][0] for s in compared) and bool(compared),
            "max_relative_difference": worst, "run_status": [runs["full"]["status"], runs["resumed"]["status"]],
            "run_seconds": {k: round(v["seconds"], 1) for k, v in runs.items()},
            "stager": "pinned (GPU)" if d.on_gpu else "pageable (CPU)"}


# --- a production recipe shrunk to 2 layers on this device ----------------------------------------

def recipe(args: dict) -> dict:
    """``training.layout_check`` (the real ``train.build`` and train step) on the recipe at its real widths,
    2 layers, one process: peak memory against the dry run, MFU against the plan, compile time."""
    folder = Path(args["work"]) / "layouts"
    cmd = [sys.executable, "-m", "training.layout_check", "--recipe", args["config"], "--name", args["name"],
           "--steps", str(args["steps"]), "--warmup", str(args["warmup"]), "--compile-steps", str(args["compile_steps"]),
           "--out", str(folder), *(["--preset", args["preset"]] if args.get("preset") else []),
           *([] if args.get("compile_check", True) else ["--no-compile-check"]), *args.get("overrides", [])]
    env = {**os.environ, "JOBS_DIR": args["jobs_dir"], **args.get("env", {})}  # a lever's allocator setting
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    path = folder / f"{args['name']}.json"
    if not path.exists():
        raise RuntimeError(f"layout check wrote no result (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    r = json.loads(path.read_text())
    seconds = r.get("step_seconds") or []
    keep = ("layout", "preset", "layers", "micro_batch_size", "seq_len", "device", "verdict", "error", "oom",
            "peak_memory_gib", "peak_reserved_gib", "predicted_memory_gib", "predicted_memory", "mfu",
            "expected_mfu", "planned", "tokens_per_s_per_gpu", "flops_per_token", "peak_flops", "compiled_losses",
            "eager_losses", "losses", "compile")
    out = {k: r[k] for k in keep if k in r}  # the figures this report keeps
    if seconds:
        steady = statistics.median(seconds[args["warmup"]:] or seconds)
        out.update(first_step_s=seconds[0], steady_step_s=steady, compile_s=seconds[0] - steady)
    if out.get("peak_memory_gib") and out.get("predicted_memory_gib"):
        out["memory_measured_over_predicted"] = out["peak_memory_gib"] / out["predicted_memory_gib"]
    if out.get("mfu") and out.get("expected_mfu"):
        out["mfu_measured_over_planned"] = out["mfu"] / out["expected_mfu"]
    out["checks"] = [f"{c['status']}: {c['name']}: {c.get('measured') or c.get('why')}" for c in r.get("checks", [])]
    out["exit_code"] = proc.returncode
    return out


# --- rank 0 of the production layout on the fake process group ---------------------------------------

def layout_rank0(args: dict) -> dict:
    """Rank 0 of a production layout at its real world size (collectives return at once), with real device
    tensors at a few layer counts: what this rank's program holds and computes, against the dry run."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from training.dry_run import load_model_config
    from training.layout_check import Steps, predicted_memory, synthetic_batches
    from training.models.llama import compute_loss

    gpu = on_gpu(args)
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    cfg = load_model_config(read_config_file(args["config"]), args.get("overrides", []))
    world = args["world_size"]
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    d = distributed.Dist(0, world, 0, device, dist.group.WORLD, dist.group.WORLD)
    mesh = distributed.device_mesh(d, cfg.train)
    vocab = cfg.model.vocab_size or 32000
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / GIB if gpu else 141.0
    rows = []
    for layers in args["layers"]:
        model_config = hf_config(cfg.model.preset, vocab, cfg.data.seq_len)
        model_config.num_hidden_layers = layers
        row = {"layers": layers}
        try:
            stepper = Steps(cfg, d, mesh, model_config)
            batches = synthetic_batches(cfg, d)
            times = []
            for step in range(args["steps"]):
                if gpu and step == 1:  # the steady state's peak: after the first (compiling) step
                    torch.cuda.reset_peak_memory_stats()
                start = time.perf_counter()
                loss, _, _ = stepper.train_step(batches)
                loss.item()  # the step's end on a GPU
                times.append(time.perf_counter() - start)
            row.update(first_step_s=times[0], steady_step_s=statistics.median(times[1:] or times))
            if gpu:
                row["peak_memory_gib"] = torch.cuda.max_memory_allocated() / GIB
            # The first evaluation compiles every layer again, for eval mode (training/components/evaluate.py).
            batch = next(batches)
            evals = []
            stepper.model.eval()
            with torch.no_grad(), distributed.loss_parallel(cfg.train):
                for _ in range(2):
                    start = time.perf_counter()
                    compute_loss(stepper.model, batch["input_ids"].to(device), batch["labels"].to(device)).item()
                    evals.append(time.perf_counter() - start)
            stepper.model.train()
            row.update(first_eval_s=evals[0], second_eval_s=evals[1])
            tokens = cfg.train.micro_batch_size * cfg.data.seq_len * stepper.accum  # per model copy and step
            rank_flops = flops_per_token(model_config, cfg.data.seq_len) * tokens / cfg.train.tensor_parallel
            row["rank_tflop_per_step"] = rank_flops / 1e12
            if gpu:
                from training.components.metrics import peak_flops

                peak = peak_flops(device)
                row["compute_mfu"] = rank_flops / row["steady_step_s"] / peak if peak else None
            del stepper, batches
        except Exception as exc:  # noqa: BLE001 - recorded; the next layer count still runs
            row["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()
        if layers in args.get("predict_layers", args["layers"]):
            predicted = predicted_memory(cfg, layers, world, gpu_gib)
            gib = {k: v / GIB for k, v in predicted["categories"].items()}
            row["predicted_memory_gib"] = sum(gib.values()) - gib.get("runtime", 0.0)
            row["predicted_layout"] = predicted["layout"]
        rows.append(row)
    dist.destroy_process_group()
    # The dry run traces with this process's torch: the prediction is that release's, and the jobs pin another
    # one (requirements-jobs.txt); it differs between releases (docs/acceptance.md), so the report names both.
    out = {"layout": rows[0].get("predicted_layout"), "world_size": world, "preset": cfg.model.preset,
           "micro_batch_size": cfg.train.micro_batch_size, "seq_len": cfg.data.seq_len, "rows": rows,
           "compile": cfg.train.compile if cfg.train.compile is not None else gpu,
           "predicted_torch": torch.__version__, "jobs_torch": jobs_torch()}
    ok = [r for r in rows if "peak_memory_gib" in r and "predicted_memory_gib" in r]
    if len(ok) >= 2:
        a, b = ok[0], ok[-1]
        span = b["layers"] - a["layers"]
        measured = (b["peak_memory_gib"] - a["peak_memory_gib"]) / span
        predicted = (b["predicted_memory_gib"] - a["predicted_memory_gib"]) / span
        full = args["full_layers"]
        out["per_layer_gib"] = {"measured": measured, "predicted": predicted}
        out[f"extrapolated_to_{full}_layers_gib"] = {
            "measured": b["peak_memory_gib"] + (full - b["layers"]) * measured,
            "predicted": b["predicted_memory_gib"] + (full - b["layers"]) * predicted}
        deepest = next((r for r in rows if r["layers"] == full and "peak_memory_gib" in r), None)
        if deepest:  # the full depth itself, measured on the device
            out[f"measured_at_{full}_layers_gib"] = deepest["peak_memory_gib"]
    return out


def jobs_torch() -> str | None:
    """The torch release the jobs pin (requirements-jobs.txt)."""
    for line in (REPO / "requirements-jobs.txt").read_text().splitlines():
        if line.startswith("torch=="):
            return line.split("==", 1)[1].strip()
    return None


# --- Megatron-LM: a tiny GPT on one GPU, saved and resumed -----------------------------------------

MEGATRON_LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ .*?lm loss: ([0-9.Ee+-]+)")


def megatron_arguments(args: dict, data: dict, tokenizer: Path, checkpoints: Path, iterations: int) -> list[str]:
    """pretrain_gpt.py's arguments for the stage's tiny GPT (TP 1, PP 1): the shape of jobs/megatron_lm's runs
    (Llama's decoder, bf16, the distributed optimizer) at tiny widths, without Apex or Transformer Engine."""
    return [
        "--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--ffn-hidden-size", "352",
        "--seq-length", "64", "--max-position-embeddings", "64", "--position-embedding-type", "rope",
        "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
        "--attention-dropout", "0", "--hidden-dropout", "0", "--transformer-impl", "local",
        "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-persist-layer-norm",
        "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
        "--micro-batch-size", "8", "--global-batch-size", "16", "--bf16", "--use-distributed-optimizer",
        "--train-iters", str(iterations), "--lr", "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine",
        "--lr-warmup-iters", "5", "--lr-decay-iters", str(args["iterations"]), "--weight-decay", "0.1",
        "--clip-grad", "1.0", "--seed", "1234", "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "0",
        "--save-interval", str(args["save_at"]), "--ckpt-format", "torch_dist", "--exit-signal-handler",
        "--save", str(checkpoints), "--load", str(checkpoints), "--data-cache-path", str(checkpoints / "data_cache"),
        "--train-data-path", str(data["train"]), "--valid-data-path", str(data["valid"]),
        "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tokenizer), "--num-workers", "0",
        *args.get("extra", []),
    ]


def megatron_gpt(args: dict) -> dict:
    """Megatron-LM's pretrain_gpt.py on one GPU: the sample corpus tokenized and preprocessed as a Megatron
    model's job does (jobs/megatron_lm/preprocess.py), ``save_at`` iterations with a checkpoint, then the
    rest resumed from it, as a requeued job does. The loss must fall and the resumed run start where it was."""
    from data_pipeline.sample_data import make_sample
    from data_pipeline.tokenize import tokenize_files
    from megatron_lm.preprocess import preprocess, prefixes
    from megatron_lm.status import checkpointed_iteration

    megatron_dir = Path(args["megatron_dir"])
    if not on_gpu(args) or not (megatron_dir / "pretrain_gpt.py").is_file():
        why = ("Megatron-LM trains on CUDA only" if not on_gpu(args)
               else f"no Megatron-LM checkout at {megatron_dir} (set MEGATRON_LM_DIR)")
        return {"loss_falls": None, "resumed_at": None, "not_measured": {"megatron_gpt": why}}
    work = Path(args["work"])
    files, tokenizer = make_sample(work / "sample", num_files=2, total_bytes=400_000)
    dataset = tokenize_files(files, tokenizer, work / "tokenized", 64, val_fraction=0.05)
    preprocess(dataset.path)
    checkpoints = work / "checkpoints"
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1",
           "PYTHONPATH": str(megatron_dir)}
    runs = {}
    for name, iterations in (("first", args["save_at"]), ("resumed", args["iterations"])):
        start = time.perf_counter()
        run = subprocess.run([sys.executable, str(megatron_dir / "pretrain_gpt.py"),
                              *megatron_arguments(args, prefixes(dataset.path), tokenizer, checkpoints, iterations)],
                             cwd=megatron_dir, env=env, capture_output=True, text=True, timeout=args["timeout_s"])
        (work / f"{name}.log").write_text(run.stdout + run.stderr)
        losses = {int(i): float(v) for i, v in MEGATRON_LOSS.findall(run.stdout + run.stderr)}
        runs[name] = {"exit": run.returncode, "seconds": round(time.perf_counter() - start, 1), "losses": losses,
                      "checkpointed_iteration": checkpointed_iteration(checkpoints),
                      "tail": (run.stdout + run.stderr)[-1500:] if run.returncode else ""}
    first, resumed = runs["first"]["losses"], runs["resumed"]["losses"]
    early = [first[i] for i in sorted(first)[:5]]
    late = [first[i] for i in sorted(first)[-5:]]
    return {"runs": runs, "iterations_first": len(first), "resumed_at": min(resumed, default=None),
            "loss_first_5": early, "loss_last_5": late,
            "loss_falls": bool(early and late and statistics.mean(late) < 0.8 * statistics.mean(early)),
            "resumed_from_checkpoint": runs["first"]["checkpointed_iteration"] == args["save_at"]
            and min(resumed, default=0) == args["save_at"] + 1
            and runs["resumed"]["checkpointed_iteration"] == args["iterations"]}


STAGES = {"environment": environment, "resume": resume, "recipe": recipe, "layout_rank0": layout_rank0,
          "megatron_gpt": megatron_gpt}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.gpu_check.stages",
                            description="one stage of the GPU proof, in a process of its own, as benchmarks.gpu_check runs it")
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("args", type=json.loads, metavar="ARGS_JSON",
                        help="the stage's arguments, as benchmarks.gpu_check plans them")
    parser.add_argument("result", type=Path, metavar="RESULT_JSON", help="where the stage writes its figures")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    figures = STAGES[args.stage](args.args)
    figures["stage_seconds"] = round(time.perf_counter() - start, 1)
    args.result.write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
