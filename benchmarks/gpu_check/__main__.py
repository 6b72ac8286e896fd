"""The GPU proof: the branches only a GPU takes, on one GPU, in one command (``make gpu-check``).

    python -m benchmarks.gpu_check                 # on a machine with a GPU: ~8 minutes on one H100
    python -m benchmarks.gpu_check --dry           # the plan: stages, time limits, predicted memory
    python -m benchmarks.gpu_check --cpu           # the same code paths at tiny widths (make test)

Stages, in order of value per second, each in a process of its own with its own time limit; a stage
that no longer fits in what is left of ``--budget-s`` is skipped and says so:

  environment   the trainer's process groups (NCCL bound with device_id), the mesh groups' timeouts at
                start-up and after the first step, both flight recorders (NCCL's and gloo's) as the
                watchdog dumps them, CUDA RNG save/restore, the attention kernel each production shape
                selects and whether its backward repeats bit for bit (with and without
                ``train.deterministic``), pinned vs pageable batch copies, a 1 GiB snapshot in memory
                (its blocked copy, its writer, a GPU loop's step beside the writer), the memory outside
                torch's allocator (CUDA context, cuBLAS, NCCL) against the dry run's ``RUNTIME_GIB``
  resume        a tiny FSDP run saved asynchronously (the pinned stager) and resumed from its middle
                checkpoint: data order and losses against the uninterrupted run
  recipe:NAME   each production recipe at its real widths, 2 layers, one GPU (``training.layout_check``:
                the real ``train.build`` and train step, bf16, compile, recomputation, GQA): peak memory
                against the dry run of the same config, MFU against the planner's, first-step compile
  rank0:MODEL   rank 0 of the tensor-parallel model's real layout (e.g. FSDP 34 x TP 8) on the fake
                process group with real device tensors at 4, 8 and all its layers: this rank's memory against
                the dry run of this torch release (slope per layer, extrapolated to the full depth beside the
                full depth measured), compute MFU, first-eval recompile
  lever:R:L     each lever (benchmarks/gpu_check/levers.py) on recipe R's 2-layer run against its bf16 run:
                MFU, peak memory, and float8's losses over 50 steps; after the others, or alone (--only lever)

Writes ``--out`` (JSON, default benchmarks/results/gpu_check.json) and prints a short table. Exit 0 when
every stage that ran finished (figures are reported, not judged here: docs/acceptance.md says what each
is compared with); 1 when a stage failed or timed out. Needs only what the jobs need (torch,
transformers, pydantic, PyYAML, tokenizers); any PyTorch release the GPU machine has, recorded in the report.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "jobs"))

from cli import ArgumentParser  # noqa: E402

ENV = "prod"  # the production recipes: their configs as the jobs bundle of this environment has them
FLOAT8_PACKAGES = REPO / ".build/float8"  # torchao, apart from the venv (requirements-float8.txt)


def production_jobs(jobs_dir: Path | None, work: Path) -> Path:
    """The jobs folder with the environment's models/*.yaml and cluster.json: given, or written from the settings."""
    if jobs_dir:
        return jobs_dir
    out = work / f"jobs-{ENV}"
    subprocess.run([sys.executable, "-m", "cluster_config", "jobs", "--env", ENV, "--out", str(out)], cwd=REPO,
                   check=True, capture_output=True, text=True)
    return out


