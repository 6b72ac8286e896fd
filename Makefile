# Entry points. `make demo` and `make test` are the README quick start; both install everything they
# need. synth, plan, validate and lint need only the CDK app's packages and CLI: no root, no PyTorch.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --disable-pip-version-check
ENV    ?= dev

.PHONY: help deps deps-cdk deps-pcluster workstation demo test test-drills test-fast synth validate deploy destroy plan lint bench gpu-check cluster-up cluster-down cluster-status clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

# --- installation, by need (idempotent: each step reruns only when its inputs change) ----------
# Each step prints what it installs and how long it took (scripts/timed.sh).
$(VENV)/.cdk-installed: requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	scripts/timed.sh "pip: the CDK app and its checks (requirements.txt)" $(PIP) -r requirements.txt
	touch $@

$(VENV)/.installed: $(VENV)/.cdk-installed requirements-jobs.txt requirements-dev.txt
	scripts/timed.sh "pip: the job payloads (PyTorch, transformers, ...) and the test tools" \
	  $(PIP) -r requirements.txt -r requirements-jobs.txt -r requirements-dev.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	scripts/timed.sh "npm: the pinned CDK CLI (package-lock.json)" npm ci --no-audit --no-fund
	touch $@

.build/pcluster/.installed: $(VENV)/.cdk-installed scripts/install_pcluster_schema.sh
	scripts/timed.sh "pip: ParallelCluster's config schema, into .build/pcluster" scripts/install_pcluster_schema.sh

# torchao for float8 training, apart from the venv: transformers imports it at every start when installed.
.build/float8/.installed: $(VENV)/.installed requirements-float8.txt
	scripts/timed.sh "pip: torchao for float8 (requirements-float8.txt), into .build/float8" \
	  $(PIP) --no-deps --upgrade --target .build/float8 -r requirements-float8.txt
	touch $@

# Tools that pin what the CDK app's venv must not have, each in a venv of its own (fully pinned).
.venv-pcluster/.installed: requirements-pcluster.txt scripts/install_tool_venv.sh
	scripts/timed.sh "pip: ParallelCluster 3.16.1 for its validators, into .venv-pcluster" scripts/install_tool_venv.sh .venv-pcluster requirements-pcluster.txt
	touch $@

.venv-checkov/.installed: requirements-checkov.txt scripts/install_tool_venv.sh
	scripts/timed.sh "pip: checkov, into .venv-checkov" scripts/install_tool_venv.sh .venv-checkov requirements-checkov.txt
	touch $@

.build/debian.installed: scripts/install_system_packages.sh
	scripts/timed.sh "apt: Slurm, munge, fio for the local cluster and the jobs (root)" scripts/install_system_packages.sh
	mkdir -p .build && touch $@

# The jobs' image for the local cluster's container path (docs/containers.md): Debian and PyPI packages only, a few
# minutes once; the script keeps it while its inputs (itself, requirements-jobs.txt) are unchanged.
.build/container/llm-jobs.sqsh: jobs/container/build_local_image.sh requirements-jobs.txt $(VENV)/.installed .build/debian.installed
	scripts/timed.sh "image: the jobs' Python and requirements as an Enroot squash file (root)" jobs/container/build_local_image.sh $@

deps-cdk: $(VENV)/.cdk-installed node_modules/.installed .build/pcluster/.installed  ## install what synth/plan/lint need (no root)
deps-pcluster: .venv-pcluster/.installed  ## install ParallelCluster 3.16.1's CLI, pcluster, into .venv-pcluster (no root; docs/deploy.md#the-workstation)
workstation: .venv-pcluster/.installed  ## check the runbook's workstation tools (AWS CLI v2, Session Manager plugin, pcluster, node); prints how to get each missing one
	scripts/workstation.sh
deps: deps-cdk $(VENV)/.installed .build/float8/.installed .venv-pcluster/.installed .venv-checkov/.installed .build/debian.installed .build/container/llm-jobs.sqsh  ## install everything (adds PyTorch & co., test tools, ParallelCluster and checkov venvs, Debian packages, the jobs' image)

# --- the CDK app -------------------------------------------------------------------------------
synth: $(VENV)/.cdk-installed node_modules/.installed  ## synthesize every environment offline and lint the templates
	source $(VENV)/bin/activate && scripts/synth_all.sh

validate: deps-cdk .venv-pcluster/.installed .venv-checkov/.installed  ## every environment: ParallelCluster's schema, then deployed into an emulated account: its validators, update checks, checkov
	$(PY) -m cluster_config validate --all

