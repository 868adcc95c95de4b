# Two entry points for a fresh machine: `make demo` (the main job) and `make test` (the suite).
VENV   ?= .venv
PY     := $(VENV)/bin/python
EXTRAS ?= test
OUT    ?= out

.PHONY: setup demo test lint format schema clean

# pip shows its progress on a terminal and is quiet in logs (CI), where the commands are enough.
PIP := $(PY) -m pip $(if $(shell [ -t 2 ] && echo tty),,-q)

# torch (the converter, the tests' references) comes first, on its own: the CPU-only build
# from PyTorch's CPU index unless the machine has an NVIDIA GPU (then PyPI's CUDA build, for
# `ninfer-convert --device cuda`); PyPI's torch for Linux is the CUDA build plus ~18 nvidia
# wheels. `make setup TORCH=cpu` or `TORCH=cuda` chooses by hand. Only torch is looked up on
# the CPU index, with one retry and a 20 s timeout, so a machine that cannot reach it but has
# the wheel from another source does not wait on it; its dependencies come with ninfer below.
TORCH_VERSION := 2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH ?= $(if $(shell command -v nvidia-smi 2>/dev/null),cuda,cpu)
# (PyPI's macOS wheels are CPU-only; the CPU index names them without +cpu)
ifeq ($(TORCH)-$(shell uname -s),cpu-Darwin)
TORCH_INSTALL := torch==$(TORCH_VERSION)
else ifeq ($(TORCH),cpu)
TORCH_INSTALL := --retries 1 --timeout 20 --extra-index-url $(TORCH_CPU_INDEX) torch==$(TORCH_VERSION)+cpu
else
TORCH_INSTALL := torch==$(TORCH_VERSION)
endif

setup: $(VENV)/.installed-$(EXTRAS)

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	@echo "setup: torch $(TORCH_VERSION) ($(TORCH) build), then ninfer[$(EXTRAS)]"
	$(PIP) install --no-deps $(TORCH_INSTALL)
	$(PIP) install -e '.[$(EXTRAS)]'
	touch $@

MODEL  ?= models/tiny-qwen3_5
RECIPE ?= tiny_mixed
PROMPT ?= What is the capital of France?

# The whole pipeline on the bundled model: convert (every CORE format), inspect, generate.
demo: setup
	mkdir -p $(OUT)
	$(VENV)/bin/ninfer-convert --recipe $(RECIPE) --source $(MODEL) -o $(OUT)/tiny.ninfer --force
	$(VENV)/bin/ninfer-inspect $(OUT)/tiny.ninfer --verify --strict --no-objects
	$(VENV)/bin/ninfer $(OUT)/tiny.ninfer --prompt "$(PROMPT)" --greedy

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest -q -n auto

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

schema: setup
	$(PY) -m ninfer_format.json_schema

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .ruff_cache .hypothesis