def plan(jobs_dir: Path, cpu: bool) -> list[dict]:
    """The stages with their arguments and time limits. GPU: the recipes as they are; CPU: tiny widths."""
    from training.cluster import load_cluster
    from training.config import read_config_file

    cluster = load_cluster(jobs_dir)
    recipes: dict[str, tuple[str, dict]] = {}  # one model per distinct preset, the largest preset first
    for name, job in cluster.models.items():
        raw = read_config_file(job.config)
        recipes.setdefault(raw["model"]["preset"], (name, raw))
    by_size = sorted(recipes.items(), key=lambda item: -_parameters(item[0]))
    shapes = [{"preset": preset, "seq_len": raw["data"]["seq_len"]} for preset, (_, raw) in by_size]
    tp_model = next((name for _, (name, raw) in by_size if raw["train"].get("tensor_parallel", 1) > 1), by_size[0][1][0])
    tp_raw = read_config_file(cluster.models[tp_model].config)
    micro, seq = tp_raw["train"]["micro_batch_size"], tp_raw["data"]["seq_len"]
    stages = [
        {"name": "environment", "stage": "environment", "limit_s": 90,
         "args": {"timeout_s": 300, "short_timeout_s": 100, "batch_shape": [micro, seq],
                  "attention_shapes": [{"preset": "tiny", "seq_len": 128}] if cpu else shapes}},
        {"name": "resume", "stage": "resume", "limit_s": 120, "args": {"timeout_s": 300, "steps": 8}},
    ]
    if not cpu:  # Megatron-LM trains on CUDA only; its data and arguments are tested on CPU (tests/megatron)
        megatron_dir = os.environ.get("MEGATRON_LM_DIR", "/workspace/Megatron-LM")  # the image's
        stages.append({"name": "megatron_gpt", "stage": "megatron_gpt", "limit_s": 420,
                       "args": {"megatron_dir": megatron_dir, "iterations": 60, "save_at": 50, "timeout_s": 200}})
    recipe_stages = []
    for preset, (model, raw) in by_size:
        # The production step's micro-batches (its accumulation) on the one GPU: the optimizer's share of a
        # step is then the production job's (with one micro-batch it would weigh up to 12 times more).
        t = raw["train"]
        accumulation = t["global_batch_size"] // (t["micro_batch_size"] * cluster.models[model].world_size
                                                  // t.get("tensor_parallel", 1))
        args = {"config": str(cluster.models[model].config), "name": preset, "jobs_dir": str(jobs_dir),
                "steps": 8, "warmup": 3, "compile_steps": 3, "accumulation": accumulation,
                "micro_batch_size": t["micro_batch_size"],
                "overrides": [f"train.global_batch_size={t['micro_batch_size'] * accumulation}"]}
        if cpu:
            args.update(steps=4, warmup=1, preset="tiny", compile_check=False,
                        overrides=["data.seq_len=64", "train.micro_batch_size=2"])
        recipe_stages.append({"name": f"recipe:{preset}", "stage": "recipe", "limit_s": 150, "args": args,
                              "model": model})
    world = cluster.models[tp_model].world_size
    dp = world // tp_raw["train"].get("tensor_parallel", 1)
    full = _layers(tp_raw["model"]["preset"])
    # The full depth too: 80 layers of model7's rank 0 fit one H200 (~64 GiB extrapolated); the dry run predicts
    # the shallow ones (at 80 layers its trace would take minutes of CPU) and the slope extends it.
    rank0 = {"config": str(cluster.models[tp_model].config), "world_size": world, "layers": [4, 8, full],
             "predict_layers": [4, 8], "steps": 3, "full_layers": full,
             # two micro-batches per step (the measured step holds the first one's gradient shards)
             "overrides": ["model.vocab_size=32000", f"train.global_batch_size={2 * micro * dp}"]}
    if cpu:
        rank0.update(layers=[1, 2], predict_layers=[1, 2], steps=2,
                     overrides=["model.vocab_size=32000", "model.preset=small", "data.seq_len=64",
                                "train.micro_batch_size=1", f"train.global_batch_size={2 * dp}"])
    # The largest recipe first, then the production layout's rank 0, then the other recipes while time lasts,
    # then the levers (benchmarks/gpu_check/levers.py; their own call: --only lever).
    stages += [recipe_stages[0],
               {"name": f"rank0:{tp_model}", "stage": "layout_rank0", "limit_s": 120 if cpu else 300, "args": rank0}]
    stages += recipe_stages[1:2] if cpu else recipe_stages[1:]  # CPU: two recipes prove the loop
    return stages + lever_stages(recipe_stages, cpu)


def _parameters(preset: str) -> int:
    from training.models.presets import resolve

    arch = resolve(preset)
    return arch.parameters(arch.vocab or 32000)


