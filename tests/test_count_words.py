"""Every count dagprof prints takes its noun in the right number (``units.count``): "1 bucket", "2 buckets"."""
from dagprof.units import count


def test_count_spells_one_and_many():
    assert [count(1, "bucket"), count(2, "bucket"), count(0, "row"), count(1.5, "collective"), count(1.0, "step")] == [
        "1 bucket", "2 buckets", "0 rows", "1.5 collectives", "1 step"]
    assert count(1, "micro-batch", "micro-batches") == "1 micro-batch" and count(3, "micro-batch", "micro-batches") == "3 micro-batches"
