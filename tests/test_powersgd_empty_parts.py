"""PowerSGD's empty all-reduces on a real embedding job (tests/data/powersgd-ctr: the CTR ranker of
``bench/replicate_fresh/ctr_small_buckets.py`` under replicate(), 12 EmbeddingBag tables of 2,000 x 32, no bias, at 200
Mbit/s on the namespace testbed; its searched profile of the defaults, the strategy the search found, its codec costs).

torch's hook issues three all-reduces a bucket even where a part is empty; a bucket of tables alone has no uncompressed
tensor, one of vectors alone no P or Q. An empty one never waits for the peer (0.15-0.28 ms from its issue to the next in
the strategy runs, its callback's CPU in it, against 1.5-8.8 ms for a non-empty one). Where the chained latency was not
measured (no ``calibrate --overlap``), a PowerSGD strategy's search says so, with the count of those carrying data."""
import pytest
from testdata import DATA

from dagprof.closeloop import find_strategy
from dagprof.collect.deploy.strategy import load_strategy
from dagprof.costmodel.codecs import CodecCosts
from dagprof.passes.compression import nonempty_allreduces, powersgd_parts
from dagprof.passes.gradients import gradient_order
from dagprof.pipeline import open_run
from dagprof.search.optimize import Options

RUN = DATA / "powersgd-ctr"


@pytest.fixture(scope="module")
def job():
    p = open_run(str(RUN / "defaults"))
    return p, gradient_order(p.graph, p.run.ranks[0].buckets, p.run.ranks[0].meta.find_unused)


def test_a_bucket_of_one_table_has_no_uncompressed_part(job):
    _, order = job
    costs = CodecCosts.load(RUN / "codec-costs.json")
    at = {name: i for i, name in enumerate(order.params)}
    table, dense = at["tables.11.weight"], (at["head.bias"], at["deep.2.weight"])
    one = powersgd_parts(order, table, table, 2, costs)
    assert (one.uncompressed, one.p, one.q) == (0, 2000 * 2, 32 * 2)  # compressed whole, no vector beside it
    assert nonempty_allreduces(order, [table - 1, table], 2) == 3 + 2  # a bucket of the layers before it, then the table's P and Q
    assert powersgd_parts(order, *dense, 2, costs).uncompressed > 0


def test_the_strategy_counts_each_buckets_non_empty_parts(job):
    _, order = job
    st = load_strategy(str(RUN / "strategy.json"))
    at = {name: i for i, name in enumerate(order.params)}
    ends = [max(at[q] for q in b.params) for b in st.buckets]
    assert len(ends) == 12
    # the head's bucket (1 x 672 and vectors: uncompressed only), 5 buckets with vectors and matrices (3 each), 6 of tables alone (P, Q)
    assert nonempty_allreduces(order, ends, st.compression.rank) == 1 + 5 * 3 + 6 * 2


def test_a_powersgd_strategy_priced_without_a_measured_chain_warns_with_the_count(tmp_path):
    import shutil

    shutil.copy(RUN / "codec-costs.json", tmp_path)
    st = load_strategy(str(RUN / "strategy.json"))
    found = find_strategy(str(RUN / "defaults"), Options(budget_s=5, seed=0, allow_lossy=True, strategy=st), str(tmp_path))
    said = [w for w in found.search.warnings if "completion callback" in w]
    assert len(said) == 1 and "PowerSGD's 28 all-reduces a step" in said[0] and "calibrate --overlap" in said[0]
