"""The optimizer's passes on a real profile (the session's tiny 2-rank DDP run): bucket slots,
compression pricing, recomputation, accumulation, scheduling, and incremental replay of candidates."""

import statistics

import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis import job_iteration_us
from dagprof.costmodel.codecs import CodecCosts, PowerSGDCost, powersgd_split
from dagprof.errors import DagprofError
from dagprof.passes import set_buckets
from dagprof.passes.accumulate import accumulate_gradients
from dagprof.passes.bucket_plan import BucketSlots, Plan
from dagprof.passes.compression import Chained, Codec, bucket_cost, chained_latency_us, chained_line, powersgd_parts
from dagprof.passes.gradients import gradient_order
from dagprof.passes.recompute import RecomputeSlots, recompute, segments
from dagprof.pipeline import open_run
from dagprof.replay import IncrementalReplayer, replay
from dagprof.traces.events import Kind


def test_gradient_order_covers_every_parameter_once(prof, order):
    layout = prof.run.ranks[0].buckets
    assert sorted(order.params) == sorted(p for b in layout for p in b.params)
    assert order.total_bytes == sum(b.nbytes for b in layout)
    assert all(s is not None for s in order.shapes)
    assert (order.layer >= 0).all()
    assert list(order.bucket_bytes(order.profiled_ends)) == [b.nbytes for b in sorted(layout, key=lambda b: b.index)]


def test_layout_from_caps_follows_ddp_rule(order):
    one = order.layout_from_caps(1e18)
    assert one == (len(order) - 1,)
    every = order.layout_from_caps(1)
    assert every == tuple(range(len(order)))
    first = order.layout_from_caps(1e18, first_bytes=1)
    assert first == (0, len(order) - 1)
    with pytest.raises(DagprofError):
        order.check_ends((3, 1))


@pytest.mark.parametrize("run", ["ddp-testbed/run", "powersgd-2bucket/defaults", "ddp-fresh/accum"])
def test_slots_price_the_profiled_layout_like_set_buckets(run):
    """On kept runs (8 and 2 buckets). The session's fresh tiny run left the two 1-7 % apart in 3 of 7 tries on an idle
    machine (stop 36's code too): its alignment drops a few collectives in some runs and not in others."""
    p = open_run(DATA / run)
    order = gradient_order(p.graph, p.run.ranks[0].buckets)
    g = BucketSlots(p.graph, order).realize(Plan(order.profiled_ends))
    assert job_iteration_us(g) == pytest.approx(job_iteration_us(set_buckets(p.graph, None)), rel=0.03)


def test_compacted_layout_replays_like_its_slot_graph(prof, order):
    slots = BucketSlots(prof.graph, order)
    for ends in (order.profiled_ends, order.layout_from_caps(1e18), order.layout_from_caps(2**12)):
        plan = Plan(ends)
        full = slots.realize(plan)
        small = slots.compact(full, plan)
        assert len(small) < len(full)
        assert job_iteration_us(small) == pytest.approx(job_iteration_us(full), rel=1e-9)
        comm = (small.kind == Kind.COMM) & (small.bucket >= 0)
        steps = len(prof.graph.meta.steps)
        assert comm.sum() == len(ends) * steps


def test_unused_slots_cost_nothing(prof, order):
    slots = BucketSlots(prof.graph, order)
    g = slots.realize(Plan(order.layout_from_caps(1e18)))
    ids, dur, gap, nb = slots.columns(Plan(order.layout_from_caps(1e18)))
    used = nb > 0
    assert (dur[~used & np.isin(ids, slots.comm.reshape(-1))] == 0).all() and (gap[~used] == 0).all()
    assert g.dur[slots.comm[:, -1]].min() > 0  # the one bucket ends at the last parameter