def lever_stages(recipe_stages: list[dict], cpu: bool) -> list[dict]:
    """Each lever on and off (``benchmarks.gpu_check.levers.LEVERS``) on the recipes' 2-layer runs, from the same
    init and on the same data: every recipe bf16 against float8, the largest recipe each lever."""
    from benchmarks.gpu_check.levers import cpu_levers, levers_for

    stages = []
    for rank, recipe in enumerate(recipe_stages[:1] if cpu else recipe_stages):
        preset = recipe["name"].split(":", 1)[1]
        for lever in (cpu_levers() if cpu else levers_for(largest=rank == 0)):
            # One micro-batch per step (the recipe stage measures the production accumulation): the runs are
            # compared with each other, and 50 steps of the 70B's accumulation would not fit the budget.
            one = [] if cpu else [f"train.global_batch_size={recipe['args']['micro_batch_size']}"]
            args = {**recipe["args"], **lever.run(cpu), "name": f"{preset}-{lever.slug}",
                    "overrides": [*recipe["args"]["overrides"], *one, *lever.overrides(cpu)], "env": lever.env}
            stages.append({"name": f"lever:{preset}:{lever.name}", "stage": "recipe", "limit_s": lever.limit_s,
                           "args": args, "model": recipe["model"]})
    return stages


def _layers(preset: str) -> int:
    from training.models.presets import resolve

    return resolve(preset).layers


def predict_memory(stage: dict, gpu_memory_gib: float) -> float | None:
    """The dry run's per-GPU memory of a recipe stage (its config, 2 layers, one rank), GiB."""
    from training.layout_check import layout_config, predicted_memory

    args = stage["args"]
    cfg, _ = layout_config(args["config"], args.get("preset"), 2, args["steps"], args.get("overrides", []), 1)
    gib = {k: v / 2**30 for k, v in predicted_memory(cfg, 2, 1, gpu_memory_gib)["categories"].items()}
    return sum(gib.values())


