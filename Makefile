# Two entry points for a fresh machine: `make demo` (the main job) and `make test` (the suite).
VENV   ?= .venv
PY     := $(VENV)/bin/python
EXTRAS ?= test
OUT    ?= out

.PHONY: setup demo test lint format schema clean

setup: $(VENV)/.installed-$(EXTRAS)

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
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
