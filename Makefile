# make run   - start a local cluster (Procfile) with honcho
# make test  - run the whole test suite
# make bench - run the default benchmark
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast bench clean java-check

NODE_MODULES := $(VENV)/node/node_modules

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,spark,peer]'
	@# kafkajs (npm) is one of the Kafka clients the tests drive; skipped where node is missing
	@if command -v npm >/dev/null 2>&1; then npm install -s --no-audit --no-fund --prefix $(VENV)/node kafkajs@2.2.4 >/dev/null || echo "note: could not install kafkajs; its tests will skip"; fi
	@touch $(STAMP)

run: $(STAMP)
	@mkdir -p data
	$(BIN)/honcho start || [ $$? -eq 130 ]   # Ctrl-C (130) is how a local cluster ends

test: $(STAMP) java-check
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python -m pytest -q -n 2 --dist loadfile

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration and not spark"

bench: $(STAMP) java-check
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/bench run

java-check:
	@command -v java >/dev/null 2>&1 || { echo "Java 17+ is needed for Spark (tests and bench): install it, e.g. 'apt-get install openjdk-17-jre-headless', then run make again." >&2; exit 1; }

clean:
	rm -rf $(VENV) data results checkpoints .pytest_cache *.egg-info
