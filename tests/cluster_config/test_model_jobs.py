"""One description per model: the job script and training config each environment derives from its
``models:`` entry (cluster_config/model_jobs.py), what the stack ships, and bad entries refused at synth."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys

import pytest
import yaml

from cluster_config.hardware import gpu_of
from cluster_config.model_configs import training_config
from cluster_config.model_jobs import GENERATED, GENERATED_BY, job_files, write_job_files
from cluster_config.plan import check_plan
from cluster_config.settings import CONFIG_DIR, SettingsError, available_environments, load_settings, model_uid
from stacks.cluster_stack import GENERATED_EXCLUDES
from training.cluster import load_cluster
from training.config import load_config


def directives(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", text, flags=re.M))


@pytest.fixture(autouse=True)
def fsx_env(monkeypatch):
    monkeypatch.setenv("FSX_DATA", "/fsx/data")
    monkeypatch.setenv("FSX_CHECKPOINTS", "/fsx/checkpoints")
    monkeypatch.setenv("FSX_LOGS", "/fsx/logs")


@pytest.mark.parametrize("env", available_environments())
def test_each_model_gets_a_script_with_its_share_and_a_config_with_its_facts(env, tmp_path):
    settings = load_settings(env)
    written = write_job_files(settings, tmp_path)
    assert len(written) == 2 * len(settings.models) + 1  # and models/cluster.json
    for model in settings.models:
        d = directives((tmp_path / f"train_{model.name}.sh").read_text())
        assert d["job-name"] == d["account"] == d["qos"] == model.name  # its Slurm account and QOS
        assert d["nodes"] == str(model.nodes)
        assert d["gpus-per-node"] == str(settings.gpu_queue.gpus_per_instance)
        # Absolute: Slurm expands no variables in --output; the folder is the model's log folder.
        assert d["output"] == f"{settings.storage.logs.mount_dir}/{model.name}/%x_%j.out"
        assert d["error"] == f"{settings.storage.logs.mount_dir}/{model.name}/%x_%j.err"

        cfg = load_config(tmp_path / f"models/{model.name}.yaml")  # what the trainer reads
        assert (cfg.name, cfg.model.preset, cfg.data.seq_len) == (model.name, model.preset, model.seq_len)
        assert (cfg.train.steps, cfg.train.global_batch_size) == (model.steps, model.global_batch_size)
        assert cfg.data.path == f"/fsx/data/{model.dataset}"
        assert cfg.data.tokenizer == f"/fsx/data/{model.tokenizer}"
        assert cfg.grad_accum_steps(model.nodes * settings.gpu_queue.gpus_per_instance) >= 1


@pytest.mark.parametrize("env", available_environments())
def test_the_cluster_file_holds_what_the_bundles_commands_read_of_the_settings(env, tmp_path):
    settings = load_settings(env)
    write_job_files(settings, tmp_path)
    cluster = load_cluster(tmp_path, env)  # as training.dry_run and training.status read it
    queue, gpu = settings.gpu_queue, gpu_of(settings)
    assert (cluster.environment, cluster.cluster_name, cluster.instance_type) == (env, settings.cluster_name, queue.instance_type)
    assert (cluster.gpu, cluster.gpu_memory_gib) == (gpu.name, gpu.memory_gib)
    assert cluster.price_per_gpu_hour_usd * queue.gpus_per_instance == pytest.approx(queue.price_per_instance_hour_usd)
    assert cluster.deadline_days == settings.plan.deadline_days
    assert list(cluster.models) == [model.name for model in settings.models]
    for model in settings.models:
        job = cluster.models[model.name]
        assert (job.nodes, job.gpus_per_node) == (model.nodes, queue.gpus_per_instance)
        assert job.world_size == model.nodes * queue.gpus_per_instance
        assert job.config == tmp_path / f"models/{model.name}.yaml" and job.config.is_file()


def test_prod_and_dev_model1_differ_only_as_their_entries_say():
    prod, dev = (training_config(s, s.models[0]) for s in (load_settings("prod"), load_settings("dev")))
    assert prod["model"]["preset"] == "llama2-7b" and dev["model"]["preset"] == "tiny"
    assert prod["train"]["parallelism"] == "hsdp"  # from the recipe jobs/training/configs/llama2-7b.yaml
    assert dev["train"]["micro_batch_size"] == 4  # dev's overrides win over the tiny recipe's 16
    model7 = training_config(load_settings("prod"), load_settings("prod").models[6])
    assert model7["train"]["tensor_parallel"] == 8 and model7["checkpoint"]["keep"] == 2


def entry_with(tmp_path, write_env, **changes):
    models = yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())["models"]
    models[0].update(changes)
    return load_settings("prod", write_env(tmp_path, "prod", models=models))


def test_a_bad_override_fails_synth_naming_the_entry_and_the_key(tmp_path, write_env):
    settings = entry_with(tmp_path, write_env, overrides={"train.micro_batch": 4})
    with pytest.raises(SettingsError) as caught:
        check_plan(settings)  # what synth runs
    message = str(caught.value)
    assert message.startswith("cluster_config/prod.yaml models: model1: unknown config key 'train.micro_batch'")
    assert "allowed here:" in message and "micro_batch_size" in message


def test_an_unknown_recipe_names_the_ones_there_are(tmp_path, write_env):
    settings = entry_with(tmp_path, write_env, recipe="llama3-8b")
    with pytest.raises(SettingsError, match=r"models: model1: recipe 'llama3-8b' has no recipe "
                                            r"jobs/training/configs/llama3-8b.yaml; set recipe: to one of 18.4b, "
                                            r"llama2-13b, llama2-70b, llama2-7b, llama3.1-70b, llama3.1-8b, tiny"):
        job_files(settings)


@pytest.mark.parametrize("changes, message", [
    ({"dataset": "/fsx/data/x"}, "models.0.dataset: '/fsx/data/x' must be a folder under storage.data.mount_dir"),
    ({"dataset": "../x"}, "models.0.dataset: '../x' must be a folder under storage.data.mount_dir"),
    ({"name": "ops"}, "models.0.name: 'ops' is the Slurm account of the non-training jobs"),
    ({"name": "slurm"}, "models.0.name: 'slurm' is a user of the cluster's images, and a model's jobs run as a user "
                        "of the model's name; name the model otherwise"),
    ({"seq_len": 0}, "models.0.seq_len: Input should be greater than 0"),
    ({"steps": "DELETE"}, "models.0.steps: required; add it"),
])
def test_bad_model_entries_are_refused_when_settings_load(tmp_path, write_env, changes, message):
    models = yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())["models"]
    for key, value in changes.items():
        if value == "DELETE":
            del models[0][key]
        else:
            models[0][key] = value
    with pytest.raises(SettingsError, match=re.escape(message)):
        load_settings("prod", write_env(tmp_path, "prod", models=models))


def test_two_models_whose_users_would_share_a_uid_are_refused_naming_both(tmp_path, write_env):
    by_uid: dict[int, str] = {}
    first, second = next((by_uid[model_uid(n)], n) for n in (f"m{i}" for i in range(10**5))
                         if by_uid.setdefault(model_uid(n), n) != n)
    models = yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())["models"]
    models[0]["name"], models[1]["name"] = first, second
    with pytest.raises(SettingsError, match=re.escape(
            f"models: {first} and {second} would get the same user id {model_uid(first)} (derived from the name, so "
            "that every node makes the same users); rename one of them")):
        load_settings("prod", write_env(tmp_path, "prod", models=models))


def test_a_removed_model_loses_its_generated_files_and_nothing_else(tmp_path):
    write_job_files(load_settings("prod"), tmp_path)
    (tmp_path / "train_custom.sh").write_text("#!/bin/bash\n# written by hand\n")
    write_job_files(load_settings("dev"), tmp_path)
    assert sorted(p.name for p in tmp_path.glob("train_*.sh")) == ["train_custom.sh", "train_model1.sh", "train_model2.sh"]
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["cluster.json", "model1.yaml", "model2.yaml"]
    assert "cluster_config/dev.yaml" in (tmp_path / "train_model1.sh").read_text()
    assert load_cluster(tmp_path).environment == "dev"


def test_the_bundle_carries_this_environments_files_not_a_checkouts():
    # A checkout's jobs/ may hold the local cluster's (dev's) files: the stack leaves them out of the
    # bundle's asset and adds the environment's own (stacks/cluster_stack.py).
    for path in job_files(load_settings("prod")):
        assert any(fnmatch.fnmatch(path, pattern) for pattern in GENERATED_EXCLUDES), path
    assert GENERATED_EXCLUDES == list(GENERATED)  # what the asset leaves out is what write_job_files may replace
    for text in job_files(load_settings("prod")).values():
        assert f"{GENERATED_BY} from cluster_config/prod.yaml" in text


def test_cli_writes_the_files_and_the_model_list(tmp_path):
    result = subprocess.run([sys.executable, "-m", "cluster_config", "jobs", "--env", "dev", "--out", str(tmp_path),
                             "--model-list", str(tmp_path / "list")], capture_output=True, text=True, check=True)
    assert f"wrote {tmp_path}/train_model2.sh" in result.stdout
    roles = "arn:aws:iam::111111111111:role/llm-models/llm-dev/llm-dev-"  # each model's role (stacks/model_roles.py)
    assert (tmp_path / "list").read_text() == f"model1 2 {roles}model1\nmodel2 1 {roles}model2\n"
    assert (tmp_path / "train_model1.sh").stat().st_mode & 0o111


def test_hot_spares_join_the_models_allocation_and_its_share_but_do_not_train(tmp_path):
    """models.<m>.hot_spares: the job holds them (--nodes, the QOS share) and trains on the others (TRAIN_NODES)."""
    from cluster_config.render import models_file

    settings = load_settings("prod")
    spared = settings.model_copy(update={"models": [settings.models[0].model_copy(update={"hot_spares": 1}),
                                                    *settings.models[1:]]})
    model = spared.models[0]
    write_job_files(spared, tmp_path)
    script = (tmp_path / f"train_{model.name}.sh").read_text()
    assert directives(script)["nodes"] == str(model.nodes + 1)
    assert 'export HOT_SPARES="${HOT_SPARES:-1}"' in script  # jobs/train.sh trains on the others
    share = next(line.split() for line in models_file(spared).splitlines() if line.startswith(f"{model.name} "))
    assert share[1] == str(model.nodes + 1)  # node_scripts/slurm_accounts.sh: its QOS's GrpTRES node count
