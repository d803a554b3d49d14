# Railyard: `make demo` runs the demo train, `make test` runs every test. Both set everything up.
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo deps pyc test test-fast test-e2e test-compat wheel faults model bench lint stop clean

# Bytecode is compiled once, at install: uv does not write it, and where PYTHONDONTWRITEBYTECODE is set no
# process ever would, so every process, every Airflow task among them, would compile every module it imports
# from source again (`import airflow.sdk`: 2.9 s instead of 1.2 s on 2 cores, 24 GiB).
$(STAMP): requirements.txt pyproject.toml
	@command -v uv >/dev/null 2>&1 || python3 -m pip install -q uv
	@test -x $(BIN)/python || uv venv -q -p 3.11 $(VENV)
	VIRTUAL_ENV=$(VENV) uv pip install -q --compile-bytecode -r requirements.txt
	VIRTUAL_ENV=$(VENV) uv pip install -q --no-deps -e .
	@touch $@

pyc: $(STAMP)  ## Railyard's own bytecode, brought up to date (only what changed is compiled again)
	@$(BIN)/python -m compileall -q -j 0 include plugins dags tests bench >/dev/null

deps:  ## the Debian packages the tests need: installed if missing (as root), else the command to run
	@bash scripts/setup-deps

demo: pyc  ## the demo train on the embedded simulator (RAILYARD_DEMO_ONCE=1: exit when done)
	$(BIN)/railyard demo

# Two pytest-xdist workers side by side, one lane each: every test with an Airflow stack of its own in one, the rest
# in the other (tests/conftest.py; timings in docs/DEVELOPMENT.md). `make test LANES=` runs one process.
LANES ?= -n 2 --dist loadscope

test: deps pyc lint  ## lint, then every tier, the slow end-to-end one included
	$(BIN)/pytest -q $(LANES)

test-fast: deps pyc lint  ## lint, then everything but the end-to-end tier
	$(BIN)/pytest -q $(LANES) -m "not e2e"

test-e2e: deps pyc
	$(BIN)/pytest -q $(LANES) -m e2e

faults: deps pyc  ## the fault suite at its full counts (20 trials, 10 + 10 kills, 30 s and 5 min outages), with a summary
	RAILYARD_FAULT_TRIALS=20 RAILYARD_FAULT_KILLS=10 RAILYARD_FAULT_SCHEDULER_KILLS=10 RAILYARD_FAULT_OUTAGES=30,300 \
	  $(BIN)/pytest -q -s -p no:warnings tests/e2e/test_faults.py 2>&1 | grep -v '^\s*\[\|^20[0-9][0-9]-'

# The Airflow versions the package declares (pyproject.toml: apache-airflow>=3.2.0,<3.4), lowest and highest:
# the wheel-install test on each, VERSION@DAY resolving the other packages from what was published by the day
# after its release (what that release's constraints file pins).
COMPAT_AIRFLOW ?= 3.2.0@2026-04-08 3.3.2@2026-09-18
test-compat: deps pyc  ## the wheel, installed as a user does, on the lowest and the highest Airflow supported
	@for v in $(COMPAT_AIRFLOW); do echo "== Airflow $$v"; \
	  RAILYARD_AIRFLOW_VERSION=$$v $(BIN)/pytest -q -p no:cacheprovider tests/e2e/test_wheel_install.py || exit 1; \
	done

wheel: $(STAMP)  ## dist/railyard-<version>-py3-none-any.whl: the core, the Airflow side and the page, one wheel
	uv build --quiet --wheel --out-dir dist

EXAMPLES ?= 20000
ifndef SEED
SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
model: pyc  ## a long random search of the state machine (tests/model): EXAMPLES=N schedules of up to 30 steps; SEED=N replays one
	@echo "model search: seed $(SEED) (the same search again: make model SEED=$(SEED) EXAMPLES=$(EXAMPLES))"
	RAILYARD_MODEL_RANDOM=1 RAILYARD_MODEL_EXAMPLES=$(EXAMPLES) RAILYARD_MODEL_STEPS=30 \
	  $(BIN)/pytest -q -p no:cacheprovider --timeout=0 --hypothesis-show-statistics --hypothesis-seed=$(SEED) \
	  tests/model/test_model.py::TestRailyard

bench: deps pyc  ## figures, side by side with their baselines
	$(BIN)/python bench/run.py

lint: $(STAMP)  ## ruff everywhere, mypy --strict on the core and the Airflow plugin (settings in pyproject.toml)
	$(BIN)/ruff check include plugins dags tests bench
	$(BIN)/mypy

stop:  ## stop every `make demo` on the host and all it started (found by a marker, whatever its home)
	@if [ -x $(BIN)/railyard ]; then $(BIN)/railyard demo --stop; else echo "nothing to stop"; fi

clean: stop
	rm -rf .railyard
