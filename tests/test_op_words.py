"""The ops on the critical path in words (``analysis.critical_path.op_words``): ``other:forward`` and ``all_gather <root>``
were printed as the graph names its nodes. The text, the report and the findings say them as a person reads them;
``--json`` keeps ``top_ops_ms`` as it was and adds ``top_ops_words`` beside it."""
from __future__ import annotations

import json

from testdata import DATA

from dagprof.analysis.critical_path import op_words
from dagprof.cli.main import main

FSDP4 = DATA / "fsdp" / "fsdp4"  # its path's largest ops: reduce_scatter <root>, optimizer.step, all_gather <root>, ...
ACCUM = DATA / "ddp-fresh" / "accum"  # its path holds DDP buckets 0 and 1, each as its collective and as its host call


def test_labels_in_words() -> None:
    assert op_words("other:forward") == "forward between timed layers"
    assert op_words("other:pre-forward") == "host work before forward (untimed)"
    assert op_words("other:later") == "later (untimed)"
    assert op_words("all_gather <root>") == "all_gather (root module)"
    assert op_words("all_gather blocks.1 (prefetched by <root>)") == "all_gather blocks.1 (prefetched by the root module)"
    assert op_words("forward layers.0.msg") == "forward layers.0.msg" and op_words("all-reduce bucket 4") == "all-reduce bucket 4"


def test_analyze_says_words_and_json_keeps_the_labels(capsys) -> None:
    assert main(["analyze", "--json", str(FSDP4)]) == 0
    cp = json.loads(capsys.readouterr().out)["critical_path_per_iter"]
    labels = [name for name, _ in cp["top_ops_ms"]]
    assert "all_gather <root>" in labels and cp["top_ops_words"] == [op_words(n) for n in labels]
    assert main(["analyze", str(FSDP4)]) == 0
    text = capsys.readouterr().out
    assert "all_gather (root module)" in text and "reduce_scatter (root module)" in text and "<root>" not in text


def test_a_buckets_host_call_is_not_its_collective_twice(capsys) -> None:
    """A DDP bucket's host call (``allreduce bucket 0``, the COMM_ENQUEUE node) was printed beside its collective
    ("all-reduce bucket 0") as if one op were listed twice (stop 66's fresh SimSiam: 13.6 and 8.2 ms a step)."""
    assert op_words("allreduce bucket 3") == "issuing all-reduce bucket 3 (host call)"
    assert op_words("allgather sparse bucket 1") == "issuing all-gather sparse bucket 1 (host call)"
    assert main(["analyze", "--json", str(ACCUM)]) == 0
    cp = json.loads(capsys.readouterr().out)["critical_path_per_iter"]
    labels = [name for name, _ in cp["top_ops_ms"]]
    assert {"allreduce bucket 0", "all-reduce bucket 0"} <= set(labels)  # the labels stay the graph's node names
    words = cp["top_ops_words"]
    assert "issuing all-reduce bucket 0 (host call)" in words and "all-reduce bucket 0" in words
    assert "allreduce bucket 0" not in words