def test_compression_halves_the_wire_and_adds_measured_casts(order):
    costs = CodecCosts({"fp16": 1e-3}, {"fp16": 2e-3})
    price = lambda nb: 10.0 + nb * 0.01  # noqa: E731
    plain = bucket_cost(order, 0, len(order) - 1, Codec(), 1, price)
    half = bucket_cost(order, 0, len(order) - 1, Codec("fp16"), 1, price, costs)
    nb = order.total_bytes
    assert plain.channel_us == pytest.approx(price(nb))
    assert half.wire_bytes == nb // 2
    assert half.channel_us == pytest.approx(price(nb / 2) + 2e-3 * nb)
    assert half.encode_us == pytest.approx(1e-3 * nb)
    parted = bucket_cost(order, 0, len(order) - 1, Codec(), 4, price)
    assert parted.channel_us == pytest.approx(4 * price(nb / 4))  # every piece pays the per-collective cost
    with pytest.raises(DagprofError, match="measured"):
        bucket_cost(order, 0, len(order) - 1, Codec("fp16"), 1, price)


def test_powersgd_follows_torchs_compression_rule(order):
    assert powersgd_split((256, 256, 3, 3), 2) == (0, 512, 4608)
    assert powersgd_split((256,), 2) == (256, 0, 0)  # vectors travel uncompressed
    assert powersgd_split((10, 8), 4) == (80, 0, 0)  # too small to gain 2x
    assert powersgd_split((16384, 64), 4) == (0, 16384 * 4, 64 * 4)  # a tall embedding: torch views it as (shape[0], -1)
    ranked = {p: PowerSGDCost(1.0, 2.0, 3.0) for p in order.params}
    costs = CodecCosts({}, {}, {2: ranked}, 0.0)
    calls = []
    c = bucket_cost(order, 0, len(order) - 1, Codec("powersgd", 2), 1, lambda nb: calls.append(nb) or 1.0, costs)
    assert len(calls) == 3  # uncompressed tensors, P, Q: three all-reduces in sequence
    compressed = sum(1 for s in order.shapes if powersgd_split(s, 2)[1])
    # One bucket: its hook runs on the training thread; its callbacks come after the last gradient, when the
    # training thread only waits (the old pricing charged them to it as well, before the first all-reduce).
    assert c.encode_us == pytest.approx(compressed * 1.0)
    assert c.channel_us == pytest.approx(3.0 + compressed * (2.0 + 3.0))


def test_powersgd_buckets_follow_the_chained_hook(order):
    """dagprof.apply chains the hook: a later bucket's hook runs when the previous bucket completed (on the
    channel's sequence); while backward runs the channel's CPU work also takes the training thread's core."""
    n = len(order)
    assert n >= 3
    costs = CodecCosts({}, {}, {2: {p: PowerSGDCost(1.0, 2.0, 3.0) for p in order.params}}, 0.0)
    price = lambda nb: 1.0  # noqa: E731
    split = next(i for i in range(1, n - 1) if any(powersgd_split(order.shapes[j], 2)[1] for j in range(i)) and
                 any(powersgd_split(order.shapes[j], 2)[1] for j in range(i, n)))
    first = bucket_cost(order, 0, split - 1, Codec("powersgd", 2), 1, price, costs)
    later = bucket_cost(order, split, n - 1, Codec("powersgd", 2), 1, price, costs)
    c1 = sum(1 for s in order.shapes[:split] if powersgd_split(s, 2)[1])
    c2 = sum(1 for s in order.shapes[split:] if powersgd_split(s, 2)[1])
    assert first.encode_us == pytest.approx(c1 * (1.0 + 2.0 + 3.0))  # hook, then its callbacks steal from the backward still running
    assert first.channel_us == pytest.approx(3.0 + c1 * (2.0 + 3.0))
    assert later.encode_us == 0.0  # the last bucket: nothing left to steal from
    assert later.channel_us == pytest.approx(3.0 + c2 * (1.0 + 2.0 + 3.0))  # its hook waits for the previous bucket


