# pagesift — every command a developer or CI needs. Only python3 and make are assumed;
# the virtualenv and the buf CLI are built from the project's own files.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PROTOS  := $(wildcard proto/pagesift/v1/*.proto)
GEN_DIR := shared/pagesift/v1
BUF     := .tools/node_modules/.bin/buf
CODE    := shared primary standby tests bench

.PHONY: run test test-fast pytest-fast bench proto check-proto lint typecheck buf-lint pytest system-deps clean

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

# Tests that start no system process and no browser run on every core (pytest-xdist, one
# worker per core); the system and browser tests, whose kills, failovers and renders are
# timed, then run one at a time.
PYTEST := $(BIN)/pytest -q -p no:cacheprovider
pytest: $(BIN)/.installed system-deps
	$(PYTEST) -n auto -m "not system and not browser"
	$(PYTEST) -m "system or browser"

## make test: lint, types, protos, then the whole test suite.
test: check-proto lint typecheck buf-lint pytest

## make test-fast: lint, types, and every test not marked `system` or `browser` (about two
## minutes): the edit-run loop. Leaves out what only a proto change, a system test or a
## real browser needs (check-proto, buf-lint: node and the buf CLI; system-deps: etcd,
## promtool, chromium-headless-shell).
test-fast: lint typecheck pytest-fast

pytest-fast: $(BIN)/.installed
	$(PYTEST) -n auto -m "not system and not browser"

## make bench: crawl throughput vs Scrapy, replication figures (see BENCHMARKS.md).
bench: $(BIN)/.installed
	$(BIN)/pip install -q -e '.[server,bench]' -c constraints.txt
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .tools .mypy_cache .ruff_cache .pytest_cache data
