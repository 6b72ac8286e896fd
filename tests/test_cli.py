"""The command-line convention of docs/cli.md, for every entry point: a bad argument exits 2 with
``error: <what> — <fix>`` as the last line on stderr, and no traceback."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.modules_in_turn import run_in_turn

ROOT = Path(__file__).resolve().parents[1]
PY = [sys.executable, "-m"]

# (command, what the error line must say). Modules run from the repository root with jobs/ on the
# path, as on the cluster (jobs/env.sh) and in the local cluster's jobs.
ENTRY_POINTS = [
    (PY + ["data_pipeline.upload", "sync", "raw", "s3://bucket/raw", "--wokers", "8"],
     "unrecognized arguments: --wokers 8 — see python -m data_pipeline.upload --help"),
    (PY + ["data_pipeline.upload", "verify", "bucket/raw"], "'bucket/raw' is not an S3 URL — write it as s3://"),
    (PY + ["data_pipeline.validate", "/nonexistent"], "no dataset.json in /nonexistent — build the dataset"),
    (PY + ["data_pipeline.validate", "--seq-len", "many", "x"], "argument --seq-len: invalid int value: 'many' — see"),
    (PY + ["data_pipeline.isolation", "x", "--seq-len", "8", "--batch-size", "2", "--pin-memory=yes"],
     "argument --pin-memory/--no-pin-memory: ignored explicit argument 'yes' — see python -m data_pipeline.isolation"),
    (PY + ["data_pipeline.tokenize", "run", "--input-dir", "x"], "the following arguments are required: --out"),
    (PY + ["data_pipeline.prepare", "--out", "x", "--input", "/nonexistent.txt"], "input /nonexistent.txt does not exist"),
    (PY + ["megatron_lm.args", "nomodel"], "model nomodel has no megatron: entry in the cluster's settings — add one"),
    (PY + ["cluster_config.megatron", "--env", "nope"], "no environment 'nope'"),
    (PY + ["data_pipeline.sample_data"], "the following arguments are required: out_dir — see python -m data_pipeline.sample_data"),
    (PY + ["data_pipeline.megatron_export", "x"], "the following arguments are required: prefix — see"),
    (PY + ["training.train", "train.stpes=5"], "unknown config key 'train.stpes'; remove it or fix the spelling"),
    (PY + ["training.train", "--confg", "x.yaml"], "unrecognized arguments: --confg — see python -m training.train --help"),
    (PY + ["training.checkpoints.backup", "/nonexistent", "s3://bucket/x"], "/nonexistent/latest does not exist — check the folder"),
    (PY + ["training.plot", "/nonexistent/metrics.jsonl", "--out", "x.png"], "— pass the metrics.jsonl of a run"),
    (PY + ["training.dry_run", "model1", "--jobs-dir", "/nonexistent"],
     "no /nonexistent/models/cluster.json — write one with python -m cluster_config jobs --env ENV --out DIR"),
    (PY + ["training.status", "--env", "prod", "--jobs-dir", "/nonexistent"],
     "no /nonexistent/models/cluster.json — write prod's with python -m cluster_config jobs --env prod --out DIR"),
    (PY + ["monitoring.exporter", "--interval", "x"], "argument --interval: invalid float value: 'x' — see"),
    (PY + ["monitoring.exporter", "--once", "--textfile-dir", "/nonexistent"], "/nonexistent is not a folder — create it"),
    (PY + ["cluster_checks.fsx_perf", "/fsx", "--out", "x", "--tool", "dd"], "argument --tool: invalid choice: 'dd'"),
    (PY + ["cluster_checks.nccl_tests", "/nonexistent_perf.log", "--out-dir", "x"], "— pass the *_perf.log files"),
    (PY + ["cluster_checks.collectives", "--out-dir", "x", "--backend", "mpi"], "argument --backend: invalid choice"),
    (PY + ["cluster_checks.input_diagnosis", "--out", "x", "--steps", "1"], "--workers must be >= 0, --batches >= 1, --steps >= 2 — see"),
    (PY + ["training.layout_check", "--recipe", "/nonexistent.yaml"],
     "config file /nonexistent.yaml does not exist; see jobs/training/configs/ for examples"),
    (PY + ["cluster_checks.acceptance", "report", "/nonexistent"],
     "/nonexistent is not a folder — pass the acceptance job's results folder"),
    (PY + ["cluster_checks.node_record", "--queue", "gpu"], "the following arguments are required: --out — see"),
    (PY + ["local_cluster.client", "wait"], "the following arguments are required: job — see python -m local_cluster.client wait"),
    (PY + ["local_cluster.training_demo", "--steps", "x"], "argument --steps: invalid int value: 'x'"),
    (PY + ["local_cluster.alert_drills", "--bogus"], "unrecognized arguments: --bogus — see python -m local_cluster.alert_drills"),
    (PY + ["local_cluster.alert_receiver"], "the following arguments are required: --listen, --jsonl, --log — see"),
    (PY + ["local_cluster.stand_ins.dcgm_exporter"], "the following arguments are required: --hostname, --listen, --faults"),
    (PY + ["local_cluster.stand_ins.clustermgtd"], "the following arguments are required: --replacement-s, --log — see"),
    ([sys.executable, "local_cluster/stand_ins/trainer.py", "--confg", "x"], "unrecognized arguments: --confg — see"),
    (PY + ["local_cluster.demo_data"], "the following arguments are required: out_dir — see python -m local_cluster.demo_data"),
    (PY + ["benchmarks.training", "--saves"], "argument --saves: expected one argument — see python -m benchmarks.training"),
    (PY + ["benchmarks.data_pipeline", "--size-mb", "big"], "argument --size-mb: invalid float value: 'big' — see"),
    (PY + ["benchmarks.communication", "--model", "model9"], "model 'model9' is not in the prod plan; choose one of"),
    (PY + ["benchmarks.recovery", "--faults", "sigterm"], "argument --faults: invalid choice: 'sigterm'"),
    (PY + ["benchmarks.false_eviction", "--runs", "x"], "argument --runs: invalid int value: 'x' — see"),
    (PY + ["benchmarks.goodput_simulation", "--minutes", "0"], "--days and --minutes must be > 0, --gpu-share within"),
    (PY + ["cluster_config", "plan", "--env", "nope"], "no environment 'nope'"),
    (PY + ["cluster_config", "render"], "the following arguments are required: --env — see python -m cluster_config render"),
    (PY + ["cluster_config", "alerts", "--bogus"], "unrecognized arguments: --bogus — see python -m cluster_config --help"),
    (PY + ["stacks.checkov", "/nonexistent"], "/nonexistent is not a folder — synthesize the templates first: make synth"),
    ([sys.executable, "app.py"], "no environment chosen: pass -c env=NAME"),
    (["local_cluster/cluster.sh", "restart"], "unknown command 'restart' — usage:"),
    (["bash", "jobs/train.sh"], "no model given — usage: train.sh MODEL"),
    (["bash", "jobs/usage.sh", "-t", "days"], "unknown unit 'days' — usage: usage.sh [-t hours|minutes|seconds] [START]"),
]


def run_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT / "jobs"), "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
            "CDK_CONTEXT_JSON": json.dumps({})}


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_every_entry_point_exits_2_with_one_error_line_on_a_bad_argument():
    def refused(status: int | None, stderr: str, expected: str) -> bool:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        return status == 2 and last.startswith("error: ") and expected in last and "Traceback" not in stderr

    # The python -m ones in turn by two Pythons first (each start imports torch or jsii: seconds apiece); what
    # is not refused as expected there, and the other commands, run as command lines of their own.
    modules = [i for i, (command, _) in enumerate(ENTRY_POINTS) if command[:2] == PY]
    in_turn = run_in_turn([ENTRY_POINTS[i][0][2:] for i in modules], cwd=ROOT, env=run_env())
    done = {i for i, answer in zip(modules, in_turn) if answer and refused(answer[0], answer[2], ENTRY_POINTS[i][1])}
    again = [i for i in range(len(ENTRY_POINTS)) if i not in done]
    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(again, pool.map(run, [ENTRY_POINTS[i][0] for i in again])))
    wrong = []
    for i, result in results.items():
        (command, expected), last = ENTRY_POINTS[i], (result.stderr.strip().splitlines() or [""])[-1]
        if not refused(result.returncode, result.stderr, expected):
            wrong.append(f"{' '.join(command[-4:])}: exit {result.returncode}, last stderr line {last!r}")
    assert not wrong, "\n".join(wrong)


def test_progress_in_a_log_is_a_percent_rate_and_eta_line():
    from concurrent.futures import ThreadPoolExecutor as Pool

    from cli.progress import Progress

    lines: list[str] = []
    progress = Progress(1000, "upload", every=0, write=lines.append, tty=False)  # every=0: a line per update
    with Pool(4) as pool:  # the upload and hashing pools update from their threads
        list(pool.map(progress.update, [100] * 10))
    progress.close()
    assert progress.done == 1000 and len(lines) == 11
    assert re.fullmatch(r"upload: 10\.0% \(100\.0 B of 1\.0 kB\), [\d.]+ [kMGT]?B/s, eta \d+:\d\d:\d\d", lines[0])
    assert lines[-1].startswith("upload: 100.0% (1.0 kB of 1.0 kB), ") and lines[-1].endswith("eta 0:00:00")


def test_training_help_lists_every_config_key_with_its_default(capsys):
    from training.config import Config
    from training.train import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: python -m training.train ")
    for section, field in Config.model_fields.items():
        keys = getattr(field.annotation, "model_fields", None) or {None: field}
        for key, sub in keys.items():
            name = f"{section}.{key}" if key else section
            assert f"  {name}={sub.default!r}" in out, name
    assert "  train.steps=1000  optimizer steps in the whole run" in out