def test_powersgd_callbacks_beside_backward_run_slower_by_the_measured_slowdown(order, prof):
    """A bucket whose callbacks run while backward still runs shares the training thread's core: the backward loses their
    CPU (as before) and they run ``beside`` (the measured overlap slowdown) slower; the last bucket's, after the backward,
    do not. BucketSlots prices the plan so when given the slowdown."""
    n = len(order)
    costs = CodecCosts({}, {}, {2: {p: PowerSGDCost(1.0, 2.0, 3.0) for p in order.params}}, 0.0)
    price = lambda nb: 1.0  # noqa: E731
    split = next(i for i in range(1, n - 1) if any(powersgd_split(order.shapes[j], 2)[1] for j in range(i)) and
                 any(powersgd_split(order.shapes[j], 2)[1] for j in range(i, n)))
    c1 = sum(1 for s in order.shapes[:split] if powersgd_split(s, 2)[1])
    codec = Codec("powersgd", 2)
    first, later = (bucket_cost(order, a, z, codec, 1, price, costs) for a, z in ((0, split - 1), (split, n - 1)))
    first_s, later_s = (bucket_cost(order, a, z, codec, 1, price, costs, beside=0.5) for a, z in ((0, split - 1), (split, n - 1)))
    assert first_s.channel_us == pytest.approx(first.channel_us + 0.5 * c1 * (2.0 + 3.0))  # its middle and decode, half again
    assert first_s.encode_us == first.encode_us  # the backward loses the same CPU
    assert later_s == later  # after the backward: nothing beside it
    slots = BucketSlots(prof.graph, order, costs, 0.5)
    assert slots.costs_of(Plan((split - 1, n - 1), codec)) == [bucket_cost(order, a, z, codec, 1, slots.price, costs, beside=0.5)
                                                               for a, z in ((0, split - 1), (split, n - 1))]
    assert bucket_cost(order, 0, split - 1, Codec(), 1, price, costs, beside=0.5) == bucket_cost(order, 0, split - 1, Codec(), 1, price)


def test_powersgd_all_reduces_pay_the_chained_latency_the_job_measured(order):
    """Each of PowerSGD's three all-reduces pays what a small all-reduce chained by completion callbacks took in the
    job's group beyond the link model's price (the median over the measured sizes): a per-run measurement, beside the
    machine's codec costs."""
    costs = CodecCosts({}, {}, {2: {p: PowerSGDCost(1.0, 2.0, 3.0) for p in order.params}}, 0.0)
    chained = Chained(((4096, 500.0), (65536, 900.0), (1 << 20, 0.5)))
    price = lambda nb: 1.0  # noqa: E731
    assert chained_latency_us(Chained(), price) == 0.0  # not measured: priced as before
    assert chained_latency_us(chained, price) == pytest.approx(499.0)  # median of 499, 899 and 0 (never below the link)
    plain = bucket_cost(order, 0, len(order) - 1, Codec("powersgd", 2), 1, price, costs)
    paid = bucket_cost(order, 0, len(order) - 1, Codec("powersgd", 2), 1, price, costs, chained=chained)
    assert paid.channel_us == pytest.approx(plain.channel_us + 3 * 499.0) and paid.encode_us == plain.encode_us


def test_powersgd_all_reduces_not_priced_at_the_link_fits_intercept(order):
    """Where the job measured chained small all-reduces, PowerSGD's three are priced on the link model's bytes term and
    their measured latency: whatever intercept the line fitted on DDP's large buckets carries (a one-size fit puts those
    buckets' stalls there) prices none of them. Not measured: the line as before."""
    costs = CodecCosts({}, {}, {2: {p: PowerSGDCost(1.0, 2.0, 3.0) for p in order.params}}, 0.0)
    chained = Chained(((4096, 3000.0), (16384, 3100.0), (65536, 5000.0)))
    wire = lambda nb: 0.04 * nb  # noqa: E731
    codec = Codec("powersgd", 2)
    costs_at = [bucket_cost(order, 0, len(order) - 1, codec, 1, lambda nb, a=a: a + wire(nb), costs, chained=chained) for a in (0.0, 6000.0, 12000.0)]
    assert [c.channel_us for c in costs_at] == pytest.approx([costs_at[0].channel_us] * 3)
    assert len({(c.encode_us, c.wire_bytes) for c in costs_at}) == 1
    latency = statistics.median(us - wire(b) for b, us in chained.allreduce)
    assert chained_latency_us(chained, chained_line(chained, lambda nb: 6000.0 + wire(nb))) == pytest.approx(latency)
    unmeasured = bucket_cost(order, 0, len(order) - 1, codec, 1, lambda nb: 6000.0 + wire(nb), costs)
    assert unmeasured.channel_us - costs_at[0].channel_us == pytest.approx(3 * (6000.0 - latency))  # the intercept, three times


