"""The Capacity Blocks' end, from the settings: the maintenance reservation the head node makes, each model's
--time-min, the backups' start, and the synth-time check that every model can save before AWS terminates."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone

import pytest

from cluster_config.capacity_end import (
    RESERVATION,
    TIME_LIMIT_CHECK_S,
    capacity_end,
    capacity_end_digest,
    capacity_end_file,
    capacity_end_key,
    check_capacity_end,
    save_seconds,
    time_min_s,
)
from cluster_config.model_jobs import job_files
from cluster_config.render import ClusterResources, render_cluster_config
from cluster_config.settings import SettingsError, load_settings
from cluster_config.slurm_timeouts import kill_wait_seconds
from stacks.app import settings_for

BLOCK_END = "2027-01-18T11:30:00Z"  # 30 minutes of AWS's notice before it: instances go from 11:00


def with_end(tmp_path, write_env, env="prod", **changes):
    """``env``'s settings with every Capacity Block ending at BLOCK_END (and ``changes``)."""
    if env == "prod":
        changes = {"gpu_queue__capacity_reservations__0__end": BLOCK_END,
                   "gpu_queue__capacity_reservations__1__end": BLOCK_END, **changes}
    return write_env(tmp_path, env, **changes)


def test_reservation_starts_the_lead_before_the_termination_and_backups_begin_after_every_save(tmp_path, write_env):
    settings = load_settings("prod", with_end(tmp_path, write_env))
    window = check_capacity_end(settings)
    terminate = datetime(2027, 1, 18, 11, 0, tzinfo=timezone.utc)
    assert window.terminate == terminate and window.end == terminate + timedelta(minutes=30)
    assert window.start == terminate - timedelta(minutes=settings.gpu_queue.capacity_end_lead_min)
    # A save that overran the cut limit runs under SIGTERM for KillWait after Slurm's time-limit pass.
    kill_wait = kill_wait_seconds(settings)
    assert window.backups == window.start + timedelta(seconds=kill_wait + TIME_LIMIT_CHECK_S) <= window.terminate
    assert settings.gpu_queue.capacity_end_lead_min == 15  # prod's: all seven models' last saves at once
    assert capacity_end_file(settings).splitlines()[1] == (
        f"reservation={RESERVATION} partition=gpu start=2027-01-18T10:45:00Z end=2027-01-18T11:30:00Z "
        f"backups=2027-01-18T10:{45 + (kill_wait + TIME_LIMIT_CHECK_S) // 60:02d}:00Z")
    assert capacity_end_key(settings) == "cluster/llm-prod.capacity_end"


def test_no_end_makes_a_file_without_a_reservation(tmp_path, write_env):
    settings = load_settings("dev")
    assert capacity_end(settings) is None and check_capacity_end(settings) is None
    assert [line for line in capacity_end_file(settings).splitlines() if not line.startswith("#")] == []


def test_the_earliest_block_decides(tmp_path, write_env):
    settings = load_settings("prod", with_end(tmp_path, write_env, gpu_queue__capacity_reservations__1__end="2027-01-25T11:30:00Z"))
    assert capacity_end(settings).end == datetime(2027, 1, 18, 11, 30, tzinfo=timezone.utc)


def test_a_lead_shorter_than_killwait_fails_synth_naming_the_field_and_the_fix(tmp_path, write_env):
    config_dir = with_end(tmp_path, write_env, gpu_queue__capacity_end_lead_min=5)
    with pytest.raises(SettingsError) as raised:
        settings_for("prod", config_dir)  # what `cdk synth -c env=prod` runs first
    message = str(raised.value)
    need = kill_wait_seconds(load_settings("prod", config_dir)) + TIME_LIMIT_CHECK_S
    assert "gpu_queue.capacity_end_lead_min 5 is too short" in message
    assert f"set capacity_end_lead_min: {-(-need // 60)} or more" in message
    assert "2027-01-18T11:00Z" in message  # when AWS terminates the instances


def test_saves_too_slow_for_the_usr1_lead_fail_synth_naming_the_storage(tmp_path, write_env):
    # The slowest tier (125 MB/s/TiB, 879 MB/s): one round of the seven models' saves (1.75 TB) takes
    # 33 minutes; a Capacity Block lead long enough for that, so that only the time limits' lead fails.
    slow = {"storage__checkpoints__throughput_per_tib": 125, "gpu_queue__capacity_end_lead_min": 120}
    config_dir = write_env(tmp_path, "prod", **slow)
    with pytest.raises(SettingsError) as raised:
        settings_for("prod", config_dir)  # what `cdk synth -c env=prod` runs first
    message = str(raised.value)
    assert "storage.checkpoints is too slow for the models' saves: all 7 saving at once" in message
    assert "raise storage.checkpoints.throughput_per_tib or storage_capacity_gib" in message


def test_each_model_script_asks_for_its_shortest_useful_run():
    settings = load_settings("prod")
    files = job_files(settings)
    saves = save_seconds(settings)
    for model in settings.models:
        script = files[f"train_{model.name}.sh"]
        assert f"#SBATCH --time-min={time_min_s(saves[model.name], 660) // 60}\n" in script
        assert "#SBATCH --signal=USR1@660\n" in script  # two rounds of every model's save and a step
    assert time_min_s(saves["model7"], 660) == 1260  # the USR1 lead + 10 minutes: 3 saves of 118 s are less
    assert time_min_s(400, 600) == 600 + 1200  # slower saves: three of them


def test_the_head_nodes_update_action_carries_the_ends_digest(tmp_path, write_env):
    settings = load_settings("prod", with_end(tmp_path, write_env))
    config = render_cluster_config(settings, ClusterResources.placeholders(settings))
    actions = config["HeadNode"]["CustomActions"]
    updated, configured = actions["OnNodeUpdated"]["Args"], actions["OnNodeConfigured"]["Args"]
    assert updated[updated.index("--capacity-end-sha256") + 1] == capacity_end_digest(settings)
    assert capacity_end_digest(settings) == hashlib.sha256(capacity_end_file(settings).encode()).hexdigest()
    assert "--capacity-end-sha256" not in configured  # OnNodeConfigured may never change on a running cluster
    moved = load_settings("prod", with_end(tmp_path / "later", write_env,
                                           gpu_queue__capacity_reservations__0__end="2027-01-19T11:30:00Z",
                                           gpu_queue__capacity_reservations__1__end="2027-01-19T11:30:00Z"))
    assert capacity_end_digest(moved) != capacity_end_digest(settings)


def test_the_cluster_stack_ships_the_end_beside_the_model_list(prod_synth):
    from tests.cluster_config.test_cluster_stack import deployments

    config = deployments(prod_synth)["cluster/"]
    shipped = set()
    for key in config["SourceObjectKeys"]:
        staged = prod_synth.outdir / f"asset.{key.removesuffix('.zip')}"
        if staged.is_dir():
            shipped |= {p.name: p.read_text() for p in staged.iterdir()}.items()
    assert ("llm-prod.capacity_end", capacity_end_file(prod_synth.settings)) in shipped
    from cluster_config.quotas import quotas_file  # and each model's project quota (node_scripts/fsx_quotas.sh)
    assert ("llm-prod.quotas", quotas_file(prod_synth.settings)) in shipped
