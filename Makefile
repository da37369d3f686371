# One word for each thing a newcomer needs. `make test` is what CI runs.
SHELL := /bin/bash
CARGO ?= cargo
export CARGO_TARGET_DIR ?= $(HOME)/.cache/taskmesh-target
PY_VENV ?= $(HOME)/.cache/taskmesh-py

.PHONY: run build test tools services fmt fmt-check lint unit faults proto-python buf examples-setup polyglot console bench openapi schemathesis fuzz fuzz-short help

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

run: tools ## Start the embedded demo: a node on SQLite plus a local worker (echo, sleep, fail)
	$(CARGO) run -p taskmesh-cli --bin taskmesh -- dev

build: tools ## Build the taskmesh binary (debug)
	$(CARGO) build -p taskmesh-cli --bin taskmesh

test: tools services fmt-check lint build proto-python buf unit polyglot console schemathesis fuzz-short ## Everything CI checks

tools: ## Install what the build and tests need beyond cargo if it is missing (protoc, iproute2, e2fsprogs, faketime, from Debian)
	bash scripts/ensure-tools.sh

services: ## Make sure the machine's Postgres, MariaDB and Redis answer (start them if not)
	bash scripts/ensure-services.sh

fmt: ## Format the code
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

lint: tools ## Clippy on every target, warnings are errors
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit: build ## The Rust tests: unit, property, conformance and end-to-end
	$(CARGO) test --workspace

faults: tools services ## Every fault scenario (partitions in network namespaces, skewed clocks, full and slow disks), one summary line each; needs root, ~5 min
	bash scripts/faults.sh

bench: ## Micro-benchmarks (divan: the balancer, a submit's request rules) and the skew scenario per strategy (release builds)
	$(CARGO) bench -p taskmesh-dispatcher --bench choose
	$(CARGO) bench -p taskmesh-dispatcher --bench rules
	$(CARGO) run --release -p taskmesh-cli --bin taskmesh -- bench --scenario skew --output table

schemathesis: build ## Fuzz a real `taskmesh serve` through its served OpenAPI document (no 5xx, responses conform)
	bash scripts/schemathesis.sh "$(CARGO_TARGET_DIR)/debug/taskmesh" "$(PY_VENV)"

fuzz: ## Coverage-guided fuzzing (cargo-fuzz): each target in fuzz/ for FUZZ_SECONDS (60)
	bash scripts/fuzz.sh $(or $(FUZZ_SECONDS),60)

fuzz-short: ## The fuzz targets for 10 s each (part of `make test`)
	bash scripts/fuzz.sh 10

openapi: ## Regenerate docs/openapi.json from proto/ (a test fails while it is stale)
	$(CARGO) run -q -p taskmesh-cli --bin taskmesh -- openapi > docs/openapi.json.tmp
	mv docs/openapi.json.tmp docs/openapi.json

proto-python: ## Generate Python stubs from proto/ with grpcio-tools (checks the contract compiles for other languages)
	bash scripts/proto-python.sh "$(PY_VENV)"

buf: ## Contract hygiene: buf lint, buf breaking against the previous commit, and the gate's self-checks
	bash scripts/buf-check.sh

examples-setup: ## Install the examples' Python (PyPI) and Node (npm) dependencies; generate the Python stubs
	bash scripts/examples-setup.sh

polyglot: build examples-setup ## End to end: the Python worker runs 100 tasks the Node client submits to `taskmesh serve`
	bash scripts/polyglot-e2e.sh

console: build ## The web console in Debian's Chromium (playwright-core, axe-core) against `taskmesh serve` and a worker; writes docs/console/*.png
	bash scripts/console-tests.sh "$(CARGO_TARGET_DIR)/debug/taskmesh"