def test_powersgd_cpu_between_chained_all_reduces_takes_what_the_cluster_measured(order):
    """After the backward, the hook's CPU between and after its all-reduces takes what CPU between chained all-reduces
    took on the cluster per unit of its idle time (``Chained.stretch``); a bucket whose callbacks run beside the backward
    keeps the overlap slowdown for them (its issue, on the training thread, takes the stretch), and a stretch below 1
    (noise) or not measured prices the CPU at its idle cost."""
    n = len(order)
    costs = CodecCosts({}, {}, {2: {p: PowerSGDCost(1.0, 2.0, 3.0) for p in order.params}}, 0.0)
    price = lambda nb: 1.0  # noqa: E731
    codec = Codec("powersgd", 2)
    split = next(i for i in range(1, n - 1) if any(powersgd_split(order.shapes[j], 2)[1] for j in range(i)) and
                 any(powersgd_split(order.shapes[j], 2)[1] for j in range(i, n)))
    c1, c2 = (sum(1 for s in shapes if powersgd_split(s, 2)[1]) for shapes in (order.shapes[:split], order.shapes[split:]))
    first, later = (bucket_cost(order, a, z, codec, 1, price, costs) for a, z in ((0, split - 1), (split, n - 1)))
    first_s, later_s = (bucket_cost(order, a, z, codec, 1, price, costs, chained=Chained(stretch=1.5)) for a, z in ((0, split - 1), (split, n - 1)))
    assert later_s.channel_us == pytest.approx(later.channel_us + 0.5 * c2 * (1.0 + 2.0 + 3.0))  # its hook, middle and decode
    assert later_s.encode_us == later.encode_us and first_s.channel_us == first.channel_us  # beside the backward: the overlap slowdown's
    assert first_s.encode_us == pytest.approx(first.encode_us + 0.5 * c1 * 1.0)  # its issue (encode 1.0 a matrix)
    assert bucket_cost(order, split, n - 1, codec, 1, price, costs, chained=Chained(stretch=0.8)) == later


def test_powersgd_callbacks_after_the_backward_take_the_chains_stretch_where_more(order):
    """After the backward the callbacks' CPU (a later bucket's hook, middle, decode) takes what the hook's kind of CPU took
    in calibrate's chain with every rank's chain running (``Chained.in_chain``) where that is more than the training
    thread's profiled stretch; the issue, on the training thread, keeps the profiled stretch; less, or not measured:
    unchanged."""
    n = len(order)
    costs = CodecCosts({}, {}, {2: {p: PowerSGDCost(1.0, 2.0, 3.0) for p in order.params}}, 0.0)
    price = lambda nb: 1.0  # noqa: E731
    codec = Codec("powersgd", 2)
    split = next(i for i in range(1, n - 1) if any(powersgd_split(order.shapes[j], 2)[1] for j in range(i)) and
                 any(powersgd_split(order.shapes[j], 2)[1] for j in range(i, n)))
    c2 = sum(1 for s in order.shapes[split:] if powersgd_split(s, 2)[1])
    cost = lambda chained, a=split: bucket_cost(order, a, n - 1, codec, 1, price, costs, chained=chained)  # noqa: E731
    profiled = cost(Chained(stretch=1.1))
    chain = cost(Chained(stretch=1.1, in_chain=2.0))
    assert chain.channel_us == pytest.approx(profiled.channel_us + 0.9 * c2 * (1.0 + 2.0 + 3.0))  # hook, middle, decode
    assert chain.encode_us == profiled.encode_us and chain.wire_bytes == profiled.wire_bytes
    assert cost(Chained(stretch=1.1, in_chain=1.05)) == profiled and cost(Chained(stretch=1.1, in_chain=0.0)) == profiled
    first = lambda chained: bucket_cost(order, 0, split - 1, codec, 1, price, costs, chained=chained)  # noqa: E731
    assert first(Chained(stretch=1.1, in_chain=2.0)) == first(Chained(stretch=1.1))  # beside the backward: the overlap slowdown's


