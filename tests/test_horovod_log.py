"""Each rank's own end of every Horovod response, from its trace log (``traces.horovod_log``, kept by
``collect.hooks.horovod_log``): the reader's peer lags and waits, and the bandwidth what-if's scaling of the waits."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from testdata import DATA

from dagprof.errors import DagprofError
from dagprof.graph.provenance import provenance
from dagprof.passes import set_link, set_topology
from dagprof.pipeline import open_run
from dagprof.search.scenario import Cluster, base_topology, profiled_at
from dagprof.traces.horovod import NEGOTIATE, TIMELINE, horovod_rank_file
from dagprof.traces.horovod_log import LOG_FILE, read_log
from dagprof.traces.horovod_timeline import read_timeline

RUN = DATA / "horovod" / "testbed-sparse-gru" / "500M"
SRC = os.path.join(os.path.dirname(__file__), "..", "src")


def _stamp(epoch_us: float, offset_s: int = 0) -> str:
    """Horovod's stamp (horovod/common/logging.cc): local time, the microseconds in a field of 6, space-padded."""
    sec, us = divmod(int(round(epoch_us)), 1_000_000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(sec + offset_s)) + f".{us:6d}"


def _line(epoch_us: float, rank: int, what: str, tensors: list[str], offset_s: int = 0) -> str:
    return f"[{_stamp(epoch_us, offset_s)}: T /src/horovod/common/operations.cc:833] [{rank}]: {what} {', '.join(tensors)}"


def test_the_log_gives_each_response_its_start_and_end(tmp_path):
    path = tmp_path / "rank1.horovod.log"
    at = 1_764_900_000_004_236.0  # a stamp whose microseconds are padded: ".  4236"
    path.write_text("\n".join([
        _line(at, 1, "Performing", ["allreduce.b", "allreduce.a"], 3600),
        _line(at + 900, 1, "Finished performing", ["allreduce.a", "allreduce.b"], 3600)[1:],  # its "[" lost to another thread's line
        "[2026-12-05 06:06:03.  2389: T /src/operations.cc:833] [1]: Finished perf",  # cut
        _line(at + 5000, 1, "Performing", ["allgather.e.values"], 3600),
        "a line of the user's own",
    ]) + "\n")
    log = read_log(str(path), 1, 3600)
    assert [(sorted(r.tensors), r.start_us, r.end_us) for r in log.responses] == [(["allreduce.a", "allreduce.b"], at, at + 900)]
    assert "  4236:" in path.read_text().splitlines()[0]
    assert (log.unreadable, log.unpaired) == (1, 0)  # one start left open is the window's edge
    with pytest.raises(DagprofError, match="holds rank 1's lines, not rank 0's"):
        read_log(str(path), 0, 3600)


def _with_logs(tmp_path, lag_us: float) -> str:
    """The stored 500 Mbit/s job with each rank's log as the timeline has rank 0's responses, rank 1 leaving each ``lag_us`` later."""
    run = str(tmp_path / "run")
    shutil.copytree(RUN, run)
    tl = read_timeline(os.path.join(run, TIMELINE))
    for rank in (0, 1):
        with open(os.path.join(run, horovod_rank_file(rank))) as f:
            doc = json.load(f)
        doc |= {"log": LOG_FILE.format(rank=rank), "utc_offset_s": 0}
        with open(os.path.join(run, horovod_rank_file(rank)), "w") as f:
            json.dump(doc, f)
        late = lag_us if rank else 0.0
        lines = [x for r in tl.responses for x in (_line(r.t0, rank, "Performing", r.tensors), _line(r.t1 + late, rank, "Finished performing", r.tensors))]
        (tmp_path / "run" / LOG_FILE.format(rank=rank)).write_text("\n".join(lines) + "\n")
    return run


