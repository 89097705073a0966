# The two commands of the README: `make demo` and `make test`. Each sets up what it needs
# on a fresh machine (a .venv with the project and its test extras).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test serve worker venv clean bench

$(STAMP): pyproject.toml clients/python/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	$(BIN)/python -m pip install --quiet -e clients/python  # the Python/Fido client (tests/client)
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/lstdp demo

# The suite runs in PYTEST_WORKERS processes (pytest-xdist; the tests of one file in one worker,
# each worker with a Redis server of its own: tests/conftest.py); PYTEST_WORKERS=0 runs it in one.
# Four on a 2-core machine: the suite waits on servers, subprocesses and browsers for much of
# its time (quiet, fresh clones, 2026-12-06: -n 3 14:33, -n 4 13:46; earlier -n 2 18:09).
# tests/conftest.py hands the files out longest first (the validation campaigns, then the slow
# and browser files; tests/client and tests/faults each whole to one worker);
# LSTDP_TEST_ORDER=xdist keeps pytest-xdist's own order, to compare.
PYTEST_WORKERS ?= 4
PYTEST_ARGS ?=
# With four workers on two cores, threads that wait by spinning burn the cores the other workers
# need: OpenBLAS's pool spins between calls and libgomp (Numba's `omp` threading layer) spins
# before it sleeps. One BLAS thread per process, and OpenMP threads that sleep when idle: three
# copies of tests/validation/test_blind_radiometry.py at once took 28.2 user-s each, 18.4 with
# both, 21.7 and 23.0 with either alone (2026-12-07). Numba still runs its threads (the threaded
# kernels' parity tests need them). A one-thread BLAS may round differently in the last bits.
# PYTHONDONTWRITEBYTECODE cleared (set empty): where the environment sets it, pytest keeps no
# cache of its rewritten test modules and each of the four workers rewrote all of them at
# collection (scripts/warm_kernels.py fills the cache first).
TEST_ENV := OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=

test: $(STAMP)
	bash scripts/ensure-services.sh
	$(TEST_ENV) $(BIN)/python scripts/warm_kernels.py
	$(TEST_ENV) $(BIN)/python -m pytest -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

serve: $(STAMP)
	$(BIN)/lstdp serve

worker: $(STAMP)
	$(BIN)/lstdp worker

bench: $(STAMP)
	$(BIN)/python benchmarks/calibrate.py

clean:
	rm -rf var build *.egg-info
