"""MXNet row_sparse exchanges (``gluon.contrib.nn.SparseEmbedding`` under ``dist_sync``): each step pushes the rows its
gradient holds (``KVStoreDistRowSparsePush``) and each forward pulls the batch's rows first (``KVStoreDistRowSparsePull``).
The trace does not count the rows: the collector records them per step and key (counted in row-id ranges, as ps-lite cuts
a big key over servers), and the model prices a push and a pull at rows x (row width x dtype + its 8-byte key).
The fixture is ``bench/frameworks/mx_fasttext_sparse.py`` on 2 servers (``tests/data/mxnet/README.md``)."""
import json

import numpy as np
import pytest
from testdata import DATA, copy_fixture, edit_json, load_refused

from dagprof.analysis import job_iteration_us
from dagprof.collect.hooks.mxnet_ps import ROW_RANGES, _row_ranges
from dagprof.costmodel.topology import CollectiveSpec
from dagprof.graph.build_ps import PULL_ISSUE, PULLED, build_ps_graph
from dagprof.passes import scale_workers, set_link, set_scheme
from dagprof.passes.comm import current_topology
from dagprof.pipeline import open_run
from dagprof.search.scenario import Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.load import load
from dagprof.traces.mxnet import pslite_bytes

SPARSE = DATA / "mxnet" / "user_fasttext_sparse"
WORDS, BIGRAMS = 4, 5  # the two SparseEmbedding tables' keys (60,000 and 100,000 rows of 48 float32)


def test_rows_per_step_are_read_and_priced_per_row():
    ps = load(str(SPARSE)).meta.ps
    keys = {k.key: k for k in ps.keys}
    assert keys[WORDS].row_bytes == keys[BIGRAMS].row_bytes == 48 * 4 + 8 and keys[BIGRAMS].table_rows == 100_000
    assert all(not k.row_bytes for k in ps.keys if k.key not in (WORDS, BIGRAMS))
    assert sorted({(s, w, k) for s, w, k, _ in ps.rows}) == [(s, w, k) for s in (4, 5, 6) for w in (0, 1) for k in (WORDS, BIGRAMS)]
    manifest = json.loads((SPARSE / "mxnet-run.json").read_text())
    for s, w, k, ranges in ps.rows:
        assert len(ranges) == ROW_RANGES and ranges == manifest["rows"][str(w)][str(k)][s - 1]
    step, key = 5, keys[BIGRAMS]
    rows = np.mean([sum(r) for s, _, k, r in ps.rows if s == step and k == key.key])
    assert pslite_bytes(ps, key, step, 1) == [(0, pytest.approx(rows * 200), pytest.approx(rows * 200))]


