"""``dagprof whatif --profiled-bandwidth RATE``: the wire rate the run was profiled at splits the link fitted to its
collectives (``passes.link_fit.split_at_wire``). The fit's time per byte beyond the wire's is work on the cores and stays at
every --bandwidth; only the wire's part scales (a Horovod job's collectives take the longer of the wire's time and what
they took beyond the wire profiled). A fit faster than the wire scales whole, by the rate ratio. On vendored
recordings of TF, JAX and Horovod jobs (tests/data/tf, tf-jax, horovod), each given a rate it might have run at."""
from __future__ import annotations

import json
import os
import sys

import msgspec
import numpy as np
import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from shaped_loopback import PAYLOAD_SHARE, kept_comm_ms, measured, payload_share, predict_rate, rate_models, wire_rate  # noqa: E402

from dagprof.cli.main import main  # noqa: E402
from dagprof.costmodel.collectives import allreduce_us
from dagprof.graph.build_fsdp import allreduce_equivalent_bytes
from dagprof.passes.link_fit import LARGE_SHARE, link_fit, priced_comm, profiled_collectives, profiled_comm, unhidden_note, unhidden_us_per_byte
from dagprof.pipeline import open_run
from dagprof.search.scenario import Cluster, Scenario, apply, base_topology, profiled_at
from dagprof.search.whatif import evaluate
from dagprof.traces.load import load

PMAP = DATA / "tf-jax" / "pmap"  # its collectives fit at about 35 % of 1 Gbit/s: far below such a wire
LOOP = DATA / "tf" / "loop"  # its collectives fit at about 3.4 Gbit/s: faster than 1 Gbit/s


def rows(run, cluster: Cluster, *bandwidths: str | None) -> dict:
    g = open_run(run).graph
    return evaluate(g, [Scenario(bandwidth=b) for b in bandwidths], cluster, open_run(run).analysis.measured_us, tolerance_pct=None, raw=True)


