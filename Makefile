# Both entry points create and use .venv at the repo root.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo venv lint typecheck bench clean

venv: $(STAMP)

# torch/torchvision are pinned exactly (constraints.txt) so pip never pulls another build.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy bcl_stream lightning_module bcl_bench

# mypy runs inside the test runner, beside the test groups (tools/run_tests.py --mypy).
test: lint
	$(BIN)/python tools/run_tests.py --mypy

demo: venv
	$(BIN)/python tools/demo.py

bench: venv
	$(BIN)/python tools/bench_balance.py

clean:
	rm -rf $(VENV) build *.egg-info
