"""How a training step's ending is classified: complete, relaunch or requeue (within the budget), user error, give up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from training.resilience import recovery

HOUR = 3600.0


@pytest.fixture
def job(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")


def decide(log_dir, *, exit_code=1, status="none", reason="", now=100 * HOUR, budget=2, relaunches=0, nodes_up=2,
           train_nodes=2, fewer=None):
    return recovery.decide(log_dir, exit_code=exit_code, status=status, reason=reason, max_recoveries=budget,
                           window_hours=24, max_relaunches=relaunches, nodes_up=nodes_up, train_nodes=train_nodes,
                           now=now, fewer=fewer)


def events(log_dir):
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


def test_complete_and_time_limit_stop(tmp_path, job):
    assert decide(tmp_path, exit_code=0, status="complete")[0] == "complete"
    action, message = decide(tmp_path, exit_code=0, status="stopped")
    assert action == "requeue" and "time limit" in message
    # A planned stop never uses up the budget.
    for _ in range(5):
        assert decide(tmp_path, exit_code=0, status="stopped")[0] == "requeue"
    assert decide(tmp_path)[0] == "requeue"


def test_failures_requeue_until_the_budget_is_spent_with_a_clear_message(tmp_path, job):
    assert decide(tmp_path, reason="hang: rank 1 ...", now=100 * HOUR) == (
        "requeue", "recovery 1 of 2 in 24 h: hang: rank 1 ...; requeueing to resume from latest")
    assert decide(tmp_path, now=101 * HOUR)[0] == "requeue"
    action, message = decide(tmp_path, exit_code=137, now=102 * HOUR)
    assert action == "give-up"
    assert message.startswith("retry budget spent: 2 recoveries of job 41 in the last 24 h (MAX_RECOVERIES=2); "
                              "last cause: a training process failed (srun exit 137)")
    last = events(tmp_path)[-1]
    assert last["event"] == "recovery" and last["action"] == "stop" and last["budget_spent"]
    assert last["restart_count"] == 2 and last["nodes"] == "node[1-2]"
    # The window slides: a day after the first two, there is budget again.
    assert decide(tmp_path, now=125.5 * HOUR)[0] == "requeue"


def test_a_failure_relaunches_in_the_job_until_its_relaunches_are_spent_then_requeues(tmp_path, job, monkeypatch):
    relaunch = dict(budget=4, relaunches=2, nodes_up=3, train_nodes=2)
    action, message = decide(tmp_path, reason="hang: rank 1 ...", **relaunch)
    assert (action, message) == ("relaunch", "recovery 1 of 4 in 24 h: hang: rank 1 ...; relaunching in the same job "
                                 "(relaunch 1 of 2) on 2 of 3 healthy nodes, from latest")
    assert decide(tmp_path, exit_code=137, **relaunch)[0] == "relaunch"
    action, message = decide(tmp_path, **relaunch)
    assert action == "requeue" and "in-job relaunches spent (2 of MAX_RELAUNCHES=2): requeueing" in message
    assert [(e["action"], e["recovery"], e.get("relaunch")) for e in events(tmp_path)] == [
        ("relaunch", 1, 1), ("relaunch", 2, 2), ("requeue", 3, None)]
    assert events(tmp_path)[0]["nodes_up"] == 3 and events(tmp_path)[0]["train_nodes"] == 2
    # The requeued job has new nodes and relaunches again; the relaunches count against the retry budget,
    # so a crash loop inside one allocation ends too.
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    assert decide(tmp_path, **relaunch)[0] == "relaunch"
    action, message = decide(tmp_path, **relaunch)
    assert action == "give-up" and message.startswith("retry budget spent: 4 recoveries of job 41")


def test_too_few_healthy_nodes_for_a_relaunch_requeue_the_job(tmp_path, job):
    action, message = decide(tmp_path, relaunches=3, nodes_up=1, train_nodes=2)
    assert action == "requeue" and "1 healthy nodes in the allocation, training needs 2: requeueing" in message
    assert events(tmp_path)[-1]["not_relaunched"] == "1 healthy nodes in the allocation, training needs 2"


def test_a_planned_stop_or_a_user_error_is_never_relaunched(tmp_path, job):
    assert decide(tmp_path, exit_code=0, status="stopped", relaunches=3)[0] == "requeue"
    assert decide(tmp_path, exit_code=2, reason="user: bad data", relaunches=3)[0] == "user-error"
    assert decide(tmp_path, exit_code=127, relaunches=3)[0] == "user-error"


def test_the_budget_belongs_to_one_job(tmp_path, job, monkeypatch):
    decide(tmp_path), decide(tmp_path)
    assert decide(tmp_path)[0] == "give-up"
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # resubmitted by a human: a fresh budget
    assert decide(tmp_path)[0] == "requeue"


def test_user_error_is_never_requeued(tmp_path, job):
    action, message = decide(tmp_path, reason="user: config error: train.steps: expected int, got 'abc'")
    assert action == "user-error"
    assert "train.steps: expected int" in message and "not requeued" in message


def test_a_launcher_that_cannot_start_is_not_requeued(tmp_path, job):
    """torchrun missing from the jobs' venv failed all five recoveries alike on the local cluster."""
    action, message = decide(tmp_path, exit_code=127)
    assert action == "user-error"
    assert message.startswith("the launcher could not start (srun exit 127: command not found)") and "not requeued" in message
    assert decide(tmp_path, exit_code=1)[0] == "requeue"  # any other failure still is
    assert decide(tmp_path, exit_code=127, reason="hang: rank 0")[0] == "requeue"  # the trainer ran and said why


