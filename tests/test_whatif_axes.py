"""The what-if axes are one table (``search.scenario.AXES``): the Scenario, the CLI flags, the sweep and the columns follow it."""
import argparse
from dataclasses import fields

from dagprof.cli import cmd_whatif
from dagprof.search.scenario import AXES, PASSES, Scenario, sweep


def test_every_scenario_field_is_one_axis_with_its_pass_in_the_order():
    assert [a.name for a in AXES] == [f.name for f in fields(Scenario)]
    assert len({a.flag for a in AXES}) == len(AXES) and all(a.apply in PASSES for a in AXES)
    assert list(Scenario().label()) == [a.name for a in AXES]


def test_the_cli_flags_and_the_sweep_come_from_the_table():
    p = argparse.ArgumentParser()
    cmd_whatif.add_arguments(p)
    args = p.parse_args(["run", "--bandwidth", "10Gbit,200Mbit", "--latency", "5", "--compute-speed", "2", "--reshard-after-forward", "on,off"])
    rows = sweep({a.name: getattr(args, a.name) for a in AXES})
    assert [(s.bandwidth, s.reshard_after_forward) for s in rows] == [("10Gbit", True), ("10Gbit", False), ("200Mbit", True), ("200Mbit", False)]
    assert {(s.latency_us, s.compute_speed, s.workers) for s in rows} == {(5.0, 2.0, None)}
    assert rows[0].label() == {**dict.fromkeys(a.name for a in AXES), "bandwidth": "10Gbit", "latency_us": 5.0, "compute_speed": 2.0,
                                 "reshard_after_forward": "on"}