deploy: $(VENV)/.cdk-installed node_modules/.installed  ## cdk deploy ENV's stacks, once deploy-check finds the credentials' account and no example values
	$(PY) -m cluster_config deploy-check --env $(ENV)
	npx cdk deploy -c env=$(ENV) --all

destroy: $(VENV)/.cdk-installed node_modules/.installed  ## cdk destroy ENV's stacks, once teardown-check finds no cluster and no protected database
	$(PY) -m cluster_config teardown-check --env $(ENV)
	npx cdk destroy -c env=$(ENV) --all

plan: $(VENV)/.cdk-installed  ## print the multi-model plan of ENV (default dev): tokens, days, cost, GPU memory, checkpoints
	$(PY) -m cluster_config plan --env $(ENV)

lint: $(VENV)/.cdk-installed  ## shellcheck every shell script
	$(VENV)/bin/shellcheck -S warning $$(git ls-files '*.sh')

# --- the local Slurm cluster -------------------------------------------------------------------
cluster-up: deps  ## start the local three-node Slurm cluster (with slurmdbd) (root)
	local_cluster/cluster.sh up

cluster-down:  ## stop it and remove everything it made
	local_cluster/cluster.sh down

cluster-status:  ## show whether it is up
	local_cluster/cluster.sh status

# --- quick start -------------------------------------------------------------------------------
demo: deps  ## synth + validate every environment, then run the job payloads on the local cluster
	scripts/demo.sh

test: deps  ## run every test but the drills, in under 25 minutes on 2 cores (the local-cluster tests beside the others: scripts/test_all.sh)
	PY=$(PY) scripts/test_all.sh

test-drills: deps  ## the long fault drills and whole-cluster rehearsals (tests marked drill; CI runs them after make test)
	TEST_TIER=drills PY=$(PY) scripts/test_all.sh

# No root: none of the Debian packages, the local cluster, the emulated account or ParallelCluster's venv.
test-fast: $(VENV)/.installed .build/float8/.installed node_modules/.installed .build/pcluster/.installed  ## the inner loop: every test not marked slurm, slow, root or drill (docs/testing.md)
	$(PY) -m pytest -m "not slurm and not slow and not root and not drill"

bench: deps  ## run every benchmark; figures in benchmarks/results/*.json
	$(PY) -m benchmarks.data_pipeline
	$(PY) -m benchmarks.communication  # collectives of each prod layout's step vs the analytic minimum (fake process group)
	$(PY) -m benchmarks.replica_check  # the replica sentinel's cost per prod model vs a plain read of the same bytes
	$(PY) -m benchmarks.replica_check.checks  # the at-rest digest's and the replay's share of a step (target < 1 % each)
	$(PY) -m benchmarks.snapshot  # a snapshot in memory: what it blocks, its writer, per prod model against its interval
	$(PY) -m benchmarks.hf_import  # bytes each rank reads of a released checkpoint (model.init_from), prod's import times
	$(PY) -m benchmarks.straggler_probe  # the straggler probe's noise: what its margin and window are chosen from
	$(PY) -m benchmarks.straggler_study  # the straggler rule at model7's size on that noise: detection, causes, false evictions (seconds)
	$(PY) -m benchmarks.export  # the Hugging Face export's peak memory vs its largest tensor; 70B's extrapolated
	local_cluster/cluster.sh up  # the training benchmark's data-wait figure comes from a two-node run
	$(PY) -m benchmarks.training
	$(PY) -m benchmarks.recovery  # per fault: seconds to the next step, steps repeated, human needed
	$(PY) -m benchmarks.false_eviction  # the eviction drill's run 10 times with nothing slowed: straggler reports and evictions (target 0)
	$(PY) -m benchmarks.node_bootstrap  # the head node's OnNodeConfigured (real pip install) vs its bootstrap timeout
	$(PY) -m benchmarks.goodput_simulation  # prod on 80 local nodes of its own, 2 weeks of failures in 2 x 8 min, 0 and 2 spares vs the goodput model

gpu-check:  ## on a machine with one GPU: the GPU-only branches in ~8 min (docs/acceptance.md); report in benchmarks/results/
	$(PY) -m benchmarks.gpu_check

# Build outputs only: never a tracked file, an install (.venv*, node_modules/, .build/), benchmark results or
# the local cluster's state (make cluster-down removes that).
clean:  ## remove build outputs: cdk.out/, .pytest_cache/, __pycache__/ (keeps installs, benchmark results, the local cluster)
	rm -rf cdk.out .pytest_cache
	find . \( -name '.venv*' -o -name node_modules -o -name .build -o -name .local_cluster -o -name .git \) -prune \
	  -o -name __pycache__ -type d -prune -exec rm -rf {} +
