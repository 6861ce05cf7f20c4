"""Layer-wise profile readers: B-Caffe logs, the layer CSV, dagprof runs; bad input names file and line."""
from __future__ import annotations

import pytest
from testdata import DATA as TESTDATA

from dagprof.errors import DagprofError
from dagprof.traces.events import EventTable, Kind, Lane, LaneKind, RankTrace, Run
from dagprof.traces.layerwise import layer_profile_from_run, read_bcaffe_log, read_layer_csv, read_layer_file

DATA = TESTDATA / "bcaffe-k80-googlenet"


@pytest.mark.parametrize("name, workers", [("tmp2comm.log", 2), ("tmp4comm.log", 4), ("tmp8comm.log", 8), ("tmp4ocomm.log", 4), ("tmp8ocomm.log", 8),
                                           ("tmpcomm.log", None)])
def test_bcaffe_googlenet_logs(name, workers):
    prof = read_layer_file(DATA / name)
    assert prof.meta.blobs == 128 and prof.num_layers == 64
    assert prof.meta.params == 13_379_136 and prof.params_bytes == 4 * 13_379_136
    assert prof.workers == workers and prof.forward_us is None
    assert prof.grad_bytes[0] == 4 * (9408 + 64)  # conv1 weight + bias
    assert prof.backward_us.sum() > 150_000 and prof.allreduce_us.sum() > 100_000


def test_bcaffe_uses_the_last_dump():
    prof = read_bcaffe_log(DATA / "tmp8comm.log")
    assert prof.meta.first_line == 129
    assert prof.backward_us[0] == pytest.approx(15143.7)
    assert prof.allreduce_us[-1] == pytest.approx(24282 + 0)


def test_bcaffe_merged_groups():
    prof = read_bcaffe_log(DATA / "tmp8ocomm.log")
    groups = prof.meta.merged_groups
    assert len(groups) == 30 and groups[0] == (63, 64, 18092.0)  # backward order: the classifier first
    assert sum(us for *_, us in groups) == pytest.approx(277154.0)
    assert [lo for lo, *_ in groups] == sorted({lo for lo, *_ in groups}, reverse=True)
    assert read_bcaffe_log(DATA / "tmp2comm.log").meta.merged_groups is None  # 4-column log


def test_bcaffe_warmup_only_is_refused(tmp_path):
    f = tmp_path / "tmp2comm.log"
    f.write_text("".join(f"I0219 13:29:27.1 66221 distributed.cpp:112] [{i}, 10, 0, 0]\n" for i in range(4)))
    with pytest.raises(DagprofError, match=r"tmp2comm\.log: line 1: .*warm-up"):
        read_bcaffe_log(f)


def test_bcaffe_malformed_lines_name_the_line(tmp_path):
    good = "I0 1 distributed.cpp:112] [{i}, 10, 5, 3]\n"
    f = tmp_path / "tmp2comm.log"
    f.write_text(good.format(i=0) + good.format(i=1) + "I0 1 distributed.cpp:112] [2, 10, oops, 3]\n" + good.format(i=3))
    with pytest.raises(DagprofError, match=r"line 3: compute_time 'oops' is not a number"):
        read_bcaffe_log(f)
    f.write_text(good.format(i=0) + good.format(i=1) + "garbage\n")
    with pytest.raises(DagprofError, match="line 3: not a B-Caffe"):
        read_bcaffe_log(f)
    f.write_text(good.format(i=0) + good.format(i=2))
    with pytest.raises(DagprofError, match="line 2: blob id 2 does not follow"):
        read_bcaffe_log(f)
    f.write_text(good.format(i=0) + "I0 1 distributed.cpp:112] [1, 10, 6, 3]\n")
    with pytest.raises(DagprofError, match="line 1: blobs of one layer disagree"):
        read_bcaffe_log(f)


CSV = """# a hand-written profile
# io_us=100, h2d_us=20, update_us=30, workers=4
layer,forward_us,backward_us,grad_bytes,allreduce_us
conv1,10,20,4000,5
fc,1.5,3,400,2.5
"""


def test_layer_csv(tmp_path):
    f = tmp_path / "net.csv"
    f.write_text(CSV)
    prof = read_layer_file(f)
    assert prof.names == ["conv1", "fc"]
    assert prof.forward_us.tolist() == [10, 1.5] and prof.backward_us.tolist() == [20, 3]
    assert prof.grad_bytes.tolist() == [4000, 400] and prof.allreduce_us.tolist() == [5, 2.5]
    assert (prof.io_us, prof.h2d_us, prof.update_us, prof.workers) == (100, 20, 30, 4)


