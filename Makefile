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
# A native crash that kills pytest itself (a signal) is followed by the test that was running.
test: lint browser
	@rm -f .pytest-trail; DAGPROF_TEST_TRAIL=.pytest-trail $(VENV)/bin/python -m pytest -q; rc=$$?; \
	  if [ $$rc -gt 128 ]; then echo "pytest died of signal $$((rc - 128)) during $$(cat .pytest-trail 2>/dev/null)"; fi; \
	  rm -f .pytest-trail; exit $$rc

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
