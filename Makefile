# make run   - start a local cluster (Procfile) with honcho
# make test  - run the whole test suite
# make bench - run the default benchmark
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast bench clean java-check

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,spark,peer]'
	@touch $(STAMP)

run: $(STAMP)
	@mkdir -p data
	$(BIN)/honcho start || [ $$? -eq 130 ]   # Ctrl-C (130) is how a local cluster ends

test: $(STAMP) java-check
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration and not spark"

bench: $(STAMP) java-check
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/bench run

java-check:
	@command -v java >/dev/null 2>&1 || { echo "Java 17+ is needed for Spark (tests and bench): install it, e.g. 'apt-get install openjdk-17-jre-headless', then run make again." >&2; exit 1; }

clean:
	rm -rf $(VENV) data results checkpoints .pytest_cache *.egg-info