def test_powersgd_priced_as_torchs_hook_measured_whole(order):
    """With torch's hook measured whole (collect.measure.codec_costs), each stretch of the bucket is what it measured:
    per bucket, per compressed gradient, and passes over the uncompressed bytes (error feedback, packing)."""
    per = {p: PowerSGDCost(1.0, 2.0, 3.0, 10.0, 20.0, 30.0) for p in order.params}
    copy = 1e-3
    costs = CodecCosts({}, {}, {2: per}, copy, powersgd_bucket_us=50.0)
    parts = powersgd_parts(order, 0, len(order) - 1, 2, costs)
    compressed = sum(1 for s in order.shapes if powersgd_split(s, 2)[1])
    unc = sum(powersgd_split(s, 2)[0] for s in order.shapes) * order.element_size
    assert parts.issue_us == pytest.approx(50.0 + 10.0 * compressed + 3 * copy * unc)
    assert parts.middle_us == pytest.approx(20.0 * compressed + copy * unc)
    assert parts.decode_us == pytest.approx(30.0 * compressed + copy * unc)
    kernels = powersgd_parts(order, 0, len(order) - 1, 2, CodecCosts({}, {}, {2: {p: PowerSGDCost(1.0, 2.0, 3.0) for p in order.params}}, copy))
    assert kernels.issue_us + kernels.middle_us + kernels.decode_us == pytest.approx(compressed * 6.0 + 3 * copy * order.total_bytes)


def test_incremental_replay_of_candidates_equals_full_replay(prof, order):
    slots = BucketSlots(prof.graph, order)
    plans = [Plan(order.profiled_ends), Plan(order.layout_from_caps(1e18)), Plan(order.layout_from_caps(2**12), parts=2),
             Plan(tuple(order.boundaries().tolist())), Plan(order.profiled_ends)]
    inc = IncrementalReplayer(slots.realize(plans[0]))
    for plan in plans[1:]:
        g = slots.realize(plan, base=inc.graph)
        ids = slots.columns(plan)[0]
        changed = ids[(g.dur[ids] != inc.graph.dur[ids]) | (g.gap[ids] != inc.graph.gap[ids])]
        got = inc.update(g, changed)
        ref = replay(g)
        np.testing.assert_allclose(got.end, ref.end)
        np.testing.assert_array_equal(got.gate, ref.gate)


def test_recomputation_costs_the_forward_again(prof):
    g = prof.graph
    segs = segments(g)
    assert segs and all(len(s.layers) >= 2 for s in segs)
    mod = next(s for s in segs if s.module.startswith("layers."))
    slots = RecomputeSlots(g, segs)
    assert job_iteration_us(slots.graph) == pytest.approx(job_iteration_us(g), rel=1e-9)  # free until chosen
    again = recompute(g, [mod.module])
    fw = (g.kind == Kind.FORWARD) & np.isin(g.layer, mod.layers)
    extra = g.dur[fw].sum()
    added = again.dur[(again.kind == Kind.FORWARD)].sum() - g.dur[(g.kind == Kind.FORWARD)].sum()
    assert added == pytest.approx(extra)
    assert job_iteration_us(again) >= job_iteration_us(g)  # never free; hidden where the iteration waits on communication anyway
    with pytest.raises(DagprofError, match="no profiled module"):
        recompute(g, ["no.such.module"])


