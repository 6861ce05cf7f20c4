# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv on first use; later runs reuse it.
VENV ?= .venv
PYTHON ?= python3

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $@

.PHONY: demo test
demo: $(VENV)/.installed
	$(VENV)/bin/dagprof demo

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q
