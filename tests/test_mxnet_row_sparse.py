"""MXNet row_sparse exchanges (``gluon.contrib.nn.SparseEmbedding`` under ``dist_sync``, ``bench/frameworks/mx_sparse_mf.py``):
``KVStoreDistRowSparsePush``/``Pull`` on the pinned-memory thread. The reader stopped on them with an internal error
(``ValueError: (2, ...) is not in list``: that thread was no lane); they are refused in one line that says why."""
import pytest
from testdata import copy_fixture, edit_json

from dagprof.errors import DagprofError
from dagprof.traces.load import load


def test_row_sparse_pushes_are_refused_in_one_line(tmp_path):
    run = copy_fixture(tmp_path, "mxnet/user_mlp")

    def sparse(doc):  # a push-pull of the profiled steps (the middle one) becomes a row_sparse push
        pushes = [e for e in doc["traceEvents"] if e.get("name") == "KVStoreDistDefaultStoragePushPull" and e.get("ph") in ("B", "E")]
        k = next(k for k in range(len(pushes) // 2, len(pushes)) if pushes[k]["ph"] == "B")
        end = next(e for e in pushes[k + 1:] if e["ph"] == "E" and e["tid"] == pushes[k]["tid"])
        pushes[k]["name"] = end["name"] = "KVStoreDistRowSparsePush"

    edit_json(run / "worker0.json.gz", sparse)
    with pytest.raises(DagprofError, match=r"1 row_sparse pushes and pulls .* are not modelled: how many rows each carries") as err:
        load(str(run))
    assert "worker0.json" in str(err.value) and "\n" not in str(err.value)
