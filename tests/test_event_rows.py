"""``EventRows``, the one builder of every reader's event table: rows one at a time and in blocks keep their order,
names are interned once, written columns reach the table, and extending a table leaves it as it was."""
import numpy as np
import pytest

from dagprof.traces.events import EventRows, EventTable, Kind


def test_rows_and_blocks_in_order_with_defaults():
    rows = EventRows()
    a = rows.add("step", Kind.STEP, 0, 0.0, 10.0, depth=-1, step=3)
    block = rows.add_block(name=np.array([rows.intern("conv"), rows.intern("step")]), kind=np.array([Kind.FORWARD] * 2),
                           lane=np.zeros(2), start=np.array([1.0, 2.0]), dur=np.array([1.0, 1.0]))
    b = rows.add("conv", Kind.BACKWARD, 1, 5.0, 2.0, nbytes=8)
    assert (a, block.tolist(), b) == (0, [1, 2], 3)
    rows.columns()["seq"][1] = 7  # a value known once every row is read
    rows.flows += [(1, 3)]
    t = rows.table()
    assert t.names == ["step", "conv"]
    assert t.name.tolist() == [0, 1, 0, 1] and t.seq.tolist() == [-1, 7, -1, -1] and t.nbytes.tolist() == [0, 0, 0, 8]
    assert t.depth.tolist() == [-1, 0, 0, 0] and t.step.tolist() == [3, -1, -1, -1]
    assert all(getattr(t, c).dtype == getattr(EventTable.empty(), c).dtype for c in EventTable.COLUMNS)
    assert rows.flow_array().tolist() == [[1, 3]]
    with pytest.raises(TypeError, match="not optional event columns"):
        rows.add("x", Kind.OTHER, 0, 0.0, 1.0, bytes=3)


def test_extending_copies_and_rename():
    base = EventTable.from_columns(["ddp wait"], name=[0], kind=[Kind.COMM_WAIT], lane=[0], start=[0.0], dur=[1.0])
    rows = EventRows.extending(base, np.array([[0, 0]]))
    rows.rename("ddp wait", "sync wait")
    rows.columns()["dur"][0] = 0.5
    rows.add("sync wait", Kind.COMM_WAIT, 0, 2.0, 1.0)
    t = rows.table()
    assert base.dur.tolist() == [1.0] and base.names == ["ddp wait"]
    assert t.names == ["sync wait"] and t.name.tolist() == [0, 0] and t.dur.tolist() == [0.5, 1.0]
    assert rows.flows == [(0, 0)]
    with pytest.raises(ValueError, match="names rows already"):
        rows.rename("x", "sync wait")
