# statelog: `make demo` and `make test` are all a fresh clone needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo crash-demo failover-demo broker test lint typecheck unit stress bench bench-quick clean

# The C source too: an editable install builds the extension once, not on import.
$(STAMP): pyproject.toml statelog/format/_exact.c statelog/format/_msgcheck.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/reconciler_demo.py

crash-demo: $(STAMP)
	$(PY) examples/crash_demo.py

failover-demo: $(STAMP)
	$(PY) examples/failover_demo.py

# A local Kafka-protocol broker on 127.0.0.1:9092 for the Quix Streams and Faust examples.
broker: $(STAMP)
	$(PY) -m tests.broker --port 9092

test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(PY) -m ruff check statelog compactor tests benchmarks examples
	$(PY) -m ruff format --check statelog compactor
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(STAMP)
	$(PY) -m mypy --strict statelog compactor benchmarks

unit: $(STAMP)
	$(PY) -m pytest -q -n 2 tests

stress: $(STAMP)
	$(PY) -m pytest -q -m stress tests

# The suites write pytest-benchmark's JSON; one renderer turns it into docs/benchmarks.md.
BENCH_PYTEST = $(PY) -m pytest benchmarks/ -p no:cacheprovider -o addopts= -q

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[anchors]'  # Litestream and SlateDB, measured beside statelog
	$(BENCH_PYTEST) --bench-size full --benchmark-json=.benchmarks/full.json
	$(PY) -m benchmarks.render .benchmarks/full.json --out docs/benchmarks.md

bench-quick: $(STAMP)
	$(PY) -m pip install -q -e '.[anchors]'
	$(BENCH_PYTEST) --bench-size quick --benchmark-json=.benchmarks/quick.json
	$(PY) -m benchmarks.render .benchmarks/quick.json --out docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .benchmarks build
	find statelog -name "*.so" -delete