def test_layer_csv_minimal_columns_any_order(tmp_path):
    f = tmp_path / "net.csv"
    f.write_text("grad_bytes,layer,backward_us\n8,a,1\n")
    prof = read_layer_csv(f)
    assert prof.forward_us is None and prof.allreduce_us is None and prof.grad_bytes.tolist() == [8]


@pytest.mark.parametrize(
    "text, message",
    [
        ("layer,backward_us\na,1\n", r"line 1: header needs .*missing grad_bytes"),
        ("layer,backward_us,grad_bytes,speed\n", r"line 1: .*unknown column speed"),
        ("layer,backward_us,grad_bytes\na,1,2\nb,x,2\n", r"line 3: backward_us 'x' is not a number"),
        ("layer,backward_us,grad_bytes\na,1,2\nb,1\n", r"line 3: 2 cells, header has 3"),
        ("layer,backward_us,grad_bytes\na,1,2.5\n", r"line 2: grad_bytes '2.5' is not an integer"),
        ("layer,backward_us,grad_bytes\na,-1,2\n", r"line 2: backward_us must be a number from 0 to 1e12"),
        ("layer,backward_us,grad_bytes\na,1,2\na,1,2\n", r"line 3: layer name 'a' repeats line 2"),
        ("# io_us=1, speed=3\nlayer,backward_us,grad_bytes\na,1,2\n", r"line 1: unknown setting 'speed'"),
        ("# just a comment\nlayer,backward_us,grad_bytes\n", r"no layer rows"),
    ],
)
def test_layer_csv_errors_name_file_and_line(tmp_path, text, message):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(DagprofError, match=message) as err:
        read_layer_file(f)
    assert str(err.value).startswith(str(f))


def test_missing_file_is_a_dagprof_error(tmp_path):
    with pytest.raises(DagprofError, match="no such file"):
        read_layer_file(tmp_path / "nope.csv")


def hand_run() -> Run:
    """Two steps of a 2-layer model on rank 0: F0 F1 B1 B0 U per step, plus the step markers."""
    names = ["ProfilerStep#0", "fw.a", "fw.b", "bw.b", "bw.a", "optimizer.step", "dataloader"]
    rows = []  # (name, kind, start, dur, step, layer, nbytes)
    for step, t0 in ((0, 0.0), (1, 100.0)):
        rows += [
            (0, Kind.STEP, t0, 90.0, step, -1, 0),
            (6, Kind.DATA, t0, 4.0, step, -1, 0),
            (1, Kind.FORWARD, t0 + 5, 10.0 + step, step, 0, 0),
            (2, Kind.FORWARD, t0 + 20, 5.0, step, 1, 0),
            (3, Kind.BACKWARD, t0 + 30, 10.0, step, 1, 4096),
            (4, Kind.BACKWARD, t0 + 45, 20.0 + 2 * step, step, 0, 1024),
            (5, Kind.UPDATE, t0 + 70, 6.0, step, -1, 0),
        ]
    cols = list(zip(*rows))
    ev = EventTable.from_columns(names, name=cols[0], kind=cols[1], lane=[0] * len(rows), start=cols[2], dur=cols[3], step=cols[4], layer=cols[5],
                                 nbytes=cols[6])
    trace = RankTrace(rank=0, world_size=2, source="hand-made", events=ev, lanes=[Lane("main", LaneKind.CPU_THREAD, True)], layers=["a", "b"])
    return Run([trace], source="hand-made")


def test_layer_profile_from_run():
    prof = layer_profile_from_run(hand_run())
    assert prof.names == ["a", "b"]
    assert prof.forward_us.tolist() == [10.5, 5.0]  # median of 10 and 11
    assert prof.backward_us.tolist() == [21.0, 10.0]
    assert prof.grad_bytes.tolist() == [1024, 4096]
    assert (prof.io_us, prof.update_us, prof.iter_us, prof.workers) == (4.0, 6.0, 95.0, 2)  # start to start: 100, then the last step 90


def test_layer_profile_from_run_without_layer_events():
    run = hand_run()
    run.ranks[0].events.layer[:] = -1
    with pytest.raises(DagprofError, match="no per-layer FORWARD/BACKWARD"):
        layer_profile_from_run(run)
