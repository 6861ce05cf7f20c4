"""Paths of written files as the commands print them (``cli.common.shown``)."""
from __future__ import annotations

import os

from dagprof.cli.common import shown


def test_a_file_outside_the_working_folder_is_shown_absolute(tmp_path, monkeypatch):
    """A run in /tmp printed from a checkout read ``../../../tmp/run/report.html``; under the working folder it stays short."""
    work = tmp_path / "work"
    (work / "runs").mkdir(parents=True)
    monkeypatch.chdir(work)
    assert shown(str(tmp_path / "other" / "report.html")) == str(tmp_path / "other" / "report.html")
    assert shown(str(work / "runs" / "report.html")) == os.path.join("runs", "report.html")
    assert shown(str(tmp_path)) == str(tmp_path)
    assert shown(str(work / "..foo")) == "..foo"  # a name that starts with two dots lies inside