def test_command_line_prints_the_action_and_logs_launch_events(tmp_path):
    env = {"PYTHONPATH": "jobs", "SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1", "MAX_RECOVERIES": "0"}
    run = lambda *args: subprocess.run([sys.executable, "-m", "training.resilience.recovery", *args], env=env,
                                       capture_output=True, text=True, check=True)
    run("start", str(tmp_path))
    (tmp_path / "FAILURE").write_text("hang: rank 0 ...\n")
    result = run("decide", str(tmp_path), "--exit", "1", "--status", "none", "--reason-file", str(tmp_path / "FAILURE"))
    assert result.stdout == "give-up\n" and "retry budget spent" in result.stderr
    launch = events(tmp_path)[0]
    assert launch["event"] == "launch" and launch["job"] == "7" and launch["restart_count"] == 1
    env.update(MAX_RECOVERIES="5", MAX_RELAUNCHES="3")
    result = run("decide", str(tmp_path), "--exit", "1", "--nodes-up", "3", "--train-nodes", "2", "--ended-at", "1234.5")
    assert result.stdout == "relaunch\n" and "relaunching in the same job (relaunch 1 of 3) on 2 of 3" in result.stderr
    assert events(tmp_path)[-1]["step_ended"] == 1234.5  # srun's end: the detection, apart from the node probe
    run("start", str(tmp_path), "--relaunch", "1", "--nodes", "node1,node3")
    relaunched = events(tmp_path)[-1]
    assert (relaunched["event"], relaunched["relaunch"], relaunched["nodes"]) == ("launch", 1, "node1,node3")
    # One node of two left, as jobs/train.sh asks: the trainer's own arguments after --, its config read as it reads it.
    env.update(FSX_CHECKPOINTS=str(tmp_path), FSX_LOGS=str(tmp_path), FSX_DATA=str(tmp_path))
    result = run("decide", str(tmp_path), "--exit", "1", "--nodes-up", "1", "--train-nodes", "2", "--min-nodes", "1",
                 "--gpus-per-node", "1", "--", "--config", "jobs/training/configs/tiny.yaml", "--model", "model1",
                 "train.micro_batch_size=16")
    assert result.stdout == "fewer 1 16\n" and "going on with 1 of the 2 nodes" in result.stderr


