# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-fast lint bench clean venv fuzz

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" ./examples/demo.sh

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy --strict --follow-imports=silent controller/scheduler/
	# Three workers (pytest-xdist): each test is independent (its own state directory,
	# daemon port). The Slurm tests share one worker (one cluster at a time:
	# tests/conftest.py pytest_collection_modifyitems), mostly waiting on Slurm and VM
	# boots: with two workers a third of a 2-CPU host's time went idle (15 min 20 s),
	# with three 13 min. The 25 slowest are listed at the end: the suite is to stay well
	# under 15 minutes.
	$(BIN)/python -m pytest -q -n 3 --dist loadgroup --durations=25

# Unit and policy tests: no daemon, no Slurm, no processes (tests/conftest.py enforces it).
test-fast: $(STAMP)
	SPOTBAG_FAST_TIER=1 $(BIN)/python -m pytest -q -n 2 -m "not integration and not slurm and not processes and not clouds and not slow" \
		--cov=controller/api --cov-report=term:skip-covered --cov-fail-under=85 \
		tests/policies tests/controller tests/drivers tests/slurm_hooks tests/deploy tests/test_architecture.py

# A long schemathesis run against a live daemon's /openapi.json (make test runs a short one).
FUZZ_EXAMPLES ?= 500
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz_api --max-examples $(FUZZ_EXAMPLES)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy --strict --follow-imports=silent controller/scheduler/

# Every benchmark to the end, each figure printed beside its target (bench/targets.py).
# From a fresh clone: 22:44 on the 2-CPU development machine while other test suites ran
# (1:46 of it the virtualenv). The long ones: slurm_dispatch.py ~7 min and vm_notices.py
# ~3 min (they need root, Slurm and munge, as the Slurm tests do; without them they say
# "skipped"), simulate_fleet.py
# ~3 min, big_bag.py ~2.5 min, local_dispatch.py ~1.5 min, demo_under_load.py ~12 min (ten
# busy loops slow everything else meanwhile); web_ui.py needs chromium and chromium-driver.
bench: $(STAMP)
	$(BIN)/python bench/accept_bag.py
	$(BIN)/python bench/simulate_fleet.py
	$(BIN)/python bench/cli_tools.py
	$(BIN)/python bench/preemption_models.py
	$(BIN)/python bench/checkpoint_schedules.py
	$(BIN)/python bench/notices.py
	$(BIN)/python bench/notify_budgets.py
	$(BIN)/python bench/prepaid.py
	$(BIN)/python bench/report.py
	$(BIN)/python bench/cloud_drivers.py
	$(BIN)/python bench/hopping.py
	$(BIN)/python bench/deadlines.py
	$(BIN)/python bench/deadlines_simulate.py
	$(BIN)/python bench/deadline_pass.py
	$(BIN)/python bench/deadline_inputs.py
	$(BIN)/python bench/slurm_dispatch.py
	$(BIN)/python bench/vm_notices.py
	$(BIN)/python bench/local_dispatch.py
	$(BIN)/python bench/restart.py
	$(BIN)/python bench/big_bag.py
	$(BIN)/python bench/big_bag.py --hold
	$(BIN)/python bench/web_ui.py
	$(BIN)/python bench/daemon_start.py
	$(BIN)/python bench/cli_speed.py
	$(BIN)/python bench/demo_under_load.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
