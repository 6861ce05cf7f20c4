# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv on first use; later runs reuse it.
VENV ?= .venv
PYTHON ?= python3

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $@

.PHONY: demo test lint browser
demo: $(VENV)/.installed
	$(VENV)/bin/dagprof demo

# Lint first (seconds), then the tests; the report's browser test needs Chromium.
# Two workers (CI's 2 cores), each taking a whole test file at a time, so a file's module fixtures (real recorded jobs)
# run once. A native crash that kills a worker fails the test it ran ("worker 'gw0' crashed while running ...") and xdist
# starts another worker for the rest.
test: lint browser
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

# Debian's Chromium for tests/test_report_browser.py: installed when missing and we are root with
# apt-get (as on CI); otherwise that one test skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium (Debian) for the report's browser test"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "could not install chromium: the report's browser test will skip"; \
	  else echo "no chromium and not root: the report's browser test will skip"; fi; }
