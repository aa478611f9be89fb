# Two commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# s3rver, the second S3 implementation the tests run against (beside moto), from the npm registry
S3RVER_DIR   := tests/s3rver
S3RVER_STAMP := $(S3RVER_DIR)/node_modules/.installed
# Python caches compiled modules (__pycache__/, ignored by git) even where the shell says not to: the tests start
# hundreds of Python processes, which would otherwise compile the same modules again each time.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup run test test-all test-model-long reliability soak soak-hour lint typecheck bench check-prereqs check-prereqs-run clean

# What running needs (Python with venv, Java); check-prereqs adds Node.js, which only the tests need.
check-prereqs-run:
	@scripts/check-prereqs.sh --for run "$(PYTHON)"

check-prereqs:
	@scripts/check-prereqs.sh --for test "$(PYTHON)"

# pip's own progress is shown (a first install downloads Spark and Dagster: a minute or more).
$(STAMP): pyproject.toml | check-prereqs-run
	@echo "==> creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> upgrading pip"
	$(PY) -m pip install --progress-bar on --upgrade pip
	@echo "==> installing statekeeper with its dev tools into $(VENV) (pyspark, dagster, ...: a minute or more)"
	$(PY) -m pip install --progress-bar on -e '.[dev]'
	@touch $(STAMP)

$(S3RVER_STAMP): $(S3RVER_DIR)/package.json $(S3RVER_DIR)/package-lock.json | check-prereqs
	cd $(S3RVER_DIR) && npm ci --no-audit --no-fund --loglevel=error
	@touch $(S3RVER_STAMP)

# The classes a Spark job loads, archived once for the test JVMs to map instead of load (testkit/jvm_classes.py).
JVM_CLASSES := $(VENV)/spark-classes.jsa
$(JVM_CLASSES): $(STAMP) examples/session_count.py
	@echo "==> archiving the classes a Spark job loads, for the test JVMs (a minute)"
	$(PY) -m testkit.jvm_classes $@

setup: $(STAMP) $(S3RVER_STAMP) $(JVM_CLASSES)

# The main job (a Spark streaming query on the store, JOB_SECONDS long) with the Dagster webserver and
# daemon maintaining its checkpoint beside it on 127.0.0.1. Ctrl-C stops everything; RUN_SECONDS=N
# stops everything by itself after N seconds. Run it again to resume from run/sessions.
JOB_SECONDS ?= 60
run: check-prereqs-run $(STAMP)
	STATEKEEPER_CHECKPOINT_ROOTS=$(CURDIR)/run/sessions/state $(PY) -m statekeeper.orchestration.run_local -- \
		env RUN_SECONDS=$(JOB_SECONDS) WORK_DIR=$(CURDIR)/run/sessions $(PY) examples/session_count.py

# The default suite on both cores: TEST_WORKERS pytest-xdist workers (more than the cores: the tests wait on
# servers, Spark, subprocesses and timers often enough; 4 kept both cores busy to the end, 3 left them 5% idle),
# a test file to a worker at a time (a file's module fixtures start once); each worker starts its own session
# servers (Spark, S3, PostgreSQL) on free ports. The few files of one long test go out first
# (tests/conftest.py HANDED_OUT_FIRST), then xdist's order (most tests first); tests/spark/ goes to two of the
# workers while other files are left (SPARK_WORKERS: a Spark session per worker). mypy (a minute from a clean
# clone) checks beside the tests; either failing fails the target.
TEST_WORKERS ?= 4
test: $(STAMP) $(S3RVER_STAMP) $(JVM_CLASSES)
	$(VENV)/bin/ruff check .
	@$(VENV)/bin/mypy > .mypy.out 2>&1 & mypy=$$!; \
	$(PY) -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile; tests=$$?; \
	wait $$mypy; typed=$$?; echo "mypy:"; cat .mypy.out; rm -f .mypy.out; \
	test $$typed -eq 0 && exit $$tests || exit $$typed

test-all: $(STAMP) $(S3RVER_STAMP) $(JVM_CLASSES)
	$(PY) -m pytest

# The hypothesis state machines at 10x their default examples (>= 100,000 steps, counted at the end).
test-model-long: $(STAMP)
	STATEKEEPER_MODEL_SCALE=10 $(PY) -m pytest -m "not slow" --timeout=6000 tests/store/test_file_manager_model.py \
		tests/store/test_model.py tests/store/test_typed_model.py tests/maintenance/test_properties.py

# docs/reliability.md: the whole crash-point sweep (local and S3), model steps at 10x, reader fuzz.
reliability: $(STAMP) $(S3RVER_STAMP)
	$(PY) -m bench reliability

# The 10-minute soak and every catalog fault case (both also run in test-all).
soak: $(STAMP) $(S3RVER_STAMP) $(JVM_CLASSES)
	$(PY) -m pytest -m slow tests/reliability/test_soak.py tests/reliability/test_catalog_faults.py

# Memory that levels off (docs/reliability.md): the maintain loop, a writer and the Dagster runs, each in its own
# process over a fleet of S3 roots, for SOAK_MINUTES; RSS series in bench/results/memory_soak/, the plot in docs/.
SOAK_MINUTES ?= 60
soak-hour: $(STAMP)
	$(PY) -m tests.reliability.memory_soak --minutes $(SOAK_MINUTES) --out bench/results/memory_soak \
		--png docs/memory_soak.png --doc docs/reliability.md

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info $(S3RVER_DIR)/node_modules