def test_a_negotiation_holds_the_peer_still_in_the_previous_response(tmp_path):
    g = open_run(_with_logs(tmp_path, 2000.0)).graph
    hv = g.meta.horovod
    assert len(hv.peer_lags) == len(hv.measured) and np.allclose([x.us for x in hv.peer_lags], 2000.0, atol=1.0)
    p = provenance(g)
    neg = {(int(g.step[v]), int(g.bucket[v])): v for v in range(len(g)) if g.node_name(v).endswith(NEGOTIATE)}
    assert len(hv.peer_waits) == len(neg) - 1  # each but the window's first follows a response
    full = {}  # (step, position) -> (us of the span before the peer left the previous response, that response's bytes)
    for (s, k), v in neg.items():
        lane = [u for u in g.predecessors(v).tolist() if g.device[u] == g.device[v]]
        if not lane:  # the window's first
            continue
        prev = max(lane, key=lambda u: p.mend[u])  # rank 0 left the previous response
        full[(s, k)] = (float(np.clip(p.mend[prev] + 2000.0 - p.mstart[v], 0.0, g.dur[v])), int(g.nbytes[prev]))
    for s, k, w in ((x.step, x.position, x.us) for x in hv.peer_waits):
        us, nb = full[(s, k)]
        held = [x for x, b in full.values() if b == nb and x > 0]
        typical = np.median(held) if held else 0.0  # the wire: a peer's tail of that size
        assert w == pytest.approx(min(us, typical), abs=1.0)
        assert g.exit_lag[neg[(s, k)]] == pytest.approx(w)
    assert sum(x.us > 0 for x in hv.peer_waits) == 12  # the cycles begun while the peer was still in the previous response


def test_a_rank_without_its_log_is_counted_and_its_peers_logs_unused(tmp_path):
    run = _with_logs(tmp_path, 2000.0)
    path = os.path.join(run, horovod_rank_file(1))
    with open(path) as f:
        doc = json.load(f)
    doc.pop("log")
    with open(path, "w") as f:
        json.dump(doc, f)
    g = open_run(run).graph
    assert not g.meta.horovod.peer_lags
    assert any("trace log kept by 1 of 2 ranks" in str(w) for w in g.meta.warnings)


def test_the_bandwidth_whatif_scales_the_peers_wire_in_the_negotiations(tmp_path):
    c = Cluster(profiled_bandwidth="237.5Mbit")  # the model's link of 2 ranks on a 500 Mbit/s loopback (rate x 0.95 / 2)
    slow, model = {}, {}
    for lag in (0.0, 2000.0):
        g = open_run(_with_logs(tmp_path / str(lag), lag)).graph
        marked = profiled_at(g, c)
        model[lag] = set_topology(marked, base_topology(marked, c))
        slow[lag] = set_link(model[lag], 95e6 / 8)  # 200 Mbit/s, as the model's link
    g = model[2000.0]
    neg = np.array([g.node_name(v).endswith(NEGOTIATE) for v in range(len(g))])
    waited = neg & (g.exit_lag > 0)
    assert not (model[0.0].exit_lag[neg] > 0).any() and waited.sum() == 12
    grew = slow[2000.0].dur - g.dur
    ratio = 237.5 / 95
    assert np.all(grew[waited] > 0) and np.all(grew[waited] <= g.exit_lag[waited] * (ratio - 1) + 1e-6)
    assert np.array_equal(grew[neg & ~waited], np.zeros((neg & ~waited).sum()))
    assert np.allclose(slow[2000.0].exit_lag[waited], g.exit_lag[waited] + grew[waited])  # the wire in the span now
    back = set_link(slow[2000.0], 237.5e6 / 8)
    assert np.allclose(back.dur[waited], g.dur[waited])


def test_the_tee_keeps_horovods_lines_of_the_window_and_passes_the_rest_on(tmp_path):
    """fd 1 of a process through the tee: the user's lines pass, Horovod's trace lines are dropped (quiet: dagprof set the
    level) and those about performing responses kept in the file while the window is open."""
    out = tmp_path / "rank0.horovod.log"
    code = f"""
import os, sys, time
from dagprof.collect.hooks.horovod_log import LogTee
tee = LogTee(quiet=True)
tee.path = {str(out)!r}
w = lambda s: os.write(1, s.encode())
w({_line(1e15, 0, "Performing", ["allreduce.x"])!r} + "\\n")
time.sleep(0.2)  # passed on before the window (a line still in the pipe when it opens is kept: the reader places lines by time)
tee.keep(True)
print("user line 1", flush=True)
w({_line(1e15 + 10, 0, "Performing", ["allreduce.y"])!r} + "\\n[2026-12-05 06:00:00.123456: W /src/x.cc:1] a warning\\n")
w({_line(1e15 + 20, 0, "Finished performing", ["allreduce.y"])[1:]!r} + "\\n")
time.sleep(0.2)
tee.keep(False)
print("user line 2")
tee.close()
print("after")
"""
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC}, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == ["user line 1", "[2026-12-05 06:00:00.123456: W /src/x.cc:1] a warning", "user line 2", "after"]
    kept = out.read_text().splitlines()
    assert [x.split("] [0]: ")[1] for x in kept] == ["Performing allreduce.y", "Finished performing allreduce.y"]
