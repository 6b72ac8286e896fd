"""Branches only a GPU takes, taken here: the device binding, async tensor parallel's two switches, the
flight recorder a hang dumps, the collective timeout of the first evaluation, the metrics' definitions
and the dry run's attention workspace. Stand-ins only where the CPU build lacks the part (a CUDA device
count, NCCL's recorder, CUDA's peak-memory counters); the GPU proof (benchmarks.gpu_check) runs them for real."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from training.parallel import distributed

from training import train

from training.resilience import watchdog
from training.config import ConfigError
from training.dry_run import _attention_workspace, load_model_config
from training.components.metrics import Metrics, memory_gib
from training.models.llama import hf_config

REPO = Path(__file__).resolve().parents[2]


def run_script(script: str, timeout: float = 120) -> str:
    """``script`` in a Python process of its own (it joins a process group), the jobs folder on its path."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO / "jobs", capture_output=True,
                          text=True, timeout=timeout, env={"PATH": "/usr/bin:/bin", "MASTER_ADDR": "127.0.0.1",
                                                           "MASTER_PORT": "29577", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# --- more ranks than GPUs ---------------------------------------------------------------------------

@pytest.fixture
def one_gpu(monkeypatch):
    """A node that shows one GPU, and the process torchrun started as its second worker."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")


def test_a_rank_without_a_gpu_is_refused_with_the_fix_before_any_process_group(one_gpu):
    with pytest.raises(ConfigError) as refused:
        distributed.init(10)
    message = str(refused.value)
    assert "local rank 1 has no GPU: this node shows 1" in message
    assert "--nproc-per-node" in message and "CUDA_VISIBLE_DEVICES=" in message
    assert not torch.distributed.is_initialized()


def test_the_trainer_exits_2_with_that_message(one_gpu, tmp_path, monkeypatch, capsys):
    for var in ("FSX_DATA", "FSX_CHECKPOINTS", "FSX_LOGS"):
        monkeypatch.setenv(var, str(tmp_path))
    failure = tmp_path / "FAILURE"
    monkeypatch.setenv("TRAIN_FAILURE_FILE", str(failure))
    monkeypatch.setattr(train.faulthandler, "enable", lambda **_: None)  # pytest's captured stderr has no fd
    assert train.main(["--config", str(REPO / "jobs/training/configs/tiny.yaml")]) == 2
    assert "local rank 1 has no GPU" in capsys.readouterr().err
    assert failure.read_text().startswith("user: local rank 1 has no GPU")  # no requeue: a person must fix it


# --- async tensor parallel ---------------------------------------------------------------------------

def test_async_tp_turns_on_the_compiler_pass_and_symmetric_memory_for_the_tp_group():
    out = run_script("""
        import torch, torch.distributed as dist
        from torch.distributed import _symmetric_memory as symm_mem
        from training.parallel import distributed
        from training.dry_run import fake_dist, load_model_config
        from training.models.llama import build_model, hf_config
        cfg = load_model_config({}, ["model.preset=small", "data.seq_len=64", "train.tensor_parallel=2",
                                     "train.async_tp=true", "train.compile=true"])
        d = fake_dist(8)
        mesh = distributed.device_mesh(d, cfg.train)
        tp_group = mesh["tp"].get_group().group_name
        before = symm_mem.is_symm_mem_enabled_for_group(tp_group), torch._inductor.config._micro_pipeline_tp
        distributed.parallelize(build_model(hf_config("small", 256, 64)), cfg.train, d, mesh)
        after = symm_mem.is_symm_mem_enabled_for_group(tp_group), torch._inductor.config._micro_pipeline_tp
        other = symm_mem.is_symm_mem_enabled_for_group(mesh["dp_shard"].get_group().group_name)
        print(before, after, other)
    """)
    assert out.split("\n")[0] == "(False, False) (True, True) False"


# --- the flight recorders a hang dumps -----------------------------------------------------------------

@pytest.fixture
def recorders(monkeypatch):
    """NCCL's recorder (CUDA builds only) and gloo's, each returning what it holds."""
    from torch._C import _distributed_c10d as c10d

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "100")
    monkeypatch.setattr(c10d, "_dump_nccl_trace", lambda: b"nccl: the stuck all-gather", raising=False)
    monkeypatch.setattr(c10d, "_dump_fr_trace", lambda: b"gloo: the stop vote")


def test_a_hang_on_a_gpu_dumps_ncclss_recorder_as_the_trace_and_gloos_beside_it(tmp_path, monkeypatch, recorders):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    exits = []
    dog = watchdog.ProgressWatchdog(log_dir=tmp_path, rank=3, init_timeout_s=0.2, floor_s=0.2, linger_s=0,
                                    exit=exits.append, on_gpu=True)
    dog._fire(1.0, 0.2)
    assert exits == [watchdog.EXIT_HANG]
    assert (tmp_path / "fr_trace_7_rank3.pkl").read_bytes() == b"nccl: the stuck all-gather"
    assert (tmp_path / "fr_control_7_rank3.pkl").read_bytes() == b"gloo: the stop vote"


def test_on_a_cpu_the_trace_is_gloos(tmp_path, recorders):
    written = watchdog.dump_flight_recorders(tmp_path, "7_rank0", on_gpu=False)
    assert written == [tmp_path / "fr_trace_7_rank0.pkl"]
    assert written[0].read_bytes() == b"gloo: the stop vote"


def test_no_dump_when_the_recorders_are_off(tmp_path, recorders, monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    assert watchdog.dump_flight_recorders(tmp_path, "7_rank0", on_gpu=True) == []


# --- the first evaluation's collective timeout ---------------------------------------------------------

def test_collective_timeout_raises_every_training_group_then_restores_it():
    out = run_script("""
        import torch
        from training.parallel import distributed
        d = distributed.init(300)
        distributed.set_timeout(d, 100)  # after the first step
        read = lambda: sorted({g._get_backend(torch.device("cpu")).options._timeout.total_seconds() for g in d.groups})
        with distributed.collective_timeout(d, 300):
            inside = read()
        print(inside, read(), d.timeout.total_seconds())
        distributed.shutdown()
    """)
    assert out.split("\n")[0] == "[300.0] [100.0] 100.0"


# --- torch.compile's caches across a requeue ----------------------------------------------------------

def test_compile_caches_live_in_the_models_checkpoint_folder_unless_the_environment_says(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    train.keep_compile_cache(str(tmp_path / "model3"))
    assert cache_dir() == str(tmp_path / "model3/compile_cache")  # where inductor reads and writes them
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    train.keep_compile_cache(str(tmp_path / "model3"))
    assert cache_dir() == str(tmp_path / "mine")


# --- metrics ------------------------------------------------------------------------------------------

def test_tokens_per_second_leave_out_checkpoint_blocking_as_they_leave_out_evaluation(tmp_path):
    metrics = Metrics(log_dir=str(tmp_path), tensorboard_dir=str(tmp_path / "tb"), is_main=False, world_size=2,
                      device=torch.device("cpu"), tokens_per_step=1000, flops_per_token=1.0, run_name="t", config={},
                      total_steps=10)
    now = [0.0]
    metrics.clock = lambda: now[0]
    metrics.interval_start = 0.0
    for _ in range(2):
        metrics.add_step(data_wait=0.0, samples=0)
    metrics.add_checkpoint_block(3.0)
    metrics.emit_eval(2, {"val_loss": 1.0}, seconds=1.0)  # 1 s of evaluation
    now[0] = 6.0  # 6 s: 1 evaluating, 3 blocked in a save, 2 training
    record = metrics.emit(2, loss=1.0, lr=0.1, grad_norm=1.0)
    assert record["tokens_per_s"] == 2000 / 2.0
    assert record["tokens_per_s_per_device"] == 2000 / 2.0 / 2
    assert record["checkpoint_block_s"] == 3.0 and record["step_time_s"] == 1.0


def test_gpu_memory_is_each_intervals_own_peak(monkeypatch):
    peaks, resets = iter([10 * 2**30, 4 * 2**30]), []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: next(peaks))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: resets.append(device))
    gpu = torch.device("cuda", 0)
    assert (memory_gib(gpu), memory_gib(gpu)) == (10.0, 4.0)  # the compile warm-up's 10 GiB leaves the figure
    assert resets == [gpu, gpu]


# --- the dry run's attention workspace ----------------------------------------------------------------

def test_attention_workspace_holds_this_ranks_heads_only():
    def workspace(tp: int) -> int:
        cfg = load_model_config({}, ["model.preset=llama2-70b", "data.seq_len=4096", "train.micro_batch_size=4",
                                     f"train.tensor_parallel={tp}"])
        return _attention_workspace(hf_config("llama2-70b", 32000, 4096), cfg)

    assert workspace(1) == 4 * 4096 * 8192 * 4  # fp32 query gradient of every head: 0.5 GiB
    assert workspace(8) == workspace(1) // 8  # tensor parallel splits the heads
