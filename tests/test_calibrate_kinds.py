"""Per-kind link models: ``dagprof calibrate`` sweeps FSDP2's all-gather and reduce-scatter on a real gloo group,
the link-model file keeps each kind's fit (version 2) and every repetition's times (version 5), and FSDP collectives are priced by their kind's fit."""
from __future__ import annotations

import json

import numpy as np
import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.costmodel.alphabeta import AlphaBeta
from dagprof.costmodel.collectives import allreduce_us
from dagprof.costmodel.topology import LINK_MODEL_VERSION, read_link_model, save_link_model
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import fsdp_collectives
from dagprof.search.scenario import Cluster, Scenario, apply, base_topology
from dagprof.traces.dagprof_run import read_run

DDP, FSDP = DATA / "fsdp" / "ddp", DATA / "fsdp" / "reshard"
LINK = AlphaBeta(50.0, 1e-3)
SLOW_GATHER = AlphaBeta(400.0, 2e-2)  # far from LINK: a priced all-gather shows which link it took


def test_calibrate_sweeps_each_kind_on_a_live_gloo_group(capsys, tmp_path):
    out = tmp_path / "link.json"
    assert main(["calibrate", "--world", "2", "--max-mb", "0.0625", "--iters", "2", "--kinds", "all_gather,reduce_scatter",
                 "-o", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert [k["kind"] for k in r["kinds"]] == ["all_gather", "reduce_scatter"]
    for k in r["kinds"]:
        assert len(k["points"]) == 3 and all(p["measured_us"] > 0 and p["skew_us"] >= 0 for p in k["points"])
        assert k["bandwidth_GBps"] > 0
    doc = json.loads(out.read_text())
    assert doc["version"] == 5 and set(doc["kinds"]) == {"all_gather", "reduce_scatter"}
    for sweep in (doc, *doc["kinds"].values()):  # every rank's time of every repetition, per size (version 5)
        assert [np.shape(t) for t in sweep["times_us"]] == [(2, 2)] * 3
    assert [m for m, _ in doc["kinds"]["all_gather"]["points"]] == [4096, 16384, 65536]  # the whole tensor's bytes
    assert dict(read_link_model(out).kinds)["all_gather"] == AlphaBeta(r["kinds"][0]["alpha_us"], doc["kinds"]["all_gather"]["beta_us_per_byte"])


def test_link_model_file_round_trip(tmp_path):
    v2 = save_link_model(tmp_path / "v2.json", LINK, kinds={"all_gather": (SLOW_GATHER, {"points": [[4096, 500.0]], "skew_us": [3.0]})},
                         method="test")
    assert read_link_model(v2).link == LINK and read_link_model(v2).kinds == (("all_gather", SLOW_GATHER),)
    v1 = save_link_model(tmp_path / "v1.json", LINK, method="test")
    assert "version" not in json.loads(open(v1).read()) and read_link_model(v1).kinds == ()
    for bad, message in (({"version": LINK_MODEL_VERSION + 1}, "newer"), ({"kinds": {"broadcast": {"alpha_us": 1, "beta_us_per_byte": 0}}}, "kinds")):
        p = tmp_path / "bad.json"
        p.write_text(json.dumps({"alpha_us": 1.0, "beta_us_per_byte": 1e-3, **bad}))
        with pytest.raises(DagprofError, match=message):
            read_link_model(p)
    for points in ([["x", 500.0]], [[4096]], "abc"):  # a version-3 file's sweep points, damaged: one line, never a traceback
        p = tmp_path / "bad3.json"
        p.write_text(json.dumps({"alpha_us": 1.0, "beta_us_per_byte": 1e-3, "version": 3,
                                 "kinds": {"all_gather": {"alpha_us": 1.0, "beta_us_per_byte": 1e-3, "points": points}}}))
        with pytest.raises(DagprofError, match="points must be"):
            read_link_model(p)
    for times in ([[[1.0, -2.0]]], [[1.0]], [], "abc"):  # a version-5 file's times, damaged or not one table per size
        p = tmp_path / "bad5.json"
        p.write_text(json.dumps({"alpha_us": 1.0, "beta_us_per_byte": 1e-3, "version": 5, "points": [[4096, 500.0]], "times_us": times}))
        with pytest.raises(DagprofError, match="times_us must hold"):
            read_link_model(p)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("links")
    return (save_link_model(d / "v1.json", LINK),
            save_link_model(d / "v2.json", LINK, kinds={"all_gather": (SLOW_GATHER, {})}))


def _priced(g, topo):
    """{kind: [(measured dur, the kind's own link's price, the all-reduce link's price)]} of each FSDP collective."""
    out: dict[str, list] = {}
    for c in fsdp_collectives(g):
        equiv = float(g.nbytes[c.node]) * (0.5 if c.kind.label == "all_gather" else 1.0)  # gloo
        out.setdefault(c.kind.label, []).append((float(g.dur[c.node]), allreduce_us(equiv, topo.for_kind(c.kind.label)), allreduce_us(equiv, topo)))
    return out


@pytest.mark.parametrize("path, scenario", [(DDP, Scenario(data_parallel="fsdp")), (FSDP, Scenario(bandwidth="1Gbit"))])
def test_fsdp_whatif_prices_all_gathers_by_the_all_gather_fit(models, path, scenario):
    v1, v2 = models
    g0 = build_graph(read_run(path))
    t1, t2 = base_topology(g0, Cluster(link_model=v1)), base_topology(g0, Cluster(link_model=v2))
    assert t1.kinds == () and dict(t2.kinds)["all_gather"] == SLOW_GATHER
    with_kinds = apply(g0, scenario, Cluster(link_model=v2), t2)
    without = apply(g0, scenario, Cluster(link_model=v1), t1)
    topo = with_kinds.meta.topology
    priced = _priced(with_kinds, topo)
    assert priced["all_gather"] and priced["reduce_scatter"]
    for dur, own, allreduce in priced["all_gather"]:
        assert dur == pytest.approx(own) and own > allreduce
    for dur, own, allreduce in priced["reduce_scatter"]:  # no fit of its own: the all-reduce link, as before
        assert dur == pytest.approx(own) == pytest.approx(allreduce)
    # a version-1 file: every collective as the all-reduce-equivalent rule prices it
    assert all(d == pytest.approx(a) for ds in _priced(without, without.meta.topology).values() for d, _, a in ds)
    nodes = [c.node for c in fsdp_collectives(without) if c.kind.label == "reduce_scatter"]
    assert np.array_equal(without.dur[nodes], with_kinds.dur[nodes])


def test_a_bandwidth_whatif_scales_each_kinds_link_like_the_links():
    from dagprof.costmodel.topology import Topology

    t = Topology(2, 1, LINK, LINK, 0.0, (("all_gather", SLOW_GATHER),))
    half = t.with_link("inter", bandwidth=0.5e9, latency_us=80.0)
    ratio = half.inter.beta_us_per_byte / LINK.beta_us_per_byte
    assert dict(half.kinds)["all_gather"] == AlphaBeta(SLOW_GATHER.alpha_us + 30.0, SLOW_GATHER.beta_us_per_byte * ratio)
    assert t.with_workers(4).kinds == t.kinds