def test_accumulation_adds_communication_free_micro_batches(prof):
    g = prof.graph
    acc = accumulate_gradients(g, 3)
    assert acc.meta.micro_batches == 3
    assert ((acc.kind == Kind.COMM) & (acc.rank < 0)).sum() == ((g.kind == Kind.COMM) & (g.rank < 0)).sum()
    fw = lambda x: ((x.kind == Kind.FORWARD) & (x.rank >= 0)).sum()  # noqa: E731
    assert fw(acc) == 3 * fw(g)
    one, three = job_iteration_us(g), job_iteration_us(acc)
    assert one < three < 3 * one  # the all-reduce and the optimizer step are paid once per three micro-batches
    assert accumulate_gradients(g, 1) is g
    with pytest.raises(DagprofError):
        accumulate_gradients(g, 0)


def test_accumulation_refuses_collectives_it_would_drop():
    """A hybrid trace whose TP collectives have their own nodes: the copies (compute only) would drop them."""
    g = open_run(str(DATA / "hybrid-dp-tp")).graph
    with pytest.raises(DagprofError, match=r"not modelled: gradient accumulation on a hybrid job whose \d+ tensor"):
        accumulate_gradients(g, 2)


def test_overlap_fraction_and_slowdown(prof):
    from dagprof.passes.overlap import comm_overlap, slowed_nodes

    g = prof.graph
    res = replay(g)
    nodes = slowed_nodes(g)
    f = comm_overlap(g, res, nodes)
    assert ((f >= 0) & (f <= 1)).all() and f.max() > 0  # some backward overlapped an all-reduce
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    inside = nodes[(res.start[nodes] >= res.start[comm[0]]) & (res.end[nodes] <= res.end[comm[0]]) & (res.end[nodes] > res.start[nodes])]
    assert np.allclose(comm_overlap(g, res, inside), 1.0)


def test_same_op_pairs_each_op_across_steps(prof):
    """Every backward op of a step has one id shared with its instances in the other steps, on its own rank only."""
    from dagprof.passes.overlap import same_op, slowed_nodes

    g = prof.graph
    nodes = slowed_nodes(g)
    op = same_op(g, nodes)
    assert (op[g.step[nodes] < 0] == -1).all()
    bwd = (g.kind[nodes] == Kind.BACKWARD) & (op >= 0)
    steps = len(np.unique(g.step[nodes[g.step[nodes] >= 0]]))
    ids, counts = np.unique(op[bwd], return_counts=True)
    assert len(ids) and (counts == steps).all()  # one instance per step
    for i in ids[:5]:
        members = nodes[op == i]
        assert len(set(g.name[members].tolist())) == 1 and len(set(g.rank[members].tolist())) == 1
        assert sorted(g.step[members].tolist()) == sorted(set(g.step[members].tolist()))


def test_undisturbed_takes_each_ops_mean_overlap_out_and_keeps_its_steps(prof):
    """Every instance of an op over the op's mean factor across its steps: the op's profiled total over that factor,
    each step's own noise kept (a step's instance made slower than its overlap explains raises that step only)."""
    from dagprof.passes.overlap import comm_overlap, same_op, slowed_nodes, undisturbed

    g = prof.graph
    res = replay(g)
    nodes = slowed_nodes(g)
    op = same_op(g, nodes)
    f = comm_overlap(g, res, nodes)
    base = undisturbed(g, res, 0.5)
    for i in np.unique(op[op >= 0])[:20]:
        members = nodes[op == i]
        mean_factor = float(np.mean(1 + 0.5 * f[op == i]))
        assert np.allclose(base[members] * mean_factor, g.dur[members])
    alone = nodes[op < 0]
    assert np.allclose(base[alone], g.dur[alone] / (1 + 0.5 * comm_overlap(g, res, alone)))  # outside steps: its own overlap
    assert np.array_equal(undisturbed(g, res, 0.0), g.dur)
    one = nodes[(g.kind[nodes] == Kind.BACKWARD) & (op >= 0)][0]
    others = nodes[(op == op[nodes == one][0]) & (nodes != one)]
    noisy = g.replace(dur=g.dur.copy())
    noisy.dur[one] += 1000.0
    raised = undisturbed(noisy, res, 0.5)
    assert raised[one] > base[one] and np.allclose(raised[others], base[others])


