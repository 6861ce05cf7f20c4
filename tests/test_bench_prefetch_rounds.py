"""``bench/fsdp_prefetch_rounds.py --offline``: the kept rounds' table from hand-made step times, and a folder or file
that holds no rounds refused in one line naming it (no job, no timing)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "bench", "fsdp_prefetch_rounds.py")


def offline(folder) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, "--offline", str(folder)], capture_output=True, text=True)


def test_the_kept_rounds_table(tmp_path):
    for r, (d0, d1) in enumerate(((0.100, 0.110), (0.120, 0.121))):
        for depth, s in ((0, d0), (1, d1)):
            cell = tmp_path / f"round{r}" / f"200Mbit-prefetch{depth}"
            cell.mkdir(parents=True)
            (cell / "times.json").write_text(json.dumps([9.0, 9.0, 9.0, s, s, s]))  # the first 3: warm-up, left out
    done = offline(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "prefetch 0: median   110.0 ms over 2 rounds" in done.stdout
    assert "prefetch 1: median   115.5 ms over 2 rounds" in done.stdout and "+5.0 % against depth 0" in done.stdout


def test_no_rounds_or_a_bad_times_file_is_one_line(tmp_path):
    for folder, said in ((tmp_path / "none", "no such folder"), (tmp_path, "no kept rounds")):
        done = offline(folder)
        assert done.returncode == 1 and done.stderr.strip().count("\n") == 0 and f"{folder}: {said}" in done.stderr
    cell = tmp_path / "round0" / "1Gbit-prefetch0"
    cell.mkdir(parents=True)
    (cell / "times.json").write_text('{"steps": 1}')
    done = offline(tmp_path)
    assert done.returncode == 1 and done.stderr.strip().count("\n") == 0
    assert f"{cell / 'times.json'}: not a job's step times" in done.stderr and "Traceback" not in done.stderr
