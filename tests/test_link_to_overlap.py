"""``whatif --link-from A --link-to B`` with ``calibrate --overlap`` files: the compute slowdown beside collectives that the
profile's op times lose is A's (the profiled link's), the one each ``--link-to`` row's timeline takes is B's
(``search.scenario.beside``): on the testbed's 4 DP x TP ranks over 2 cores calibrate measured 0.66 at 1 Gbit/s and 1.36 at
200 Mbit/s beside a 1 MiB all-reduce, where one link's figure weighted by bytes per second prices 200 Mbit/s lower.
The calibrations are tests/data/fsdp/testbed-calibrate's, each given the overlap table of a testbed file
(tests/data/ddp-testbed): the mechanics, not those links' figures."""
from __future__ import annotations

import json

from testdata import DATA

from dagprof.cli.main import main
from dagprof.search.measured import slowdown_of
from dagprof.search.scenario import Cluster, Scenario, beside

CAL = DATA / "fsdp" / "testbed-calibrate"


def with_overlap(tmp_path, name: str, calibration: str, overlap: str) -> str:
    doc = json.loads((CAL / calibration).read_text())
    doc["overlap"] = json.loads((DATA / "ddp-testbed" / overlap).read_text())["overlap"]
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_link_to_row_takes_its_own_links_slowdown(tmp_path):
    fast = with_overlap(tmp_path, "fast.json", "1gbit.json", "1gbit-overlap.json")
    slow = with_overlap(tmp_path, "slow.json", "200mbit.json", "unshaped-overlap.json")
    s0, r0 = slowdown_of(None, fast)
    c = Cluster(link_from=fast, slowdown=s0, comm_rate=r0)
    row = beside(c, Scenario(link_to=slow))
    assert (row.slowdown, row.comm_rate) == slowdown_of(None, slow) and row.slowdown > s0 > 0
    assert beside(c, Scenario(bandwidth="200Mbit")) is c  # a rate what-if keeps the profiled link's
    assert beside(c, Scenario(link_to=str(CAL / "200mbit.json"))) is c  # the row's link measured none: the profiled link's
    assert beside(Cluster(link_from=str(CAL / "1gbit.json")), Scenario(link_to=slow)).slowdown == 0.0  # none taken out, none put in


def test_whatif_charges_the_target_links_slowdown(tmp_path, capsys):
    """The testbed's DDP profile at 1 Gbit/s (its buckets' all-reduces beside the backward), to the unshaped link: the same
    row priced with the unshaped file's own slowdown against that file given the 1 Gbit/s file's."""
    testbed = DATA / "ddp-testbed"
    fast, slow = str(testbed / "1gbit-overlap.json"), str(testbed / "unshaped-overlap.json")
    doc = json.loads((testbed / "unshaped-overlap.json").read_text())
    same = tmp_path / "same.json"
    same.write_text(json.dumps(doc | {"overlap": json.loads((testbed / "1gbit-overlap.json").read_text())["overlap"]}))
    args = ["whatif", str(testbed / "run"), "--template", "--no-trace", "--allow-model-error", "--json", "--link-from", fast, "--link-to"]
    got = {}
    for target in (str(same), slow):
        assert main(args + [target]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["overlap_slowdown"] == slowdown_of(None, fast)[0]
        got[target] = out["scenarios"][0]["predicted_iter_ms"]
    assert got[slow] != got[str(same)]
