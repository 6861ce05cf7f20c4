"""MXNet 2-bit gradient compression (``kv.set_gradient_compression({"type": "2bit"})``) under ``dist_sync``: the workers
quantize each gradient (``QuantizeCPU``) and push it as ``KVStoreDistCompressedPush``, 16 elements a 4-byte word and a meta
ps-lite key a part (MXNet 1.9.1's ``EncodeCompressedKey``), while the pulls carry the full values. The fixture is
``bench/frameworks/mx_resnet_2bit.py`` on 1 server, 2 workers (``tests/data/mxnet/README.md``)."""
import math

import numpy as np
import pytest
from testdata import DATA, copy_fixture, edit_json, load_refused

from dagprof.cli.cmd_analyze import to_text
from dagprof.graph.build_ps import DONE, ISSUE, KEY_IN, build_ps_graph
from dagprof.pipeline import open_run
from dagprof.search.scenario import Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces import mxnet
from dagprof.traces.load import load
from dagprof.traces.mxnet import COMPRESSED_META_BYTES, compressed_parts, pslite_bytes

RESNET = DATA / "mxnet" / "user_resnet_2bit"


def test_a_compressed_push_is_priced_at_its_packed_bytes_and_the_pull_whole():
    ps = load(str(RESNET)).meta.ps
    assert ps.compression == "2bit" and len(ps.keys) == 43
    for k in ps.keys:
        ((server, pushed, pulled),) = pslite_bytes(ps, k, 5, 1)
        assert server == 0 and pulled == 4 * k.elements
        assert pushed == 4 * math.ceil(k.elements / 16) + COMPRESSED_META_BYTES  # 1/16 of the pull, and the meta key
    assert load(str(DATA / "mxnet" / "user_convnet")).meta.ps.compression == ""  # plain pushes: priced as pulled


def test_a_big_compressed_key_is_cut_by_its_words():
    # 1,000,003 elements on 3 servers: 62,501 words, cut 20,834 / 20,833 / 20,834 as MXNet rounds, the last part's
    # elements the rest
    parts = compressed_parts(7, 1_000_003, 3, 1_000_000)
    assert [w for _, w, _ in parts] == [20_834, 20_833, 20_834]
    assert [e for _, _, e in parts] == [20_834 * 16, 20_833 * 16, 1_000_003 - 41_667 * 16]
    assert compressed_parts(7, 999, 3, 1_000_000) == [(7 * 9973 % 3, 63, 999)]


def test_the_graph_sends_the_packed_bytes_and_analyze_says_the_compression():
    prof = open_run(str(RESNET))
    g = prof.graph
    ps = g.meta.ps
    key = max(ps.keys, key=lambda k: k.elements)
    step = g.meta.steps[0]
    sent = {}
    for way in ("push", "pull"):
        ids = [i for i, n in enumerate(g.names) if n == f"key{key.key} s{step} {way} ps0 w0 send"]
        sent[way] = int(g.nbytes[np.isin(g.name, ids)].sum())
    ((_, pushed, pulled),) = pslite_bytes(ps, key, step, 1)
    assert sent == {"push": pytest.approx(pushed, abs=1), "pull": pytest.approx(pulled, abs=1)}
    report = prof.to_dict()
    c = report["ps_compression"]
    assert c["type"] == "2bit" and c["pulled_mb"] > 15 * c["pushed_mb"] and c["quantize_ms"] > 0
    assert "pushes compressed (2bit" in to_text(report)


def test_a_job_that_pushed_some_keys_plainly_is_refused(tmp_path):
    run = copy_fixture(tmp_path, "mxnet/user_resnet_2bit")

    def plain(doc):
        for e in doc["traceEvents"]:
            if e.get("name") == "KVStoreDistCompressedPush":
                e["name"] = "KVStoreDistDefaultPush"

    edit_json(run / "worker1.json.gz", plain)
    load_refused(run, "compressed pushes (KVStoreDistCompressedPush) beside", "plain ones", "mxnet-run.json")


BOW = DATA / "mxnet" / "user_bow_2bit"


def test_a_server_s_dequantizing_is_its_work_per_byte_received(monkeypatch):
    """A compressed push reaches a server packed: it runs ``DequantizeCPU`` for each worker's before the sum (3.6 ms a step
    on the bag-of-n-grams' server, more than its sums and Adam together), which the servers' per-byte work now holds."""

    with_it = {(b.file, b.step): b.ops_us for b in load(str(BOW)).meta.ps.server_busy}
    monkeypatch.setattr(mxnet, "RECEIVED", tuple(n for n in mxnet.RECEIVED if n != mxnet.DEQUANTIZE))
    without = {(b.file, b.step): b.ops_us for b in load(str(BOW)).meta.ps.server_busy}
    assert with_it.keys() == without.keys() and len(with_it) == 3
    assert all(with_it[k] > without[k] + 1_000 for k in with_it)  # over 1 ms of dequantizing in every step


def test_ops_beside_separate_pulls_wait_for_the_pull_they_followed():
    """A compressed push and its pull are two ops (``KVStoreDistCompressedPush``, ``KVStoreDistDefaultStoragePull``), one
    each per key: matched to keys as pushes that carry their pulls, they were never the key count, so every op the worker
    ran beside the pulls waited for the last one, and the bag-of-n-grams' profiled run replayed +4.4 %. Matched by the
    pulls' arrival, the model of the profiled run is within 2 %, and on the ResNet too."""
    for run in (BOW, RESNET):
        p = open_run(str(run))
        r = evaluate(p.graph, [Scenario()], measured_us=p.analysis.measured_us, tolerance_pct=None)
        assert abs(r["model_error_pct"]) < 2.0
    g = open_run(str(BOW)).graph
    src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
    done = {(int(g.step[v]), int(g.rank[v])): float(g.order[v]) for v in np.flatnonzero(g.name == g.names.index(DONE))}
    ops = np.flatnonzero(g.device >= 0)
    early = [v for v in ops if g.rank[v] >= 0 and (int(g.step[v]), int(g.rank[v])) in done
             and g.order[v] < done[(int(g.step[v]), int(g.rank[v]))] - 1_000]  # began 1 ms before the last pull in
    waits = [{g.node_name(u) for u in src[g.succ == v] if g.step[u] == g.step[v]} for v in early]  # its own step's exchange
    assert not [w for w in waits if DONE in w]
    assert sum(KEY_IN in w for w in waits) >= 2 * len(g.meta.steps)  # an op beside the pulls on every worker and step


def test_a_compressed_push_waits_for_its_gradient_s_quantizing():
    """A worker quantizes each gradient (``QuantizeCPU``, on its engine) before it pushes the packed words: on both 2-bit
    fixtures every push's issue waits for a quantize node, every quantize node feeds an issue, and no issue is placed
    before the end of a quantize it waits for."""
    for run in (BOW, RESNET):
        g = build_ps_graph(load(str(run)))
        src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
        issues = np.flatnonzero(g.name == g.names.index(ISSUE))
        quantize = np.isin(g.name, [i for i, n in enumerate(g.names) if n.endswith(mxnet.QUANTIZE)])
        fed = [src[(g.succ == v) & quantize[src]] for v in issues]  # its own, and the op before the first push may be one
        assert all(len(q) for q in fed) and len(set(np.concatenate(fed).tolist())) == len(issues) == int(quantize.sum())
        assert all(g.order[v] >= g.order[u] + g.dur[u] - 1e-6 for v, q in zip(issues, fed) for u in q)
