# Entry points. `make demo` and `make test` are the README quick start; both install what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV   := .venv
PY     := $(VENV)/bin/python
ENV    ?= dev

.PHONY: help deps demo test synth validate plan lint bench cluster-up cluster-down cluster-status clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

# --- installation (idempotent: each step reruns only when its inputs change) -------------------
$(VENV)/.installed: requirements.txt requirements-jobs.txt requirements-dev.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt -r requirements-jobs.txt -r requirements-dev.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

.build/pcluster/.installed: $(VENV)/.installed scripts/install_pcluster_schema.sh
	scripts/install_pcluster_schema.sh

.build/debian.installed: scripts/install_system_packages.sh
	scripts/install_system_packages.sh
	mkdir -p .build && touch $@

deps: $(VENV)/.installed node_modules/.installed .build/pcluster/.installed .build/debian.installed  ## install everything (venv, CDK CLI, schema, Debian packages)

# --- the CDK app -------------------------------------------------------------------------------
synth: deps  ## synthesize every environment offline and lint the templates
	source $(VENV)/bin/activate && scripts/synth_all.sh

validate: deps  ## render every environment's ParallelCluster config and check it against ParallelCluster's schema
	$(PY) -m cluster_config validate --all

plan: deps  ## print the multi-model plan of ENV (default dev): nodes, GPUs, cost, storage throughput
	$(PY) -m cluster_config plan --env $(ENV)

lint: deps  ## shellcheck every shell script
	$(VENV)/bin/shellcheck -S warning $$(git ls-files '*.sh')

# --- the local Slurm cluster -------------------------------------------------------------------
cluster-up: deps  ## start the local two-node Slurm cluster (root)
	local_cluster/cluster.sh up

cluster-down:  ## stop it and remove everything it made
	local_cluster/cluster.sh down

cluster-status:  ## show whether it is up
	local_cluster/cluster.sh status

# --- quick start -------------------------------------------------------------------------------
demo: deps  ## synth + validate every environment, then run the job payloads on the local cluster
	scripts/demo.sh

test: deps  ## run every test
	$(PY) -m pytest

bench: deps  ## run every benchmark; figures in benchmarks/results/*.json
	$(PY) -m benchmarks.data_pipeline
	local_cluster/cluster.sh up  # the training benchmark's data-wait figure comes from a two-node run
	$(PY) -m benchmarks.training
	$(PY) -m benchmarks.recovery  # per fault: seconds to the next step, steps repeated, human needed

clean:  ## remove build outputs (keeps the venv)
	rm -rf cdk.out benchmarks/results