def test_the_excess_over_the_wire_stays_and_the_wire_scales():
    g = open_run(PMAP).graph
    c = Cluster(profiled_bandwidth="1Gbit")
    marked = profiled_at(g, c)
    base = base_topology(marked, c)
    at = {b: apply(marked, Scenario(bandwidth=b), c, base) for b in (None, "1Gbit", "100Mbit")}
    comm = np.flatnonzero(priced_comm(at[None]))
    assert len(comm)
    # the profiled rate prices every collective (and the exit lags) as the plain fit does: the model it starts from is the same
    plain = apply(g, Scenario(), Cluster(), base_topology(g, Cluster()))
    np.testing.assert_allclose(at[None].dur, plain.dur, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(at[None].gap, plain.gap, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(at["1Gbit"].dur, plain.dur, rtol=1e-9, atol=1e-6)
    # 100 Mbit/s adds each collective's bytes' wire time at 100 Mbit/s less at 1 Gbit/s (2 ranks: a ring moves its bytes once)
    wire_us = allreduce_equivalent_bytes(at[None], comm) * (8e6 / 100e6 - 8e6 / 1e9)
    np.testing.assert_allclose(at["100Mbit"].dur[comm] - at[None].dur[comm], wire_us, rtol=1e-9)


def test_the_cpu_excess_neither_stretches_nor_vanishes():
    fit = link_fit(open_run(PMAP).graph).link.bandwidth_bytes_per_s
    plain = rows(PMAP, Cluster(), None, "100Mbit", f"{fit / 10:.6f}B/s")
    split = rows(PMAP, Cluster(profiled_bandwidth="1Gbit"), None, "100Mbit")
    assert split["model_iter_ms"] == pytest.approx(plain["model_iter_ms"], rel=1e-9)
    # without the rate: --bandwidth 100Mbit replaces the fit's whole time per byte (the excess is gone), and the fit scaled
    # by the rate ratio stretches the excess as wire time; with it, the excess stays
    dropped, stretched = (row.predicted_iter_ms for row in plain["scenarios"][1:])
    assert split["model_iter_ms"] < dropped < split["scenarios"][1].predicted_iter_ms < stretched
    wire = split["link_fit"]["profiled_wire"]
    assert wire["far_below"] and 0 < wire["fit_share"] < 0.8 and wire["collectives"] == split["link_fit"]["collectives"] and wire["bytes"] > 0
    assert sum(n.startswith("far below the wire: --profiled-bandwidth 1Gbit") for n in split["notes"]) == 1
    assert plain["link_fit"]["profiled_wire"] is None and not any("--profiled-bandwidth" in n for n in plain["notes"])


def test_a_horovod_collective_takes_the_longer_of_its_profiled_price_and_the_wire():
    run = DATA / "horovod" / "sparse-gru"  # its collectives fit at about 840 Mbit/s: 42 % of 2 Gbit/s
    g = open_run(run).graph
    c = Cluster(profiled_bandwidth="2Gbit")
    marked = profiled_at(g, c)
    base = base_topology(marked, c)
    at = {b: apply(marked, Scenario(bandwidth=b), c, base) for b in (None, "2Gbit", "200Mbit")}
    plain = apply(g, Scenario(), Cluster(), base_topology(g, Cluster()))
    comm = np.flatnonzero(priced_comm(plain))
    # each transfer's own profiled time is its floor (passes.comm._horovod_stalls), not the fit's price: the model of the
    # profiled run keeps every step's collectives as measured (the fit's line moved them between steps)
    nbytes = allreduce_equivalent_bytes(plain, comm)
    measured = g.dur[comm]
    assert measured.sum() == pytest.approx(plain.dur[comm].sum(), rel=0.05) and not np.allclose(measured, plain.dur[comm], rtol=0.01)
    np.testing.assert_allclose(at[None].dur[comm], measured, rtol=1e-9)
    np.testing.assert_allclose(at["2Gbit"].dur[comm], measured, rtol=1e-9)

    def wire(rate: float) -> np.ndarray:  # us: 2 ranks, a ring moves its bytes once; as much less as a transfer beat the profiled wire
        return nbytes * 8e6 / rate * np.minimum(measured / (nbytes * 8e6 / 2e9), 1.0)

    # 200 Mbit/s: the wire's time alone where longer than the profiled time, else that time; 4 Gbit/s: the profiled time less
    # the wire's time it saves
    assert (wire(200e6) > measured).any() and (wire(200e6) < measured).any()
    np.testing.assert_allclose(at["200Mbit"].dur[comm], np.maximum(measured, wire(200e6)), rtol=1e-9)
    faster = apply(marked, Scenario(bandwidth="4Gbit"), c, base)
    np.testing.assert_allclose(faster.dur[comm], np.maximum(measured - nbytes * (8e6 / 2e9 - 8e6 / 4e9), wire(4e9)), rtol=1e-9)
    notes = rows(run, c, "200Mbit")["notes"]
    assert sum("takes the longer of its profiled price and the wire's time at a slower --bandwidth" in n for n in notes) == 1
    assert not any("faster than --profiled-bandwidth" in n for n in notes)
    # what the wire hid is the least the slower row's collectives take; kept after the wire, the most: the note says how much
    beyond = np.maximum(plain.dur[comm] - nbytes * 8e6 / 2e9, 0.0).sum() / len(np.unique(plain.step[comm])) / 1e3
    slower = [n for n in notes if n.startswith("1 row slower than --profiled-bandwidth 2Gbit")]
    assert len(slower) == 1 and f"up to {beyond:.1f} ms a step more" in slower[0]


def test_the_time_beyond_the_wire_is_said_of_the_rows_at_the_profiled_size_only():
    """The slower rows' note gives the time the profile measured beyond the wire per step, which is the profiled 2 ranks':
    a row that also adds workers is left out of it and counted apart, not told that figure."""
    run = DATA / "horovod" / "sparse-gru"
    g = open_run(run).graph
    c, measured_us = Cluster(profiled_bandwidth="2Gbit"), open_run(run).analysis.measured_us
    both = evaluate(g, [Scenario(bandwidth="200Mbit"), Scenario(bandwidth="200Mbit", workers=4)], c, measured_us, tolerance_pct=None, raw=True)["notes"]
    assert sum(n.startswith("1 row slower than --profiled-bandwidth 2Gbit") for n in both) == 1
    apart = [n for n in both if n.startswith("1 row away from --profiled-bandwidth 2Gbit with other --workers than the profiled 2")]
    assert len(apart) == 1 and "measured at 2 ranks" in apart[0]
    only = evaluate(g, [Scenario(bandwidth="200Mbit", workers=4)], c, measured_us, tolerance_pct=None, raw=True)["notes"]
    assert not any(" slower than --profiled" in n or " faster than --profiled" in n for n in only)
    assert sum(n.startswith("1 row away from --profiled-bandwidth") for n in only) == 1


def test_a_faster_wire_than_profiled_saves_a_horovod_collective_the_wire_time_alone():
    """hvd_sparse_gru profiled at 200 Mbit/s on the testbed (its collectives at the wire's rate) and measured at 500 Mbit/s
    in the same round (tests/data/horovod/testbed-sparse-gru): the profiled price as the floor gained nothing from the faster
    wire (the median step +70.6 %); less the wire's time saved, -11.4 %. What the wire hid on the cores at
    200 Mbit/s came out at 500 Mbit/s (its collectives 1.32 times the wire): the prediction's collectives are the least, the
    profiled ones the most, and the note says so."""
    pair = DATA / "horovod" / "testbed-sparse-gru"
    got, other = predict_rate(str(pair / "200M"), 200e6, 500e6), measured(str(pair / "500M"))
    assert got["fit_of_wire_pct"] / PAYLOAD_SHARE == pytest.approx(100, abs=3)  # of the payload the wire carries
    assert got["predicted_comm_ms"] < other["comm_ms"] < got["comm_ms"] == got["most_comm_ms"]
    down = predict_rate(str(pair / "500M"), 500e6, 200e6)  # the other way: the excess over the 500 Mbit/s wire kept after the slower one
    assert down["predicted_comm_ms"] < down["most_comm_ms"] < down["predicted_comm_ms"] + down["comm_ms"]
    assert got["predicted_comm_ms"] < 0.5 * got["comm_ms"]  # the wire's time: 2.5 times shorter at 500 Mbit/s
    n, share = 2, PAYLOAD_SHARE
    notes = rows(pair / "200M", Cluster(profiled_bandwidth=wire_rate(200e6, n, share)), wire_rate(500e6, n, share))["notes"]
    assert sum(n.startswith("1 row faster than --profiled-bandwidth") and "may take up to their profiled time" in n for n in notes) == 1


def test_a_horovod_window_counts_the_bytes_its_wire_carried():
    """hvd_autoencoder profiled on the testbed at 500 Mbit/s (tests/data/horovod/testbed-autoencoder): each rank counted the
    host's sent bytes over the window, so the wire's share of the payload is measured, not the full frames' 95.6 %: its
    2.24 MB of fp16 gradients a step crossed as 4.49 MB of payload in 4.79 MB on the wire (headers, acknowledgements,
    each cycle's negotiation). A recording made before the count keeps the full frames, and says so."""
    run = DATA / "horovod" / "testbed-autoencoder"
    docs = [json.loads((run / f"rank{r}.horovod.json").read_text()) for r in (0, 1)]
    ranks = load(run).ranks
    assert [t.meta.window_tx_bytes_per_step for t in ranks] == [d["window_tx_bytes"] / len(t.meta.steps_profiled) for d, t in zip(docs, ranks)]
    share, how = payload_share(str(run), 2)
    assert share == pytest.approx(0.937, abs=0.002) and how == "4790 kB on the wire a step for 4486 kB of payload"
    old = DATA / "horovod" / "testbed-sparse-gru" / "500M"
    assert all(t.meta.window_tx_bytes_per_step is None for t in load(old).ranks)
    assert payload_share(str(old), 2) == (PAYLOAD_SHARE, "full frames (no count of the window's bytes)")


def test_workers_on_hosts_of_their_own_send_through_their_own_ports():
    """The testbed as hosts (``bench_frameworks.py --testbed --hosts``): a ring all-reduce's 2 (N - 1) / N S bytes leave
    each worker by its own port, so the model's link is the rate where on the one loopback it is rate / N; the most a
    Horovod what-if's collectives take prices that wire; each rank counted its own host's bytes, so the window's are their
    sum (on this loopback recording both ranks counted the one loopback: summed, the wire's bytes are twice over)."""
    assert wire_rate(1e9, 2, 1.0, own_ports=True) == "1000Mbit" and wire_rate(1e9, 2, 1.0) == "500Mbit"
    run = DATA / "horovod" / "testbed-autoencoder"
    g = open_run(run).graph
    assert kept_comm_ms(g, 500e6, 200e6, 0.94, own_ports=True) == pytest.approx(kept_comm_ms(g, 1e9, 400e6, 0.94))
    shared, own = payload_share(str(run), 2)[0], payload_share(str(run), 2, own_ports=True)[0]
    assert own == pytest.approx(shared / 2, rel=0.01)


def test_a_fit_faster_than_the_wire_scales_by_the_rate_ratio():
    fit = link_fit(open_run(LOOP).graph).link.bandwidth_bytes_per_s
    assert fit > 1e9 / 8
    split = rows(LOOP, Cluster(profiled_bandwidth="1Gbit"), "100Mbit")
    ratio = rows(LOOP, Cluster(), f"{fit / 10:.6f}B/s")
    assert split["scenarios"][0].predicted_iter_ms == pytest.approx(ratio["scenarios"][0].predicted_iter_ms, rel=1e-9)
    assert not split["link_fit"]["profiled_wire"]["far_below"]
    assert any("no slower than the wire" in n for n in split["notes"])


def test_collectives_without_time_per_byte_keep_their_time():
    split = rows(DATA / "horovod" / "text", Cluster(profiled_bandwidth="1Gbit"), None, "100Mbit")
    assert split["link_fit"]["profiled_wire"]["fit_share"] is None
    assert split["scenarios"][1].predicted_iter_ms == pytest.approx(split["scenarios"][0].predicted_iter_ms, rel=1e-9)
    assert any("show no time per byte" in n for n in split["notes"])


def test_cli_text_and_json(capsys):
    args = ["whatif", str(PMAP), "--bandwidth", "100Mbit", "--profiled-bandwidth", "1Gbit", "--no-trace", "--allow-model-error"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert sum(line.startswith("note: far below the wire: --profiled-bandwidth 1Gbit") for line in text.splitlines()) == 1
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["link_fit"]["profiled_wire"]["far_below"] and any(n.startswith("far below the wire") for n in out["notes"])


@pytest.mark.parametrize("extra, why", [
    (["--profiled-bandwidth", "1"], "has no unit"),
    (["--profiled-bandwidth", "fast"], "cannot read bandwidth"),
    (["--profiled-bandwidth", "0Gbit"], "positive"),
    (["--profiled-bandwidth", "1Gbit", "--link-model", str(DATA / "fsdp" / "testbed-calibrate" / "1gbit.json")], "--link-model give the link"),
    (["--profiled-bandwidth", "1Gbit", "--topology", "10gbe"], "--topology and --link-model"),
])
def test_bad_values_are_refused_in_one_line(capsys, extra, why):
    assert main(["whatif", str(PMAP), "--bandwidth", "100Mbit", "--no-trace", "--allow-model-error", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert why in err and "Traceback" not in err and len(err.splitlines()) <= 2  # argparse prints its usage line first


def test_a_parameter_server_job_reads_its_own_fit_against_the_wire(capsys):
    """Its messages are priced on their own fit (``passes.comm.ps_bandwidth``; tests/test_mxnet_testbed.py holds it against
    a measured job); the note says which way the fit was read."""
    assert main(["whatif", str(DATA / "mxnet" / "user_mlp"), "--bandwidth", "100Mbit", "--profiled-bandwidth", "1Gbit",
                 "--no-trace", "--allow-model-error"]) == 0
    out = capsys.readouterr().out
    assert out.count("--profiled-bandwidth 1Gbit: the parameter-server exchanges") == 1


def test_fp16_all_reduces_keep_one_segments_sum_of_their_least_time_beyond_the_wire_at_a_slower_one():
    """hvd_autoencoder's fp16 gradients (tests/data/horovod/testbed-autoencoder, 500 Mbit/s at load 7.5): of the least time
    per byte its large transfers took beyond the wire, what one segment's sum takes stays beside a slower wire
    (``unhidden_us_per_byte``, ``costmodel.gloo_ring.unhidden_reduce_us``), the rest of the fit a floor that wire hides.
    Its least excess outlasted a segment's wire time (2 ranks: a quarter of the bytes), so its two segments' sums were
    serial, one of them overlapping a segment's wire: the sum is (excess + a segment's wire) / 2. An excess within a
    segment's wire time stays whole. hvd_sparse_gru's fp32 ones keep none (``testbed-sparse-gru/500M``)."""
    def marked(run):
        share, _ = payload_share(str(run), 2)
        c = Cluster(profiled_bandwidth=wire_rate(500e6, 2, share))
        return profiled_at(open_run(run).graph, c), c

    g, c = marked(DATA / "horovod" / "testbed-autoencoder")
    wire = 1e6 / g.meta.wire_bytes_per_s
    kept = unhidden_us_per_byte(g, wire)
    nbytes, dur = profiled_collectives(g)
    large = nbytes >= LARGE_SHARE * nbytes.max()
    least = float((dur[large] / nbytes[large] - wire).min())  # 2 ranks: the ring's share is the bytes
    assert least > wire / 4
    assert kept == pytest.approx((least + wire / 4) / 2, rel=1e-3)
    topo = base_topology(g, c)
    assert topo.inter.gamma_us_per_byte == pytest.approx(2 * kept) and topo.floor is not None
    slow = topo.with_link("inter", 0.4e6 / wire, None)  # 200 Mbit/s: the wire 2.5 times slower, the kept work as it was
    big = float(nbytes.max())
    assert allreduce_us(big, slow) == pytest.approx(big * (2.5 * wire + kept))
    # the same transfers each 0.1 wire times beyond the wire: within a segment's wire time, kept whole
    comm = profiled_comm(g)
    quick = g.replace(dur=g.dur.astype(float))
    quick.dur[comm] = allreduce_equivalent_bytes(g, comm) * 1.1 * wire
    assert unhidden_us_per_byte(quick, wire) == pytest.approx(0.1 * wire, rel=1e-3)
    fp32, _ = marked(DATA / "horovod" / "testbed-sparse-gru" / "500M")
    assert unhidden_us_per_byte(fp32, 1e6 / fp32.meta.wire_bytes_per_s) == 0.0


def test_a_mix_of_fp16_and_fp32_all_reduces_keeps_none_and_says_so():
    """The rule was measured on jobs all fp16 or all fp32: a mix keeps nothing beyond the wire, said with its count; grouped
    all-reduces (``grouped_allreduce.*``) count as all-reduced gradients, where they once went unseen."""
    g = open_run(DATA / "horovod" / "grouped").graph
    hv = g.meta.horovod
    tensors = sorted(hv.tensor_dtypes)
    assert tensors and all(t.startswith("grouped_allreduce.") for t in tensors)
    half = {t: "float16" if k % 2 else "float32" for k, t in enumerate(tensors)}
    mixed = g.replace(meta=g.meta.replace(horovod=msgspec.structs.replace(hv, tensor_dtypes=half), wire_bytes_per_s=1e8))
    assert unhidden_us_per_byte(mixed, 0.01) == 0.0
    (note,) = unhidden_note(mixed)
    assert note.startswith(f"{len(tensors) // 2} of the {len(tensors)} all-reduced gradients are float16, the rest float32")
    fp16 = g.replace(meta=mixed.meta.replace(horovod=msgspec.structs.replace(hv, tensor_dtypes=dict.fromkeys(tensors, "float16"))))
    assert not unhidden_note(fp16) and not unhidden_note(g)


def test_a_horovod_fit_no_slower_than_the_wire_with_a_latency_takes_the_floor_too():
    """hvd_lstm_lm profiled at 1 Gbit/s on the two-host testbed (``horovod/pinned-quiet``): its fit a little faster per byte
    than the wire's payload rate, with ~1 ms of latency. That latency is its transfers' time beyond the wire, which a
    slower wire hides as it hides a slower fit's: each transfer's own time is its floor, so the model keeps every transfer
    as measured, and at 200 Mbit/s each takes the longer of that and the wire's time (kept as latency beside the wire,
    a fit 1 % either side of the wire priced its latency kept or hidden)."""
    run = DATA / "horovod" / "pinned-quiet"
    g = open_run(run).graph
    got = predict_rate(str(run), 1e9, 200e6, own_ports=True)
    assert got["fit_latency_us"] > 0 and got["fit_of_wire_pct"] > got["payload_share_pct"]  # faster than the wire's payload rate
    m = rate_models(g, str(run), 1e9, 200e6, own_ports=True)
    assert m.model.meta.topology.floor is not None
    comm = np.flatnonzero(priced_comm(m.model) & (g.dur > 0))
    np.testing.assert_allclose(m.model.dur[comm], g.dur[comm], rtol=1e-9)
    assert got["model_median_pct"] == pytest.approx(0.0, abs=1e-3) and got["model_pct"] == pytest.approx(0.0, abs=1e-3)  # main: -0.11, -0.43 %
    assert (m.what_if.dur[comm] >= g.dur[comm] - 1e-6).all()
    nbytes = allreduce_equivalent_bytes(m.model, comm)
    wire = nbytes * 8e6 / (200e6 * m.share)  # us: each rank's own port, 2 ranks: a ring moves its bytes once
    assert (m.what_if.dur[comm] <= np.maximum(g.dur[comm], wire) * (1 + 1e-3)).all()
    assert got["predicted_comm_ms"] <= got["most_comm_ms"]