def fit_micro_batch(stage: dict, gpu_memory_gib: float) -> None:
    """Halve a recipe stage's micro-batch until the dry run leaves 15 % of the GPU free (it says so)."""
    from training.config import read_config_file

    raw = read_config_file(stage["args"]["config"])
    micro = raw["train"]["micro_batch_size"]
    while True:
        stage["predicted_gib"] = predict_memory(stage, gpu_memory_gib)
        if stage["predicted_gib"] <= 0.85 * gpu_memory_gib or micro == 1:
            return
        micro //= 2
        stage["args"]["overrides"] = [o for o in stage["args"].get("overrides", [])
                                      if not o.startswith("train.micro_batch_size")] + [f"train.micro_batch_size={micro}"]
        stage["note"] = f"micro-batch {micro}: the recipe's does not fit one {gpu_memory_gib:.0f} GiB GPU with 2 layers"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_stage(stage: dict, work: Path, cpu: bool, limit_s: float) -> dict:
    """The stage in a process of its own (a fake process group, a crash or a hang stays there)."""
    folder = work / stage["name"].replace(":", "_")
    folder.mkdir(parents=True, exist_ok=True)
    result = folder / "result.json"
    # torchao for the float8 stages, where make deps put it (requirements-float8.txt): last, after the caller's.
    # Not on a CPU, which refuses float8 anyway: transformers would import it at every start of every stage.
    float8 = str(FLOAT8_PACKAGES) if FLOAT8_PACKAGES.is_dir() and not cpu else None
    path = os.pathsep.join(filter(None, [str(REPO / "jobs"), str(REPO), os.environ.get("PYTHONPATH"), float8]))
    env = {**os.environ, "PYTHONPATH": path, "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "PYTHONUNBUFFERED": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(var, None)
    if cpu:
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    args = json.dumps({**stage["args"], "cpu": cpu, "work": str(folder)})
    start = time.perf_counter()
    with open(folder / "log.txt", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu_check.stages", stage["stage"], args, str(result)],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    seconds = round(time.perf_counter() - start, 1)
    tail = (folder / "log.txt").read_text(errors="replace")[-2500:]
    if code is None:
        return {"status": "timed out", "seconds": seconds, "limit_s": limit_s, "log_tail": tail}
    if code or not result.exists():
        return {"status": "failed", "seconds": seconds, "exit_code": code, "log_tail": tail}
    return {"status": "done", "seconds": seconds, "limit_s": limit_s, **json.loads(result.read_text())}


def recipe_checks(results: dict) -> list[dict]:
    """The acceptance report's memory and MFU checks of every measured recipe, built by the same functions
    (``cluster_checks.layout_checks``): ``python -m cluster_config plan --measured`` reads their ratios."""
    from dataclasses import asdict

    from cluster_checks.layout_checks import mfu, peak_memory

    checks = []
    for name, r in results.items():
        if not name.startswith("recipe:") or r.get("status") != "done" or not r.get("peak_memory_gib"):
            continue
        layout = name.split(":", 1)[1]
        peak = r.get("peak_flops") or 989e12  # reports before peak_flops was kept: the H100's, as metrics.py has it
        per_token = r.get("flops_per_token") or r["mfu"] * peak / r["tokens_per_s_per_gpu"]
        checks += [asdict(peak_memory(layout, r["peak_memory_gib"], r.get("predicted_memory_gib"))),
                   asdict(mfu(layout, r["tokens_per_s_per_gpu"], per_token, peak, r.get("expected_mfu")))]
    return checks


def summary(name: str, r: dict) -> str:
    """One line of figures per stage for the table."""
    if r["status"] != "done":
        return r.get("why") or (r.get("log_tail", "").strip().splitlines() or [""])[-1][:150]
    if name == "environment":
        runtime = r.get("runtime_gib") or {}
        attention = "; ".join(f"{a['preset']}: " + ", ".join(
            f"{v.get('backend', v.get('error', '?')[:60])}{' (bwd bitwise)' if v.get('backward_bitwise_repeatable') else ''}"
            for v in (a["default"], a["deterministic"])) for a in r.get("attention") or [])
        return (f"groups' timeouts {'ok' if r['group_timeouts_ok'] else 'WRONG'}; recorders "
                f"{', '.join(r['flight_recorders'])}; runtime {runtime.get('after_nccl', float('nan')):.2f} GiB; "
                f"{attention}")
    if name == "resume":
        return (f"steps {r['steps_compared']}: data order {'same' if r['same_data_order'] else 'DIFFERENT'}, "
                f"losses {'bitwise equal' if r['bitwise_equal'] else 'max rel. diff %.2g' % r['max_relative_difference']}"
                f" (deterministic: {r['deterministic']}, {r['stager']})")
    if name.startswith(("recipe:", "lever:")):
        parts = [r.get("layout", "")]
        if r.get("peak_memory_gib") is not None:
            parts.append(f"peak {r['peak_memory_gib']:.1f} GiB vs dry run {r.get('predicted_memory_gib') or 0:.1f}")
        if r.get("mfu") is not None:
            parts.append(f"MFU {100 * r['mfu']:.1f} % vs plan {100 * (r.get('expected_mfu') or 0):.1f} %")
        if r.get("compile_s") is not None:
            parts.append(f"first step +{r['compile_s']:.0f} s")
        if r.get("error"):
            parts.append(r["error"][:100])
        return "; ".join(parts)
    rows = "; ".join(f"{row['layers']} layers: " + (row["error"][:80] if "error" in row else
                     f"{row.get('peak_memory_gib', float('nan')):.1f} GiB"
                     + (f" vs {row['predicted_memory_gib']:.1f}" if row.get("predicted_memory_gib") else "")
                     + f", eval recompile {row['first_eval_s'] - row['second_eval_s']:.0f} s") for row in r["rows"])
    torch_note = f" (dry run on torch {r['predicted_torch']})" if r.get("predicted_torch") else ""
    return f"{r.get('layout')}: {rows}{torch_note}"


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny widths on the CPU (gloo, fake process group)")
    parser.add_argument("--dry", action="store_true", help="print the plan and the predicted memory; run nothing")
    parser.add_argument("--budget-s", type=float, default=480, help="seconds for all stages (default 480)")
    parser.add_argument("--only", help="comma-separated stage names or prefixes (e.g. environment,recipe)")
    parser.add_argument("--set", action="append", default=[], metavar="section.key=value",
                        help="an override for the recipe and rank0 stages' configs (e.g. train.compile=false)")
    parser.add_argument("--jobs-dir", type=Path, help=f"a jobs bundle (default: {ENV}'s, written from the settings)")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/gpu_check.json"))
    parser.add_argument("--combine", nargs="+", type=Path, metavar="REPORT",
                        help="merge reports of runs of some stages each (a later one's stage replaces an earlier's)")
    args = parser.parse_args(argv)
    if args.combine:
        return write_report(combine([json.loads(path.read_text()) for path in args.combine]), Path(args.out))
    import torch

    gpu = torch.cuda.is_available() and not args.cpu
    if not gpu and not args.cpu and not args.dry:
        parser.error("no GPU here: pass --cpu for the CPU mode, or --dry for the plan")
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if gpu else 80.0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        work = Path(tmp)
        jobs_dir = production_jobs(args.jobs_dir, work)
        stages = plan(jobs_dir, cpu=args.cpu)
        if args.only:
            wanted = args.only.split(",")
            stages = [s for s in stages if any(s["name"] == w or s["name"].startswith(w + ":") for w in wanted)]
        for stage in stages:
            if stage["stage"] in ("recipe", "layout_rank0"):
                stage["args"]["overrides"] = [*stage["args"].get("overrides", []), *args.set]
            if stage["name"].startswith("recipe:") and (args.dry or gpu):  # lever stages: the recipe's micro-batch
                fit_micro_batch(stage, gpu_gib)
        if args.dry:
            print(f"plan ({'CPU' if args.cpu else f'a {gpu_gib:.0f} GiB GPU'}, budget {args.budget_s:.0f} s):")
            for s in stages:
                memory = f", dry run {s['predicted_gib']:.1f} GiB" if "predicted_gib" in s else ""
                print(f"  {s['name']:<22} limit {s['limit_s']:>4} s{memory}{'; ' + s['note'] if s.get('note') else ''}")
            return 0
        results = {}
        for stage in stages:
            left = args.budget_s - (time.perf_counter() - started)
            if left < min(stage["limit_s"], 60):
                results[stage["name"]] = {"status": "skipped", "why": f"{left:.0f} s of the budget left"}
                continue
            print(f"== {stage['name']} (limit {min(stage['limit_s'], left):.0f} s)", flush=True)
            results[stage["name"]] = {**run_stage(stage, work, args.cpu, min(stage["limit_s"], left)),
                                      **{k: stage[k] for k in ("predicted_gib", "note") if k in stage}}
    from benchmarks.gpu_check.stages import versions

    report = {"mode": "cpu" if args.cpu else "gpu", "versions": versions(), "budget_s": args.budget_s, "set": args.set,
              "seconds": round(time.perf_counter() - started, 1), "stages": results}
    return write_report(report, Path(args.out))


def combine(reports: list[dict]) -> dict:
    """One report of several runs on one device: their stages (a later run's replaces an earlier's of the same
    name and settings; a run with ``--set`` keeps its stages under ``name [set]``) and seconds."""
    stages = {}
    for report in reports:
        for name, result in report["stages"].items():
            if result["status"] != "skipped":
                stages[f"{name} [{' '.join(report['set'])}]" if report.get("set") else name] = result
    return {**reports[-1], "set": [], "seconds": sum(r["seconds"] for r in reports), "stages": stages,
            "combined_from": len(reports)}


def write_report(report: dict, out: Path) -> int:
    """The report with its checks (what plan --measured reads), as JSON and a table; 1 if a stage failed."""
    from benchmarks.gpu_check.levers import lever_comparisons

    results = report["stages"]
    report["checks"] = recipe_checks(results)
    report["levers"] = lever_comparisons(results)  # reported, never read by plan --measured: prod's defaults follow them
    report["job"] = f"GPU proof on {report['versions']['device']}"
    report["verdict"] = "measured" if report["checks"] else "no recipe measured"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"\nGPU proof on {report['versions']['device']} (torch {report['versions']['torch']}), "
          f"{report['seconds']:.0f} s:")
    print("| stage | status | s | figures |\n|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['status']} | {r.get('seconds', '')} | {summary(name.split(' [')[0], r)} |")
    for check in report["checks"]:
        print(f"  {check['status']:<5} {check['name']}: {check['measured']} (expected {check['expected']})")
    for lever in report["levers"]:
        print(f"  lever {lever['recipe']} {lever['lever']}: {lever['summary']}")
    print(f"wrote {out}")
    return 0 if all(r["status"] in ("done", "skipped") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
