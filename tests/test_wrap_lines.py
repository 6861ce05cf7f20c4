"""Human output folds its long lines at the terminal's width (``cli.terminal.wrap_lines``): ``analyze``, ``whatif`` and
``optimize`` printed findings and notes up to 330 characters on one line. ``--json`` is never folded."""
from __future__ import annotations

import re

from testdata import DATA

from dagprof.cli.main import main
from dagprof.cli.terminal import wrap_lines

RUN = DATA / "ddp-testbed" / "run"


def _fits(text: str, width: int) -> bool:
    return all(len(ln) <= width or " " not in ln.strip() for ln in text.splitlines())


def test_a_long_line_folds_with_a_hanging_indent_and_keeps_its_words(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    line = "  - " + " ".join(f"word{i} +0.{i} % in 1{i} ms" for i in range(20))
    out = wrap_lines(["short", line])
    rows = out.splitlines()
    assert rows[0] == "short" and len(rows) > 3 and _fits(out, 60)
    assert all(r.startswith(" " * 6) and not r.startswith(" " * 7) for r in rows[2:])
    assert " ".join(" ".join(rows[1:]).split()) == " ".join(line.split())
    assert all(f"+0.{i} %" in out and f"1{i} ms" in out for i in range(20))  # a figure stays beside its unit


def _out(capsys, monkeypatch, columns: int, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(list(argv)) == 0
    return re.sub(r"\(\d+\.\d+ s\)", "(seconds)", capsys.readouterr().out)  # the command's own time varies


def test_analyze_and_whatif_text_fit_the_terminal_and_json_does_not_change(monkeypatch, capsys) -> None:
    for argv in (["analyze", str(RUN)], ["whatif", str(RUN), "--bandwidth", "1Gbit", "--no-trace"]):
        wide, narrow = _out(capsys, monkeypatch, 400, *argv), _out(capsys, monkeypatch, 72, *argv)
        assert max(map(len, wide.splitlines())) > 72 and _fits(narrow, 72)
        assert " ".join(wide.split()) == " ".join(narrow.split())  # the same words, folded
        as_json = [argv[0], "--json", *argv[1:]]
        assert _timeless(_out(capsys, monkeypatch, 72, *as_json)) == _timeless(_out(capsys, monkeypatch, 400, *as_json))


def _timeless(out: str) -> str:
    """A command's ``--json`` with the seconds it (and each what-if row) took left out."""
    return re.sub(r'"seconds": [0-9.e-]+', '"seconds": 0', out)
