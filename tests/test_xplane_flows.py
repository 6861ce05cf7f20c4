"""``traces.xplane_flows``: which op a pool task's first op depends on, on hand-made scheduling records."""
import numpy as np

from dagprof.traces.events import Kind
from dagprof.traces.xplane_flows import POOL, Line, schedule


def test_a_task_scheduled_from_a_task_resolved_earlier_takes_its_answer():
    """``tf-jax/lstm-lm-jit`` rank 0: XLA's thread ran ``dot.20`` (A), then a task with no op of its own (T99) scheduled
    the all-reduce's task (T101), which scheduled the next ``ynn_fusion.1`` (T102, on the other thread) before its own
    first op began. Both T101 and T102 consume contexts (so each is resolved on its own, T101 first); T102 was refused
    T101's answer as already explored, got no flow, and its op waited 11.5 ms as a gap for its thread's previous op."""
    main, one, two = 0, 1, 2
    lines = {main: Line(records=[(-1.0, (POOL, 0))]),
             one: Line(records=[(0.5, (POOL, 99)), (2.0, (POOL, 101)), (3.5, (POOL, 102))],
                       tasks=[(0.0, 0.9, (POOL, 0)), (1.0, 3.0, (POOL, 99)), (3.0, 30.0, (POOL, 101))],
                       consumers=[(5.0, 6.0, (0, 7))]),
             two: Line(tasks=[(5.0, 10.0, (POOL, 102))], consumers=[(5.5, 5.6, (0, 8))])}
    start, end = np.array([0.1, 4.0, 6.0]), np.array([0.4, 29.0, 9.0])  # A on one, C (T101's) on one, D (T102's) on two
    nodes = {one: (start[:2], np.array([0, 1])), two: (start[2:], np.array([2]))}
    kind = np.full(3, int(Kind.OTHER), dtype=np.int8)
    flows = schedule(lines, nodes, main, start, end, kind, np.zeros(3, dtype=np.int32)).flows
    assert sorted(flows) == [(0, 1), (0, 2)]
