"""The HTML report as a person sees it: rendered by a real Chromium, checked, and kept as a screenshot.

The page comes from the demo's pipeline on the small model (a real 2-rank gloo DDP run), so it has
every kind of section. The screenshot and the page are kept in ``.pytest_artifacts/report/`` at the
repository root (``$DAGPROF_ARTIFACTS`` overrides the folder) for a person to look at.
"""
import os
import pathlib
import re
import shutil

import pytest
from chromium import Browser, find

from dagprof.demo import DemoSettings, run_demo

ARTIFACTS = pathlib.Path(os.environ.get("DAGPROF_ARTIFACTS", pathlib.Path(__file__).resolve().parent.parent / ".pytest_artifacts"))
CHROMIUM = find()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: `make test` installs Debian's chromium when run as root, else this skips")
def test_report_renders_in_chromium(tmp_path):
    result = run_demo(DemoSettings(out_dir=str(tmp_path / "demo"), small=True, verify=False), say=lambda m: None)
    report = pathlib.Path(result["files"]["report"])
    sections = re.findall(r"<h2>(.*?)</h2>", report.read_text())
    assert {"What limits scaling", "What if", "Optimisation", "Files"} <= set(sections)
    assert any(s.startswith("Critical path") for s in sections) and any(s.startswith("Per-rank breakdown") for s in sections)

    out = ARTIFACTS / "report"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with Browser(CHROMIUM) as browser:
        page = browser.open(report.as_uri())
        shown = page.eval("""[...document.querySelectorAll('h2')].map(h => {
            const r = h.getBoundingClientRect(); return [h.textContent, r.width > 0 && r.height > 0 && getComputedStyle(h).visibility === 'visible']; })""")
        charts = page.eval("[...document.querySelectorAll('svg')].map(s => { const r = s.getBoundingClientRect(); return [r.width, r.height]; })")
        tables = page.eval("[...document.querySelectorAll('table')].map(t => t.rows.length)")
        overflow = page.eval("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        blank_cells = page.eval("[...document.querySelectorAll('td')].filter(td => /^(nan|None|undefined|NaN)$/.test(td.textContent.trim())).length")
        width, height = page.screenshot(str(out / "report.png"))
        problems = page.problems()
    shutil.copy(report, out / "report.html")

    assert problems == [], problems
    assert [s for s, _ in shown] == sections and all(ok for _, ok in shown), shown
    assert charts and all(w > 50 and h > 10 for w, h in charts), charts
    assert tables and all(n >= 2 for n in tables), tables  # a heading row and at least one row of data
    assert overflow <= 0, f"the page is {overflow}px wider than the window"
    assert blank_cells == 0
    assert width >= 800 and height > 1000 and (out / "report.png").stat().st_size > 20_000
