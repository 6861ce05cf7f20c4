"""``bench/jax_wire_excess.py``: each all-reduce's time beside the wire's for its bytes at the job's rate, on a real
recording laid out as ``bench_frameworks.py --testbed --keep`` keeps a job."""
from __future__ import annotations

import os
import shutil
import sys

import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from jax_wire_excess import job_rows, main  # noqa: E402
from shaped_loopback import PAYLOAD_SHARE  # noqa: E402

RUN = DATA / "tf-jax" / "shardmap-threads"


def test_each_all_reduce_beside_the_wire_for_its_bytes_on_the_one_shaped_loopback(tmp_path):
    out = tmp_path / "tb-jax_shardmap-0-500M"
    shutil.copytree(RUN, out)
    rows, share, calls, others = job_rows(str(out), 500e6)
    assert rows and share == PAYLOAD_SHARE  # no count of the window's bytes kept beside it: full frames
    for _, nbytes, per_step, median_ms, wire_ms in rows:
        assert nbytes > 0 and per_step > 0 and median_ms > 0
        assert wire_ms == pytest.approx(2 * nbytes * 8 / (500e6 * PAYLOAD_SHARE) * 1e3)  # 2 ranks: 2 (N - 1) S on the medium
    assert calls is not None and calls >= len(rows)  # one gloo call per operand


def test_the_kept_folder_prints_a_line_a_job(tmp_path, capsys):
    shutil.copytree(RUN, tmp_path / "tb-jax_shardmap-0-500M")
    shutil.copytree(RUN, tmp_path / "tb-jax_shardmap-settle")  # no rate in its name: not judged
    assert main([str(tmp_path), "jax_shardmap"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tb-jax_shardmap-0-500M: collectives") and "beyond it" in lines[0]
    assert not any("settle" in line for line in lines)
