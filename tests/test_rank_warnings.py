"""A warning every rank gives alike is said once, naming the ranks, its figures as their range (traces.rank_warnings)."""
from __future__ import annotations

import json

from testdata import DATA, folded_lines

from dagprof.cli.main import main
from dagprof.traces.rank_warnings import merge_rank_warnings, merged_figures

POINTNET = DATA / "fsdp-fresh" / "pointnet2-eval"  # 4-rank HSDP, an evaluation pass in step 5 of 5-9 on every rank


def test_four_ranks_evaluation_pass_is_one_line_in_text_json_and_report(tmp_path, capsys):
    """Was four lines (``rank0.json: ... over 288 of those steps' 2985 ms`` ... ``rank3.json``): one, the ranks named,
    each figure the range of the ranks' own; the four lines kept in ``--json``."""
    assert main(["analyze", str(POINTNET)]) == 0
    said = [line for line in folded_lines(capsys.readouterr().out, "warning: ") if "under torch.no_grad" in line]
    assert len(said) == 1 and said[0].startswith("warning: ranks 0-3: 1 of 5 profiled steps (step 5) ran 26 layer forwards")
    assert "over 283-309 of those steps' 2847-2985 ms" in said[0]
    assert main(["analyze", str(POINTNET), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    (line,) = [w for w in r["warnings"] if "under torch.no_grad" in w]
    assert sum("torch.distributed calls of the job's own" in w for w in r["warnings"]) == 1  # the job-wide one untouched
    own = r["warnings_per_rank"][line]
    assert [w.split(":")[0] for w in own] == [f"rank{k}.json" for k in range(4)]
    assert "over 288 of those steps' 2985 ms" in own[0] and "over 309 of those steps' 2847 ms" in own[1]
    assert main(["report", str(POINTNET), "-o", str(tmp_path / "out")]) == 0
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.count("under torch.no_grad") == 1 and "ranks 0-3: 1 of 5 profiled steps" in html


def test_only_lines_alike_but_for_rank_and_figures_merge():
    texts = ["rank 0: 17 profiler sessions; the newest is read", "a job-wide line 3",
             "rank 2: 16 profiler sessions; the newest is read", "rank 1: 4 leading collectives left unmatched",
             "rank0.json: 1,180 ms in 2 steps", "rank1.json: 1,176 ms in 2 steps", "rank0.kineto.json.gz: 1,176 ms in 2 steps"]
    out, detail = merge_rank_warnings(texts)
    assert out == ["ranks 0, 2: 16-17 profiler sessions; the newest is read", "a job-wide line 3",
                   "rank 1: 4 leading collectives left unmatched", "ranks 0-1: 1,176-1,180 ms in 2 steps",
                   "rank0.kineto.json.gz: 1,176 ms in 2 steps"]
    assert detail == {out[0]: [texts[0], texts[2]], out[3]: texts[4:6]}
    assert merge_rank_warnings(["rank 0: x 1", "rank 0: x 2"])[0] == ["rank 0: x 1", "rank 0: x 2"]  # one rank: as said


def test_figures_keep_their_decimals():
    assert merged_figures(["12283 ms, 1.50 s", "12285 ms, 1.25 s", "other 7"]) == [
        "12283-12285 ms, 1.25-1.50 s", "12283-12285 ms, 1.25-1.50 s", "other 7"]