def test_a_big_row_sparse_key_is_cut_over_servers_by_row_id_range():
    ps = load(str(SPARSE)).meta.ps
    words = next(k for k in ps.keys if k.key == WORDS)
    whole = pslite_bytes(ps, words, 4, 1)[0][1]
    two, three = pslite_bytes(ps, words, 4, 2), pslite_bytes(ps, words, 4, 3)
    assert [s for s, _, _ in two] == [0, 1] and sum(b for _, b, _ in two) == pytest.approx(whole)
    assert all(push == pull for _, push, pull in two + three)  # rows go both ways
    assert sum(b for _, b, _ in three) == pytest.approx(whole)
    ranges = np.mean([r for s, _, k, r in ps.rows if s == 4 and k == WORDS], axis=0)
    assert two[0][1] == pytest.approx(ranges[: ROW_RANGES // 2].sum() * 200)
    assert two[0][1] > 3 * two[1][1]  # Zipf's frequent words have the low ids: the first server's range
    dense = next(k for k in ps.keys if k.key == 1)  # a small dense key goes whole to one server
    assert pslite_bytes(ps, dense, 4, 2) == [(1 * 9973 % 2, 4.0 * dense.elements, 4.0 * dense.elements)]


def test_the_collector_counts_a_gradient_s_rows_per_row_id_range():
    class Indices:
        def __init__(self, rows):
            self.rows = np.asarray(rows)

        def asnumpy(self):
            return self.rows

    class Grad:
        def __init__(self, rows):
            self.indices = Indices(rows)

    class Param:
        shape = (8400, 16)

        def __init__(self, *grads):
            self.grads = [Grad(g) for g in grads]

        def list_grad(self):
            return self.grads

    one = _row_ranges(Param([0, 9, 10, 8399]))
    assert len(one) == ROW_RANGES and sum(one) == 4 and one[0] == 2 and one[1] == 1 and one[-1] == 1
    assert sum(_row_ranges(Param([1, 2, 30], [2, 30, 40]))) == 4  # a gradient on two devices is summed: its rows the union


def test_each_forward_waits_for_its_own_table_s_rows_and_the_pushes_are_acknowledged():
    g = build_ps_graph(load(str(SPARSE)))
    names = np.asarray(g.names)[g.name]
    pulled = np.flatnonzero(names == PULLED)
    assert len(pulled) == len(np.flatnonzero(names == PULL_ISSUE)) == 3 * 2 * 2  # steps x workers x row_sparse keys
    src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
    for v in pulled:
        consumers = g.succ[src == v]
        assert len(consumers) == 1 and g.node_name(int(consumers[0])).endswith(".Embedding")
        layer = g.layers[int(g.layer[consumers[0]])]
        key = next(k for k in g.meta.ps.keys if k.key == int(g.bucket[v]))
        assert layer == key.layer
    sparse_pushes = [n for n in set(names.tolist()) if n.startswith(f"key{WORDS} ")]
    assert any(" ack latency " in n for n in sparse_pushes) and not any(n.startswith(f"key{WORDS} s4 pull latency") for n in sparse_pushes)
    assert any(" pull ps0 serve " in n for n in sparse_pushes) and any(" pull ps1 serve " in n for n in sparse_pushes)


def test_the_profiled_run_replays_within_2_percent_and_the_what_ifs_move_the_right_way(tmp_path):
    p = open_run(str(copy_fixture(tmp_path, "mxnet/user_fasttext_sparse")))
    assert abs(p.analysis.error_pct) < 2.0
    rows = evaluate(p.graph, [Scenario(), Scenario(scheme=CollectiveSpec.parse("ps:1"))], measured_us=p.analysis.measured_us)
    assert abs(rows["model_error_pct"]) < 2.0
    g = p.graph
    measured, extra = g.meta.ps.row_pull_us, g.meta.ps_link_fit.row_pull_extra_us  # one record per pull: (step, worker, key, us)
    assert measured and {(x.step, x.worker, x.key) for x in extra} == {(x.step, x.worker, x.key) for x in measured}
    assert all(x.us > 0 for x in measured) and all(x.us >= 0 for x in extra)
    slow = set_link(g, current_topology(g).inter.bandwidth_bytes_per_s / 10)
    one, two = (job_iteration_us(set_scheme(slow, CollectiveSpec.parse(f"ps:{k}"))) for k in (1, 2))
    assert job_iteration_us(slow) > job_iteration_us(g) and two < one
    assert job_iteration_us(scale_workers(slow, 4)) > job_iteration_us(slow)


def test_a_run_whose_manifest_lacks_the_rows_is_refused_in_one_line(tmp_path):
    run = copy_fixture(tmp_path, "mxnet/user_fasttext_sparse")
    edit_json(run / "mxnet-run.json", lambda doc: doc.pop("rows"))
    load_refused(str(run), "row_sparse key 4", "no rows per step recorded", "profile the job again")


def test_a_sparse_gradient_on_a_dense_table_is_refused_in_one_line(tmp_path):
    """``Embedding(sparse_grad=True)``: Gluon pushes the rows and pulls the whole table; MXNet 1.9.1's servers abort on it."""
    run = copy_fixture(tmp_path, "mxnet/user_fasttext_sparse")
    edit_json(run / "mxnet-run.json", lambda doc: doc["keys"][WORDS].update(stype="default"))
    load_refused(str(run), "row_sparse gradient on a dense table", "SparseEmbedding")


def test_row_sparse_exchanges_in_a_run_that_names_no_row_sparse_key_are_refused_in_one_line(tmp_path):
    """A run recorded before the collector counted rows (``bench/frameworks/mx_sparse_mf.py`` then): refused, not read as
    dense exchanges (once an internal error: their pinned-memory thread was no lane)."""
    run = copy_fixture(tmp_path, "mxnet/user_mlp")

    def sparse(doc):  # a push-pull of the profiled steps (the middle one) becomes a row_sparse push
        pushes = [e for e in doc["traceEvents"] if e.get("name") == "KVStoreDistDefaultStoragePushPull" and e.get("ph") in ("B", "E")]
        k = next(k for k in range(len(pushes) // 2, len(pushes)) if pushes[k]["ph"] == "B")
        end = next(e for e in pushes[k + 1:] if e["ph"] == "E" and e["tid"] == pushes[k]["tid"])
        pushes[k]["name"] = end["name"] = "KVStoreDistRowSparsePush"

    edit_json(run / "worker0.json.gz", sparse)
    text = load_refused(str(run), "1 row_sparse pushes and pulls", "names no row_sparse key", "profile the job again")
    assert "worker0.json" in text


@pytest.mark.mxnet
def test_rerecord_the_row_sparse_script_from_scratch(tmp_path):
    """The fixture's script profiled now (needs ``DAGPROF_MXNET_PYTHON``): rows recorded for both tables, the run replayed
    within 5 % (a fresh run on a busy machine; the vendored one is held to 2 %). It missed once at 11.1 %, right after
    other frameworks' jobs, in 7 runs; 3 more profiles at load 13-18 (profiled steps 42-429 ms) replayed within 0.2 %:
    a burst of other jobs inside the 3-step window, which no profile of it can price, so a miss is profiled again once,
    and two misses fail the test (a fault of the model repeats; each try's error and load are in the message)."""
    import os
    import pathlib

    from dagprof.cli.main import main

    python = os.environ.get("DAGPROF_MXNET_PYTHON")
    if not python:
        pytest.skip("set DAGPROF_MXNET_PYTHON to a Python with mxnet 1.9 (and numpy<1.24) to profile an MXNet job")
    script = str(pathlib.Path(__file__).parents[1] / "bench" / "frameworks" / "mx_fasttext_sparse.py")
    tries = []
    for attempt in range(2):
        out = str(tmp_path / f"run{attempt}")
        assert main(["profile", "--mxnet-ps", "servers=1,workers=2", "-o", out, "--steps", "4:7", "--", python, script, "--steps", "10"]) == 0
        p = open_run(out)
        assert {k for _, _, k, _ in p.graph.meta.ps.rows} == {WORDS, BIGRAMS}
        assert p.graph.meta.ps.server_busy and all(b.waited_us >= 0 for b in p.graph.meta.ps.server_busy)  # its updater timed on the CPU clock
        tries.append((round(p.analysis.error_pct, 2), round(os.getloadavg()[0], 1)))
        if abs(p.analysis.error_pct) < 5.0:
            break
    assert abs(tries[-1][0]) < 5.0, f"replay error % and load of each try: {tries}"
