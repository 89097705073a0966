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

test: $(STAMP)
	bash scripts/ensure-services.sh
	$(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_ARGS)

serve: $(STAMP)
	$(BIN)/lstdp serve

worker: $(STAMP)
	$(BIN)/lstdp worker

bench: $(STAMP)
	$(BIN)/python benchmarks/calibrate.py

clean:
	rm -rf var build *.egg-info
