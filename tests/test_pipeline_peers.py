"""A pipeline of 4 stages in one 4-rank group (``tests/data/tp-fresh/pp-stages``): send/recv paired by each op's peer
argument, which the group's size no longer tells."""
from __future__ import annotations

import gzip
import json

import numpy as np
from testdata import DATA

import dagprof
from dagprof.align.matching import match_collectives
from dagprof.analysis.breakdown import iteration_times
from dagprof.replay import replay
from dagprof.traces.events import Kind
from dagprof.traces.parallelism import label_run

RUN = DATA / "tp-fresh" / "pp-stages"
PAIRS = 2 * 2 * 3 * 2  # 2 steps x 2 micro-batches x 3 stage boundaries x (activation forward, gradient back)


def _rewritten(tmp_path, edit) -> str:
    """The vendored traces with ``edit(doc)`` applied to each."""
    for path in RUN.glob("*.json.gz"):
        with gzip.open(path) as f:
            doc = json.load(f)
        edit(doc)
        (tmp_path / path.name.removesuffix(".gz")).write_text(json.dumps(doc))
    return str(tmp_path)


def test_each_send_meets_its_peer_stages_recv():
    run = dagprof.load(RUN)
    for t in run.ranks:  # the reader keeps c10d::send/recv_'s peer (its group rank), on the call and on gloo's transfer
        ev = t.events
        p2p = np.flatnonzero(np.isin(np.array(ev.names)[ev.name], ["c10d::send", "c10d::recv_", "gloo:send", "gloo:recv"]))
        assert len(p2p) and set(ev.peer[p2p].tolist()) <= {t.rank - 1, t.rank + 1}
        assert (ev.peer[ev.group < 0] == -1).all()
    m = match_collectives(run)
    pairs = [it for it in m.instances if it.p2p]
    assert len(pairs) == PAIRS and not m.problems
    assert all(abs(a - b) == 1 for a, b in (it.ranks for it in pairs))
    par, _ = label_run(run)
    assert par.describe() == "PP x4" and not par.unpaired_p2p
    g = dagprof.build_graph(run)
    assert int(((g.kind == Kind.COMM) & (g.rank < 0)).sum()) == PAIRS
    got = iteration_times(g, replay(g))
    assert max(abs(got[r] / g.meta.measured_iter_us[r] - 1) for r in range(4)) < 1e-3  # the measured run, bubbles and all


def test_send_recv_without_a_told_peer_stay_unpaired_with_a_count(tmp_path):
    """record_shapes off (no Concrete Inputs), or no pg_config to say the default group is the one they were issued in."""
    def no_inputs(doc):
        for e in doc["traceEvents"]:
            (e.get("args") or {}).pop("Concrete Inputs", None)

    def no_groups(doc):
        del doc["distributedInfo"]["pg_config"]

    for i, edit in enumerate((no_inputs, no_groups)):
        out = tmp_path / str(i)
        out.mkdir()
        run = dagprof.load(_rewritten(out, edit))
        assert not [it for it in match_collectives(run).instances if it.p2p]
        par, _ = label_run(run)
        assert par.unpaired_p2p.startswith(f"{2 * PAIRS} send/recv (summed over ranks) without a known peer"), par.unpaired_p2p


def test_peer_from_record_param_comms_ranks(tmp_path):
    """NCCL's record (recent torch): "Rank" is a send's or recv's peer in its group, "Dst Rank"/"Src Rank" its global rank;
    the two must agree with the group's ranks (here the peer moved from the calls' inputs onto gloo's transfers)."""
    def as_records(shift):
        def edit(doc):
            peer = None
            for e in sorted(doc["traceEvents"], key=lambda e: e.get("ts", 0)):
                args = e.get("args") or {}
                if e.get("name") in ("c10d::send", "c10d::recv_"):
                    peer = int(args.pop("Concrete Inputs")[2])
                elif e.get("name") in ("gloo:send", "gloo:recv"):
                    args.update({"Rank": peer, ("Dst Rank" if e["name"] == "gloo:send" else "Src Rank"): peer + shift})
        return edit

    for shift, paired in ((0, PAIRS), (1, 0)):  # a global rank the group's ranks contradict: the peer is not told
        out = tmp_path / str(shift)
        out.mkdir()
        run = dagprof.load(_rewritten(out, as_records(shift)))
        assert len([it for it in match_collectives(run).instances if it.p2p]) == paired
