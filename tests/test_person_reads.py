"""What a person reads in the report's what-if table and the link's line: words, one point per row, no exponent."""
from dagprof.analysis.interval import PredictionInterval
from dagprof.report.html import whatif_table
from dagprof.units import figure

ROW = {"workers": 2, "bandwidth": "1Gbit", "compute_speed": None, "predicted_iter_ms": 912.58, "interval": "882 ms (730-1,229, 90 %)",
       "speedup_vs_profiled": 0.94, "scaling_efficiency": 0.88}


def test_whatif_table_has_one_point_a_row_and_heads_in_words():
    html = whatif_table([ROW])
    assert "882 ms (730-1,229, 90 %)" in html and "912.58" not in html  # the interval's point, not the mean beside it
    assert "<th>predicted step</th>" in html and "<th>compute speed</th>" in html and "<th>scaling efficiency</th>" in html
    assert not any(k in html for k in ("predicted_iter_ms", "speedup_vs_profiled", "scaling_efficiency", "lo_ms", "level"))


def test_figures_read_as_written_one_way():
    """The link's microseconds and an interval's milliseconds were written by two formatters that differed below 100."""
    assert [figure(v) for v in (1840.2, 0.0, 12.46, 250.0, 1.234, 0.123, -1840.2)] == \
        ["1,840", "0.00", "12.5", "250", "1.23", "0.12", "-1,840"]
    assert PredictionInterval(811_400.0, 719_000.0, 1_126_000.0).text() == "811 ms (719-1,126, 90 %)"