def test_overlap_weighted_by_what_each_collective_moves(prof):
    """A collective slows compute in proportion to the bytes it moves per second against the all-reduce the slowdown
    was measured beside: none moving -> no overlap; each at the measured rate -> as if unweighted."""
    from dagprof.passes.overlap import comm_demand, comm_overlap, slowed_nodes

    g = prof.graph
    res = replay(g)
    nodes = slowed_nodes(g)
    whole = comm_overlap(g, res, nodes)
    assert whole.max() > 0
    assert np.allclose(comm_overlap(g, res, nodes, np.zeros(len(g))), 0.0)
    assert np.allclose(comm_overlap(g, res, nodes, np.ones(len(g))), whole)
    half = comm_overlap(g, res, nodes, np.full(len(g), 0.5))
    assert (half <= whole + 1e-12).all() and (half >= 0.5 * whole - 1e-12).all() and half.sum() < whole.sum()
    comm = (g.kind == Kind.COMM) & (g.rank < 0) & (g.dur > 0)
    span = (res.end - res.start)[comm]
    rate = float(np.max(g.nbytes[comm] / span)) * 1e6  # the fastest collective of the run: it counts whole
    d = comm_demand(g, res, g.nbytes.astype(float), rate)
    assert ((d >= 0) & (d <= 1)).all() and d[comm].max() == pytest.approx(1.0)
    np.testing.assert_allclose(comm_demand(g, res, g.nbytes / 4.0, rate)[comm], d[comm] / 4)  # a codec's fewer bytes: less CPU


def test_overlap_slowdown_prices_a_compressed_bucket_by_its_wire_bytes():
    """With the measured rate, the profiled layout is priced as its profile with each op's mean overlap taken out and
    charged back per step (a slowdown too small to matter prices that profile), and PowerSGD's small factors slow the
    backward beside them less than the same channel time counted whole. On a vendored run: how the steps share the
    overlap moves the replay by the steps' unevenness, which a live profile's load makes anything up to 5 %+."""
    from dagprof.search.candidate import Candidate
    from dagprof.search.evaluate import Evaluator

    prof = open_run(str(DATA / "powersgd-2bucket" / "defaults"))
    order = gradient_order(prof.graph, prof.run.ranks[0].buckets)
    g = prof.graph
    per = {p: PowerSGDCost(300.0, 300.0, 300.0) for p in order.params}  # a long channel, few bytes on it
    costs = CodecCosts({}, {}, {2: per}, 0.0)
    comm = (g.kind == Kind.COMM) & (g.rank < 0) & (g.dur > 0)
    rate = float(np.median(g.nbytes[comm] / g.dur[comm])) * 1e6
    base = Candidate(order.profiled_ends)
    plain = Evaluator(g, order, costs, [], None, 1e-9, comm_rate=rate).score(base)[0].iter_us
    slowed = Evaluator(g, order, costs, [], None, 0.5, comm_rate=rate).score(base)[0].iter_us
    # each op's profiled total comes back at the profiled overlap; how the steps share it moves the replay a little
    # (0.5 % on this run; 0.3-5.4 % on the live demo profile, by the load that made its steps uneven)
    assert slowed == pytest.approx(plain, rel=0.02)
    lossy = Candidate(order.profiled_ends, codec=Codec("powersgd", 2))

    def charged(ev: Evaluator) -> float:
        """What the candidate's own overlap adds to its compute (the profiled overlap taken out first, so the two
        evaluators start from different undisturbed times, and their median steps can swap on a loaded profile)."""
        t = ev.template(1)
        sg, _ = t.replay(lossy)
        return float((sg.dur[t.slowed] - t.base_dur[t.slowed]).sum())

    assert charged(Evaluator(g, order, costs, [], None, 0.5, comm_rate=rate)) < charged(Evaluator(g, order, costs, [], None, 0.5))
