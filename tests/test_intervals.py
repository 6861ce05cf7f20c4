"""``dagprof.intervals``: the one union of time intervals the reader and the analyses share."""
import numpy as np

from dagprof.intervals import covered, length, overlaps, union


def test_union_merges_overlapping_and_touching_drops_empty():
    start = np.array([5.0, 0.0, 2.0, 8.0, 10.0, 20.0])
    end = np.array([8.0, 3.0, 4.0, 9.0, 12.0, 20.0])  # [8, 9) touches [5, 8); [20, 20) is empty
    assert union(start, end).tolist() == [[0.0, 4.0], [5.0, 9.0], [10.0, 12.0]]
    assert covered(start, end) == 10.0


def test_union_nested_and_empty_input():
    assert union(np.array([0.0, 1.0]), np.array([10.0, 2.0])).tolist() == [[0.0, 10.0]]
    none = union(np.zeros(0), np.zeros(0))
    assert none.shape == (0, 2) and length(none) == 0.0 and covered(np.zeros(0), np.zeros(0)) == 0.0


def test_overlaps_per_query():
    iv = np.array([[0.0, 4.0], [5.0, 9.0], [10.0, 12.0]])
    a, b = np.array([-2.0, 3.0, 4.5, 11.0, 13.0, 6.0]), np.array([-1.0, 11.0, 5.0, 20.0, 14.0, 6.0])
    assert overlaps(iv, a, b).tolist() == [0.0, 6.0, 0.0, 1.0, 0.0, 0.0]
    assert overlaps(np.zeros((0, 2)), a, b).tolist() == [0.0] * 6