def test_with_no_spare_free_the_run_goes_on_with_fewer_nodes_keeping_its_global_batch(tmp_path, job, monkeypatch):
    from training.config import load_config

    monkeypatch.setenv("FSX_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("FSX_LOGS", str(tmp_path / "logs"))

    # 4 nodes x 8 GPUs, micro-batch 2, global batch 1024 (prod's model1): on 3 nodes 24 ranks divide it with no
    # micro-batch; on 2 nodes 16 ranks x micro-batch 2 x 32 micro-batches do.
    cfg = load_config(None, ["train.global_batch_size=1024", "train.micro_batch_size=2", "data.path=/data"])
    assert recovery.fewer_nodes(cfg, 3, 8, min_nodes=2) == (2, 2, "")
    # 1088 sequences (prod's model7) on 33 nodes x 8 GPUs at tensor parallel 8: no micro-batch divides it;
    # on 32, micro-batch 2 (17 of them a step) does.
    tp8 = load_config(None, ["model.preset=llama2-7b", "train.global_batch_size=1088", "train.micro_batch_size=4",
                             "train.parallelism=fsdp",
                             "train.tensor_parallel=8", "data.path=/data"])
    assert recovery.fewer_nodes(tp8, 33, 8, min_nodes=30) == (32, 2, "")
    nodes, micro, why = recovery.fewer_nodes(cfg, 3, 8, min_nodes=3)
    assert (nodes, micro) == (0, 0) and why.startswith("the global batch 1024 divides on none of 3 to 3 nodes of 8 GPUs")

    fewer = lambda up: recovery.fewer_nodes(cfg, up, 8, min_nodes=2)  # noqa: E731
    action, message = decide(tmp_path, relaunches=3, nodes_up=3, train_nodes=4, fewer=fewer)
    assert action == "fewer 2 2" and "no spare node free: going on with 2 of the 4 nodes in the same job" in message
    assert events(tmp_path)[-1] | {"fewer_than": 4, "train_nodes": 2, "action": "relaunch"} == events(tmp_path)[-1]
    # Where the batch divides on none of the nodes allowed, the reason is logged and the job requeues.
    action, message = decide(tmp_path, relaunches=3, nodes_up=2, train_nodes=4,
                             fewer=lambda up: recovery.fewer_nodes(cfg, up, 8, min_nodes=3))
    assert action == "requeue" and "not going on with fewer: the global batch 1024 divides on none of 3 to 2" in message


def test_a_second_failure_on_fewer_nodes_goes_on_with_fewer_still_down_to_min_nodes_then_requeues(tmp_path, job,
                                                                                                  monkeypatch):
    """While the run trains on fewer nodes (jobs/train.sh passes their count as --train-nodes), another node lost
    takes it to fewer still where models.<m>.min_nodes allows, each a relaunch of the allocation's budget; below
    min_nodes, the job requeues (and waits for nodes)."""
    from training.config import load_config

    monkeypatch.setenv("FSX_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("FSX_LOGS", str(tmp_path / "logs"))
    # 4 nodes x 1 GPU, global batch 32, micro-batch 4: 3 nodes divide it with no micro-batch, 2 and 1 do.
    cfg = load_config(None, ["train.global_batch_size=32", "train.micro_batch_size=4", "data.path=/data"])

    def fewer(min_nodes):
        return lambda up: recovery.fewer_nodes(cfg, up, 1, min_nodes=min_nodes)

    assert decide(tmp_path, budget=5, relaunches=3, nodes_up=3, train_nodes=4, fewer=fewer(1))[0] == "fewer 2 4"
    action, message = decide(tmp_path, budget=5, relaunches=3, nodes_up=1, train_nodes=2, fewer=fewer(1))
    assert action == "fewer 1 4" and "going on with 1 of the 2 nodes in the same job (relaunch 2 of 3)" in message
    assert events(tmp_path)[-1] | {"train_nodes": 1, "fewer_than": 2, "relaunch": 2} == events(tmp_path)[-1]
    # The same second failure where min_nodes is 2: no fewer nodes allowed, a requeue.
    other = tmp_path / "other"
    assert decide(other, budget=5, relaunches=3, nodes_up=3, train_nodes=4, fewer=fewer(2))[0] == "fewer 2 4"
    action, message = decide(other, budget=5, relaunches=3, nodes_up=1, train_nodes=2, fewer=fewer(2))
    assert action == "requeue" and "1 healthy nodes in the allocation, training needs 2" in message
    assert "divides on none of 2 to 1" in message
    # A rank failing on a live node while on fewer nodes: relaunched on the same ones, still fewer.
    assert decide(tmp_path, budget=5, relaunches=3, nodes_up=1, train_nodes=1, fewer=fewer(1))[0] == "relaunch"
