"""A JAX job's all-gathers on a line of their own where no other kind shows a slope of its own (issue 21,
``passes.link_fit.gathers_own_line``).

``tf-jax/fsdp-conv-500m`` (``bench/frameworks/jax_fsdp_conv.py`` on the testbed's shaped loopback at 500 Mbit/s; its
200 Mbit/s job measured a median step of 168.06 ms): one 378 kB all-reduce and one 4 kB all-to-all a micro-batch beside
13 all-gathers of 20 B-288 kB, whose nodes end with their first rank out. Through the one line fitted to every kind the
288 kB all-gathers were priced as a whole transfer (0.56 of it measured), the rest kept as fixed time, and 200 Mbit/s
came out +9.3 %."""
from __future__ import annotations

import os
import sys

from testdata import DATA, at_testbed_wire

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from shaped_loopback import predict_rate  # noqa: E402

from dagprof.passes.link_fit import fit_topology, gathers_own_line, link_fit, profiled_comm, wire_floor  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.traces.events import CommKind  # noqa: E402

RUN = DATA / "tf-jax" / "fsdp-conv-500m"
MEASURED_200M_MS = 168.06  # the same round's 200 Mbit/s job, median step (``bench_frameworks.py --testbed``, ``measured``)


def test_the_gathers_cost_on_their_own_line_the_rest_on_their_kinds():
    g = at_testbed_wire(RUN, 5e8)
    fit = link_fit(g)
    assert fit.apart and fit.gathers is not None
    kinds = dict(fit_topology(g, fit).kinds)
    wire = wire_floor(g)
    assert kinds["all_gather"] == fit.gathers
    assert 0.3 < fit.gathers.beta_us_per_byte / wire < 0.7  # a share of their transfer: the first rank's half (0.48)
    assert fit.gathers.alpha_us > 0  # their 20 B-4 kB ones' latency, on their own line
    assert kinds["all_reduce"].beta_us_per_byte >= wire  # the rest at their own kinds' time, the wire their floor
    # the one line's stalls stay on the other kinds, the gathers' own line's on them
    comm = profiled_comm(g)
    gat = g.comm_kind[comm] == CommKind.ALL_GATHER
    assert fit.stalls is not None and (fit.stalls[gat] > 0).any() and (fit.stalls[~gat] > 0).any()


def test_a_slower_wire_is_predicted_within_3_percent():
    got = predict_rate(str(RUN), 5e8, 200e6)
    assert abs(got["model_median_pct"]) < 2.0  # before: +1.9 %; now -0.4
    assert abs(got["predicted_median_ms"] / MEASURED_200M_MS - 1) < 0.03  # before: +9.3 %; now +0.4


def test_only_where_no_other_kind_shows_a_slope():
    late = at_testbed_wire(DATA / "tf-jax" / "zero-rs-late")  # its reduce-scatters show a slope: ``gathers_apart``, as before
    assert link_fit(late).apart and link_fit(late).gathers is None
    weak = open_run(DATA / "tf-jax" / "fsdp-conv").graph  # the unshaped loopback: the one line tells nothing, nothing refined
    assert link_fit(weak).weak is not None and link_fit(weak).gathers is None
    assert gathers_own_line(weak, link_fit(weak)) is None
    assert link_fit(open_run(DATA / "ddp-testbed" / "run").graph).gathers is None  # not JAX
