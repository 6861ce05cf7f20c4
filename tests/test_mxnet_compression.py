"""MXNet 2-bit gradient compression (``kv.set_gradient_compression({"type": "2bit"})``) under ``dist_sync``: the workers
quantize each gradient (``QuantizeCPU``) and push it as ``KVStoreDistCompressedPush``, 16 elements a 4-byte word and a meta
ps-lite key a part (MXNet 1.9.1's ``EncodeCompressedKey``), while the pulls carry the full values. The fixture is
``bench/frameworks/mx_resnet_2bit.py`` on 1 server, 2 workers (``tests/data/mxnet/README.md``)."""
import math

import numpy as np
import pytest
from testdata import DATA, copy_fixture, edit_json, load_refused

from dagprof.cli.cmd_analyze import to_text
from dagprof.pipeline import open_run
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
