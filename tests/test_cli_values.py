"""A rate, size or count flag given a negative, zero or unreadable value: one line naming the flag and the value, exit 2.

Values that start with "-" were the trap: argparse takes only plain negative numbers (-5) for values, and answered
``--bandwidth -1Gbit`` (or ``--latency -1e3``, ``--workers -1,2``) "expected one argument" without saying what was given.
"""
import pytest
from testdata import DATA

from dagprof.cli.main import main

RUN = str(DATA / "run_schema" / "v1")  # never read: each value is refused before the run is opened

CASES = [  # (argv, the flag the line names, the value it quotes)
    (["whatif", RUN, "--bandwidth", "-1Gbit"], "--bandwidth", "-1Gbit"),
    (["whatif", RUN, "--bandwidth", "0Gbit"], "--bandwidth", "0Gbit"),
    (["whatif", RUN, "--bandwidth", "fast"], "--bandwidth", "fast"),
    (["whatif", RUN, "--bandwidth", "-x"], "--bandwidth", "-x"),
    (["whatif", RUN, "--bandwidth", "10Gbit,-1Gbit"], "--bandwidth", "-1Gbit"),
    (["whatif", RUN, "--profiled-bandwidth", "-1Gbit"], "--profiled-bandwidth", "-1Gbit"),
    (["whatif", RUN, "--latency", "x"], "--latency", "x"),
    (["whatif", RUN, "--latency", "-1e3"], "--latency", "-1e3"),
    (["whatif", RUN, "--workers", "0"], "--workers", "0"),
    (["whatif", RUN, "--workers", "-1,2"], "--workers", "-1"),
    (["whatif", RUN, "--bucket-mb", "-5"], "--bucket-mb", "-5"),
    (["whatif", RUN, "--first-bucket-mb", "-0.5"], "--first-bucket-mb", "-0.5"),
    (["whatif", RUN, "--compute-speed", "-2"], "--compute-speed", "-2"),
    (["whatif", RUN, "--cores", "0"], "--cores", "0"),
    (["optimize", RUN, "--memory-budget", "-5MB"], "--memory-budget", "-5MB"),
    (["optimize", RUN, "--emulate", "-1Gbit", "--ranks", "2"], "--emulate", "-1Gbit"),
    (["optimize", RUN, "--powersgd-ranks", "-2,4"], "--powersgd-ranks", "-2"),
    (["optimize", RUN, "--budget", "-1"], "--budget", "-1"),
    (["optimize", RUN, "--accumulate", "0"], "--accumulate", "0"),
    (["diff", RUN, RUN, "--top", "-3"], "--top", "-3"),
    (["demo", "--ranks", "0"], "--ranks", "0"),
    (["demo", "--rounds", "-1"], "--rounds", "-1"),
    (["demo", "--link", "-1Gbit"], "--link", "-1Gbit"),
    (["calibrate", "--max-mb", "-1"], "--max-mb", "-1"),
    (["calibrate", "--world", "0"], "--world", "0"),
    (["replay", RUN, "--explain-threshold", "-1"], "--explain-threshold", "-1"),
    (["analyze", RUN, "--max-trace-bytes", "0"], "--max-trace-bytes", "0"),
]


@pytest.mark.parametrize("argv, flag, value", CASES, ids=[" ".join(c[0][2 if c[0][1] == RUN else 1:]) for c in CASES])
def test_a_bad_value_is_one_line_naming_flag_and_value(capsys, argv, flag, value):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert flag in err and repr(value) in err, err


def test_a_bad_rate_is_refused_before_the_layer_file_is_priced(capsys, tmp_path):
    f = tmp_path / "net.csv"
    f.write_text("layer,forward_us,backward_us,grad_bytes\nfc,100,200,4096\n")
    for rate in ("-1Gbit", "0Gbit"):
        assert main(["sgd", str(f), "--net", rate]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--net" in err and repr(rate) in err and "positive" in err, err


def test_a_flag_missing_its_value_is_not_given_the_next_flag(capsys):
    """``--bandwidth --json``: the value is missing, not "--json"; the one line (a JSON object with --json) says so."""
    assert main(["whatif", RUN, "--bandwidth", "--json"]) == 2
    out, err = capsys.readouterr()
    assert "expected one argument" in err and "got" not in err and '"error"' in out
