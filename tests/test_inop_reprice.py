"""Link what-ifs re-price the collectives a DDP model runs inside its own ops (CLIP's differentiable all_gather and the
scatters of its backward, synchronised BatchNorm's statistics) where the collector recorded their bytes
(``collect.hooks.own_collectives``: tests/data/ddp-fresh/{clip,syncbn}-sized), and the asynchronous and functional
calls it records with their waits (``async-sized``): each is a piece of the op it blocked, and a link change moves it by
the change in the link model's price for its bytes. Recordings without those bytes (the older ``clip``/``syncbn``, the
DP x TP job's DTensor all-reduces recorded before) keep them as measured, said with their count."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.costmodel.alphabeta import AlphaBeta
from dagprof.costmodel.collectives import allreduce_us
from dagprof.costmodel.topology import Topology, allreduce_equivalent_factor, per_rank_equivalent_bytes
from dagprof.passes.comm import current_topology, in_op_pieces, set_link, set_topology
from dagprof.pipeline import open_run
from dagprof.traces.events import CommKind, Kind
from dagprof.traces.parallelism import in_op_name
from dagprof.traces.run_comm import in_op_sizes
from dagprof.traces.run_schema import OWN_KINDS, Col, Rec

FRESH = DATA / "ddp-fresh"
# per step and rank: kind -> (count, bytes: an all-gather's gathered on its 2 ranks, ``CommKind.event_bytes``); CLIP's
# batch 32 x dim 64 floats a rank, SyncBN's 2C+1 and 2C floats
SIZED = {"clip-sized": {CommKind.ALL_GATHER: (2, {2 * 8192}), CommKind.SCATTER: (4, {8192})},
         "syncbn-sized": {CommKind.ALL_GATHER: (9, {2 * 68, 2 * 132, 2 * 260}), CommKind.ALL_REDUCE: (9, {64, 128, 256})}}


def _pieces(g):
    """The pieces and the (kind, group size) of each, its name saying the same."""
    v = in_op_pieces(g)
    named = [(CommKind(int(g.comm_kind[x])), int(g.group_size[x])) for x in v.tolist()]
    assert [g.node_name(int(x)).rpartition(".")[2] for x in v] == [in_op_name(k, n) for k, n in named]
    return v, named


@pytest.mark.parametrize("name", sorted(SIZED))
def test_each_sized_collective_is_a_piece_of_the_op_it_blocked(name):
    g = open_run(FRESH / name).graph
    v, kinds = _pieces(g)
    rank_steps = len(g.meta.steps) * 2
    for kind, (count, sizes) in SIZED[name].items():
        mine = [int(x) for x, k in zip(v, kinds) if k == (kind, 2)]
        assert len(mine) == count * rank_steps and set(g.nbytes[mine].tolist()) == sizes
    assert set(g.kind[v].tolist()) == {Kind.COMM} and (g.dur[v] > 0).all()
    par = g.meta.parallel
    assert par.in_ops_sized == par.in_ops[0] == sum(c for c, _ in SIZED[name].values())
    assert f"link what-ifs re-price the {par.in_ops_sized:g}" in par.in_ops_text()


@pytest.mark.parametrize("name", [*sorted(SIZED), "async-sized"])
@pytest.mark.parametrize("rate", [200e6 / 8, 10e9 / 8])
def test_a_link_change_moves_each_by_the_change_of_its_price(name, rate):
    """Each piece's new time is its measured time less the link model's price for its bytes on the profiled link plus the
    price on the new one (never below 0); nothing else the model computes changes."""
    g = open_run(FRESH / name).graph
    v, kinds = _pieces(g)
    was, now = current_topology(g), current_topology(g).with_link("inter", rate, None)
    h = set_link(g, bandwidth=rate)
    for x, (kind, ranks) in zip(v.tolist(), kinds):
        m = per_rank_equivalent_bytes(kind, float(g.nbytes[x]), ranks)
        assert h.dur[x] == pytest.approx(max(g.dur[x] - allreduce_us(m, was) + allreduce_us(m, now), 0.0), abs=1e-6)
    compute = np.flatnonzero(np.isin(g.kind, [Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE]) & (g.rank >= 0))
    assert np.array_equal(h.dur[compute], g.dur[compute]) and np.array_equal(h.gap[compute], g.gap[compute])
    same = set_topology(g, was)  # the profiled link: every piece as measured
    assert np.allclose(same.dur[v], g.dur[v])
    back = set_topology(h, was)  # and back from the new link
    assert np.allclose(back.dur[v], g.dur[v])


def test_asynchronous_and_functional_calls_are_pieces_from_their_wait():
    """async-sized: GatherLayer's all_gather(async_op=True) and its backward's all_reduce, each waited for, and a functional
    all_reduce (DTensor's path) waited for at first use: each a piece from its first wait (or its transfer's start, if
    later) to its transfer's end, with its bytes. The forward's own async all_gather of the queries, waited for only after
    the loss, had ended by then on every rank and step (hidden behind the document tower): unsized, counted in the note,
    and no more a collective of its own priced as 0 bytes."""
    g = open_run(FRESH / "async-sized").graph
    v, kinds = _pieces(g)
    got = sorted((kind, int(g.nbytes[x])) for x, (kind, _) in zip(v.tolist(), kinds))
    assert got == sorted([(CommKind.ALL_GATHER, 2 * 32 * 64 * 4)] * 4 + [(CommKind.ALL_REDUCE, 64 * 4)] * 4 + [(CommKind.ALL_REDUCE, 2 * 32 * 64 * 4)] * 4)
    par = g.meta.parallel
    assert par.in_ops[0] == 4 and par.in_ops_sized == 3 and dict(par.in_ops_kinds) == {CommKind.ALL_GATHER: 2, CommKind.ALL_REDUCE: 2}
    text = par.in_ops_text()
    assert "re-price the 3 " in text and "the other 1 keep their measured time" in text and "before its wait began" in text
    assert not any("all_gather" in n for n in g.names if "inside the op" not in n)


def test_an_asynchronous_call_blocks_from_its_wait():
    """Paired by kind in issue order like a blocking call; its piece starts at its first wait (OWN_WAIT naming its call's
    time) where that is after its transfer's start; one whose transfer ended before its wait, or with no wait recorded,
    is left out (unsized), the others of its kind still sized."""
    def rec(code: int, kind: CommKind, t: int, x: int) -> list[int]:
        row = [0] * len(Col)
        row[Col.CODE], row[Col.A], row[Col.B], row[Col.T_NS], row[Col.X] = code, OWN_KINDS.index(kind), 2, t, x
        return row

    records = np.array([rec(Rec.OWN_ASYNC, CommKind.ALL_GATHER, 10, 8), rec(Rec.OWN_WAIT, CommKind.ALL_GATHER, 25, 10),
                        rec(Rec.OWN_ASYNC, CommKind.ALL_GATHER, 30, 8), rec(Rec.OWN_WAIT, CommKind.ALL_GATHER, 50, 30),
                        rec(Rec.OWN_ASYNC, CommKind.ALL_GATHER, 60, 8), rec(Rec.OWN_COLL, CommKind.ALL_GATHER, 80, 4)], dtype=np.int64)
    inside = [(CommKind.ALL_GATHER, 12, 40), (CommKind.ALL_GATHER, 31, 45), (CommKind.ALL_GATHER, 61, 70), (CommKind.ALL_GATHER, 81, 90)]
    got = in_op_sizes(inside, records, 0, 100)
    assert [(x.start, x.end, x.nbytes) for x in got] == [(25, 40, 16), (81, 90, 8)]  # gathered on 2 ranks


def test_an_asynchronous_call_blocks_from_a_kineto_wait_tensor_that_held_its_end():
    """DTensor's backward waits on its functional all-reduces through C++, not the patched ``wait_tensor``: the recorded
    wait came after the transfer's end (the call looked hidden, left out). Kineto's ``_c10d_functional::wait_tensor`` that
    began after the call and held the transfer's end is where it blocked; the earlier of the two counts; a Kineto wait that
    ended before the transfer did, or began before the call, is another's."""
    def rec(code: int, kind: CommKind, t: int, x: int) -> list[int]:
        row = [0] * len(Col)
        row[Col.CODE], row[Col.A], row[Col.B], row[Col.T_NS], row[Col.X] = code, OWN_KINDS.index(kind), 2, t, x
        return row

    ar = CommKind.ALL_REDUCE
    records = np.array([rec(Rec.OWN_ASYNC, ar, 10, 8), rec(Rec.OWN_WAIT, ar, 42, 10),  # recorded after the end (40)
                        rec(Rec.OWN_ASYNC, ar, 50, 8), rec(Rec.OWN_WAIT, ar, 55, 50),  # recorded before Kineto's
                        rec(Rec.OWN_ASYNC, ar, 70, 8), rec(Rec.OWN_WAIT, ar, 92, 70)], dtype=np.int64)  # Kineto's ended early
    inside = [(ar, 12, 40), (ar, 51, 65), (ar, 71, 90)]
    held = np.array([[5, 45], [20, 41], [58, 66], [72, 80]], np.int64)  # the first began before the call
    got = in_op_sizes(inside, records, 0, 100, held=held)
    assert [(x.start, x.end) for x in got] == [(20, 40), (55, 65)]
    assert [(x.start, x.end) for x in in_op_sizes(inside, records, 0, 100)] == [(55, 65)]  # the recorded waits alone


def test_an_asynchronous_call_outside_any_op_is_the_models_where_it_waited_for_it():
    """A module's own dist.all_gather_into_tensor(async_op=True) enqueues outside any Kineto op, as a logging all-reduce
    does; the latest call of its kind before that enqueue, asynchronous, waited for and followed by a layer's forward,
    makes it the model's own (paired and cut at its wait), where a blocking call, or one never waited for, leaves it a
    collective of its own (one the step's last layer precedes: ``tests/test_hand_dp_sizes.py``)."""
    from dagprof.traces.run_comm import _waited_later

    def rec(code: int, kind: CommKind, t: int, x: int) -> list[int]:
        row = [0] * len(Col)
        row[Col.CODE], row[Col.A], row[Col.B], row[Col.T_NS], row[Col.X] = code, OWN_KINDS.index(kind), 2, t, x
        return row

    records = np.array([rec(Rec.OWN_ASYNC, CommKind.ALL_GATHER, 10, 8), rec(Rec.FWD_END, CommKind.ALL_GATHER, 20, 0),
                        rec(Rec.OWN_WAIT, CommKind.ALL_GATHER, 30, 10),
                        rec(Rec.OWN_COLL, CommKind.ALL_GATHER, 40, 8), rec(Rec.OWN_ASYNC, CommKind.ALL_REDUCE, 50, 4)], dtype=np.int64)
    assert _waited_later(records, CommKind.ALL_GATHER, 11)
    assert not _waited_later(records, CommKind.ALL_GATHER, 41)  # the blocking call's
    assert not _waited_later(records, CommKind.ALL_REDUCE, 51)  # never waited for
    assert not _waited_later(records, CommKind.ALL_REDUCE, 5) and not _waited_later(records, CommKind.ALL_TO_ALL, 11)


def test_on_a_half_duplex_link_a_scatter_moves_by_its_one_way_price():
    """``whatif --half-duplex`` (the testbed's one shaper for both directions): a scatter sends one way, so its bytes cost
    half their all-reduce equivalent on the profiled link and on the new one; the 2-rank all-gathers, whose halves cross
    one way at a time on ports (``all_gather_factor``), their bytes (``one_way_share``); at the profiled link every piece
    stays as measured."""
    from dataclasses import replace

    g = open_run(FRESH / "clip-sized").graph
    v, kinds = _pieces(g)
    was = replace(current_topology(g), half_duplex=True)
    now = was.with_link("inter", 200e6 / 8, None)
    on = set_topology(g, was)
    assert np.allclose(on.dur[v], g.dur[v])
    h = set_link(on, bandwidth=200e6 / 8)
    full = set_link(g, bandwidth=200e6 / 8)
    for x, (kind, ranks) in zip(v.tolist(), kinds):
        m = per_rank_equivalent_bytes(kind, float(g.nbytes[x]), ranks) * was.one_way_share(kind)
        assert h.dur[x] == pytest.approx(max(g.dur[x] - allreduce_us(m, was) + allreduce_us(m, now), 0.0), abs=1e-6)
        assert kind in (CommKind.SCATTER, CommKind.ALL_GATHER) and h.dur[x] < full.dur[x]


def test_whatif_half_duplex_lowers_only_the_scatters_price(capsys):
    """``dagprof whatif --half-duplex`` on CLIP's recording: the model of the profiled run stays; at 200 Mbit/s the step
    comes out shorter by no more than its scatters' halved price."""
    def ask(*extra: str) -> dict:
        assert main(["whatif", str(FRESH / "clip-sized"), "--bandwidth", "200Mbit", "--json", "--no-trace", "--allow-model-error", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    full, half = ask(), ask("--half-duplex")
    assert half["model_iter_ms"] == pytest.approx(full["model_iter_ms"])
    g = open_run(FRESH / "clip-sized").graph
    v, kinds = _pieces(g)
    scatters = [x for x, (kind, _) in zip(v.tolist(), kinds) if kind == CommKind.SCATTER]
    bound = float(g.nbytes[scatters].sum()) * 8 / 200e6 * 1e3 / len(g.meta.steps)  # ms a step: all of them, every rank
    assert 0 < full["scenarios"][0]["predicted_iter_ms"] - half["scenarios"][0]["predicted_iter_ms"] <= bound


def test_more_workers_keep_them_as_measured():
    """Their bytes and calls would change with the model's batch across more workers: a 4-rank link prices none of a
    2-rank profile's pieces."""
    from dagprof.costmodel.topology import CollectiveSpec
    from dagprof.passes.comm import in_op_prices

    g = open_run(FRESH / "clip-sized").graph
    assert len(in_op_prices(g, current_topology(g), CollectiveSpec())[0]) == len(in_op_pieces(g)) > 0
    assert not len(in_op_prices(g, current_topology(g).with_workers(4), CollectiveSpec())[0])


def test_an_all_gather_costs_what_a_ring_all_gather_sends():
    """Per rank bytes B on N ranks: an all-gather, a scatter or a gather moves (N-1) B through a port, the all-reduce of N B / 2:
    an all-gather's bytes are the gathered N B (``CommKind.event_bytes``), a scatter's or gather's one chunk B."""
    assert per_rank_equivalent_bytes(CommKind.ALL_GATHER, 4000.0, 4) == 2000.0
    for kind in (CommKind.SCATTER, CommKind.GATHER):
        assert per_rank_equivalent_bytes(kind, 1000.0, 4) == 2000.0
    assert per_rank_equivalent_bytes(CommKind.ALL_REDUCE, 1000.0, 4) == 1000.0
    assert per_rank_equivalent_bytes(CommKind.BROADCAST, 1000.0, 2) == 1000.0


def test_an_all_to_all_costs_its_whole_buffer_through_a_port_on_gloo():
    """An all-to-all of a B-byte buffer on N ranks sends (N-1)/N B from each port and receives as much (gloo/alltoall.cc
    posts every send at once): the all-reduce of B / 2, as NCCL is priced. gloo's ran its directions one after the other
    on the testbed, as long as B through one port: the all-reduce of N B / (2 (N-1)). Where one medium carries every rank
    (``--half-duplex``), its bytes on it: (N-1) B, the all-reduce's 2 (N-1) B over two."""
    assert per_rank_equivalent_bytes(CommKind.ALL_TO_ALL, 1000.0, 2) == 1000.0 and per_rank_equivalent_bytes(CommKind.ALL_TO_ALL, 1200.0, 4) == 800.0
    assert per_rank_equivalent_bytes(CommKind.ALL_TO_ALL, 1000.0, 4, "nccl") == 500.0
    assert allreduce_equivalent_factor(CommKind.ALL_TO_ALL, "gloo", 8) == pytest.approx(8 / 14)
    for n in (2, 4, 8):
        hub = replace(Topology.flat(n, AlphaBeta(0.0, 1.0)), half_duplex=True)
        assert hub.one_way_share(CommKind.ALL_TO_ALL) * per_rank_equivalent_bytes(CommKind.ALL_TO_ALL, 1000.0, n) == pytest.approx(500.0)


def test_where_one_medium_carries_every_rank_a_broadcast_and_a_scatter_cost_their_bytes_on_it():
    """On the testbed's shaped loopback a broadcast took half the all-reduce of its bytes on 2 and on 4 ranks
    (``bench/bcast_sweep.py --loopback``): the medium carries (N-1) S of it against the all-reduce's 2 (N-1) S. A half share
    on every N priced it at the all-reduce's time on 4 ranks. A scatter of B per rank puts (N-1) B on it."""
    for n in (2, 3, 4, 8):
        hub = replace(Topology.flat(n, AlphaBeta(0.0, 1.0)), half_duplex=True)
        assert hub.one_way_share(CommKind.BROADCAST) * per_rank_equivalent_bytes(CommKind.BROADCAST, 1000.0, n) == pytest.approx(500.0)
        ring = 2 * (n - 1) / n  # bytes per port per all-reduce-equivalent byte
        assert hub.one_way_share(CommKind.SCATTER) * per_rank_equivalent_bytes(CommKind.SCATTER, 1000.0, n) * ring == pytest.approx((n - 1) * 1000.0 / n)
        assert hub.one_way_share(CommKind.ALL_GATHER) * per_rank_equivalent_bytes(CommKind.ALL_GATHER, 1000.0, n) == pytest.approx(500.0)
        assert replace(hub, half_duplex=False).one_way_share(CommKind.BROADCAST) == 1.0


def test_an_expert_layers_all_to_alls_are_sized_pieces_and_re_priced(capsys):
    """moe-a2a-sized: an expert layer's two ``torch.distributed.nn.functional.all_to_all_single`` a forward, two more in its
    backward (``dist.all_to_all_single``, ``Rec.OWN_COLL``), 64 tokens x 32 floats: each a piece of the op it blocked;
    the EP/CP note says link what-ifs re-price them, and a slower link lengthens the step by their price (gloo's on 2
    ranks: the all-reduce of their whole buffer). DDP's broadcasts of the BatchNorm's buffers before each forward carry
    the bytes the collector recorded for them, one per dtype."""
    g = open_run(FRESH / "moe-a2a-sized").graph
    v, kinds = _pieces(g)
    assert kinds == [(CommKind.ALL_TO_ALL, 2)] * (4 * len(g.meta.steps) * 2) and set(g.nbytes[v].tolist()) == {64 * 32 * 4}
    par = g.meta.parallel
    assert par.in_ops_sized == par.in_ops[0] == 0  # the DDP-side count: no all-to-all is DDP's
    said = [n for n in par.notes if "EP/CP all_to_all" in n]
    assert len(said) == 1 and "link what-ifs, which re-price the 16 all_to_all" in said[0]
    bcast = [int(x) for x in np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0)) if g.node_name(int(x)).startswith("broadcast")]
    assert g.nbytes[bcast].tolist() == [2 * 32 * 4, 8] * len(g.meta.steps)  # DDP's BatchNorm buffers: float32 then int64
    slow = set_link(g, bandwidth=1e6 / 8)
    was, now = current_topology(g), current_topology(slow)
    assert np.allclose(slow.dur[v], np.maximum(g.dur[v] - allreduce_us(64 * 32 * 4, was) + allreduce_us(64 * 32 * 4, now), 0.0))
    assert (slow.dur[v] > g.dur[v]).all()


def test_a_blocking_call_outside_any_op_carries_the_bytes_recorded_for_it(capsys):
    """moe-uneven (``bench/ddp_fresh/moe_loader.py``) all-reduces its loss for the log line after each step, outside any
    op: Kineto shows it as a collective of its own without a size, which link what-ifs priced as a 0-byte message, said in
    a note; the collector's record of that call (``Rec.OWN_COLL``, the latest of its kind before it) gives its 4 bytes."""
    g = open_run(FRESH / "moe-uneven").graph
    own = [int(v) for v in np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0)) if "bucket" not in g.node_name(int(v))]
    assert len(own) == len(g.meta.steps) and set(g.nbytes[own].tolist()) == {4}
    assert main(["whatif", str(FRESH / "moe-uneven"), "--bandwidth", "200Mbit", "--json", "--no-trace", "--allow-model-error"]) == 0
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if "no recorded size" in n]


def test_the_slower_link_lengthens_the_clip_step_by_its_all_gathers(capsys):
    assert main(["whatif", str(FRESH / "clip-sized"), "--bandwidth", "200Mbit", "--json", "--no-trace", "--allow-model-error"]) == 0
    out = json.loads(capsys.readouterr().out)
    said = [n for n in out["notes"] if "ran inside the model's own ops" in n]
    assert len(said) == 1 and "link what-ifs re-price the 6 whose bytes" in said[0] and "keep their measured" not in said[0]


@pytest.mark.parametrize("name", ["clip", "syncbn"])
def test_recordings_without_their_bytes_keep_them_as_measured(name):
    """Recorded before the collector sized them: no piece, every one kept as measured and said so."""
    g = open_run(FRESH / name).graph
    assert not len(in_op_pieces(g))
    text = g.meta.parallel.in_ops_text()
    assert "re-price" not in text and f"{g.meta.parallel.in_ops[0]:g} keep their measured time" in text


def test_tensor_parallel_all_reduces_through_dtensor_stay_as_measured():
    g = open_run(DATA / "hybrid-dp-tp-dagprof").graph
    assert not len(in_op_pieces(g)) and "3 keep their measured time" in g.meta.parallel.in_ops_text()


def test_calls_and_transfers_pair_by_kind_in_order_or_not_at_all():
    """A kind whose recorded calls and Kineto's transfers differ in number (an asynchronous call, DTensor's path) is left
    unsized, never paired out of order; another kind still pairs."""
    def rec(kind: CommKind, t: int, nbytes: int) -> list[int]:
        row = [0] * len(Col)
        row[Col.CODE], row[Col.A], row[Col.B], row[Col.T_NS], row[Col.X] = Rec.OWN_COLL, OWN_KINDS.index(kind), 2, t, nbytes
        return row

    records = np.array([rec(CommKind.ALL_GATHER, 10, 8), rec(CommKind.ALL_GATHER, 30, 16), rec(CommKind.ALL_REDUCE, 50, 4)], dtype=np.int64)
    inside = [(CommKind.ALL_GATHER, 12, 20), (CommKind.ALL_GATHER, 31, 40), (CommKind.ALL_REDUCE, 51, 60), (CommKind.ALL_REDUCE, 61, 70)]
    got = in_op_sizes(inside, records, 0, 100)
    assert [(x.kind, x.start, x.end, x.nbytes, x.ranks) for x in got] == [(CommKind.ALL_GATHER, 12, 20, 16, 2), (CommKind.ALL_GATHER, 31, 40, 32, 2)]
    assert in_op_sizes(inside[:2], records[:2], 20, 100) == []  # the first call before the window: one call, two transfers
    # a logging all-reduce outside any op (called at 65, Kineto's own collective enqueued at 66) takes its call out of the pairing
    logged = np.concatenate([records, [rec(CommKind.ALL_REDUCE, 65, 12)]])
    got = in_op_sizes(inside[:3], logged, 0, 100, [(CommKind.ALL_REDUCE, 66)])
    assert [(x.kind, x.start, x.nbytes) for x in got] == [(CommKind.ALL_GATHER, 12, 16), (CommKind.ALL_GATHER, 31, 32), (CommKind.ALL_REDUCE, 51, 4)]


def test_a_users_kineto_trace_moves_its_sized_activation_collectives_the_same_way():
    """clip-kineto (plain torch.profiler, record_shapes): the all-gathers and scatters sit in the graph as shared collectives
    labelled unknown; each moves by its change of price. gloo's scatter records its chunks on its root only: each rank's
    scatter pairs with its peer's of the same root and carries the root's chunk, so all 18 are sized, none on one rank only."""
    from dagprof.passes.comm import activation_comm
    from dagprof.traces.events import CommKind
    from dagprof.traces.parallelism import Dim

    g = open_run(FRESH / "clip-kineto").graph
    acts = activation_comm(g)
    unknown = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.dim == Dim.UNKNOWN))
    assert g.meta.parallel.unknown_are_activations and len(acts) == len(unknown) == 18
    chunk = 128 * 256 * 4  # a rank's chunk of the batch's 256-wide embeddings: a scatter's bytes, an all-gather's on 2 ranks twice it
    assert {(CommKind(int(k)), int(b)) for k, b in zip(g.comm_kind[acts], g.nbytes[acts])} == {(CommKind.SCATTER, chunk), (CommKind.ALL_GATHER, 2 * chunk)}
    was, now = current_topology(g), current_topology(g).with_link("inter", 200e6 / 8, None)
    h = set_link(g, bandwidth=200e6 / 8)
    for v in acts.tolist():
        m = per_rank_equivalent_bytes(CommKind(int(g.comm_kind[v])), float(g.nbytes[v]), 2)
        assert h.dur[v] == pytest.approx(max(g.dur[v] - allreduce_us(m, was) + allreduce_us(m, now), 0.0), abs=1e-6)


def test_a_users_scatters_pair_each_root_with_its_peer():
    """In clip-kineto each rank roots every other scatter of the backward: matched by issue order, each instance holds
    one rank's root scatter (the only one gloo records tensors on) and the other rank's of the same root, never two roots."""
    from dagprof.align.one_clock import on_one_clock

    run, matching = on_one_clock(open_run(FRESH / "clip-kineto").run)
    scatters = [k for k, it in enumerate(matching.instances) if it.kind == CommKind.SCATTER]
    assert len(scatters) >= 12
    for k in scatters:
        sized = [int(t.events.nbytes[np.flatnonzero(m == k)[0]]) for t, m in zip(run.ranks, matching.instance)]
        assert sorted(sized) == [0, 128 * 256 * 4] and matching.instances[k].nbytes == 128 * 256 * 4


def test_the_collector_sizes_the_models_calls_and_their_waits_and_unpatches(tmp_path):
    """One gloo rank: a model whose forward all-gathers (blocking), all-reduces asynchronously and waits, exchanges tokens
    (``all_to_all_single``, blocking), and broadcasts, exchanges and reduce-scatters through the functional collectives
    DTensor uses; DDP's
    comm hook all-reduces its bucket asynchronously too, and broadcasts its BatchNorm's buffers before each forward (one
    float32 and one int64 transfer). Per step in
    the window: one record per call of the model's, with its bytes and group size, the asynchronous ones' first waits
    naming their call; none for DDP's bucket; torch.distributed's functions are the originals afterwards."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof.collect import profile
    from dagprof.traces.run_schema import rank_file

    class Gathering(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)
            self.norm = torch.nn.BatchNorm1d(4)

        def forward(self, x):
            y = self.norm(self.lin(x))
            out = [torch.empty_like(y)]
            dist.all_gather(out, y.detach())
            work = dist.all_reduce(y.detach().clone(), async_op=True)
            work.wait()
            work.wait()  # a second wait is no new record
            routed = torch.empty_like(y)
            dist.all_to_all_single(routed, y.detach())
            b = funcol.broadcast(x[:2], 0, dist.group.WORLD)
            a = funcol.all_to_all_single(x[:2].contiguous(), None, None, dist.group.WORLD)
            r = funcol.reduce_scatter_single(x[:2].contiguous(), "sum", 0, dist.group.WORLD)
            return y + out[0] + routed + b.sum() + a.sum() + r.sum()

    originals = {n: dist.__dict__[n] for n in ("all_gather", "all_reduce", "scatter", "all_to_all_single")}
    functional = {n: funcol.__dict__[n] for n in ("all_gather_single", "all_reduce", "broadcast", "all_to_all_single", "reduce_scatter_single",
                                                  "wait_tensor")}
    wait, buffers = dist.Work.__dict__["wait"], DDP.__dict__["_distributed_broadcast_coalesced"]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = DDP(Gathering())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with profile(tmp_path / "run", steps=range(1, 3), model=model, kineto=True) as prof:
            for _ in range(4):
                opt.zero_grad()
                model(torch.randn(5, 8)).sum().backward()
                opt.step()
                prof.step()
    finally:
        dist.destroy_process_group()
    assert all(dist.__dict__[n] is f for n, f in originals.items()) and all(funcol.__dict__[n] is f for n, f in functional.items())
    assert dist.Work.__dict__["wait"] is wait and DDP.__dict__["_distributed_broadcast_coalesced"] is buffers
    records = json.loads((tmp_path / "run" / rank_file(0)).read_text())["records"]
    own = [r for r in records if r[Col.CODE] in (Rec.OWN_COLL, Rec.OWN_ASYNC, Rec.OWN_WAIT)]
    step = [(Rec.OWN_COLL, OWN_KINDS.index(CommKind.BROADCAST), 1, 2 * 4 * 4), (Rec.OWN_COLL, OWN_KINDS.index(CommKind.BROADCAST), 1, 8),  # DDP's buffers
            (Rec.OWN_COLL, OWN_KINDS.index(CommKind.ALL_GATHER), 1, 5 * 4 * 4), (Rec.OWN_ASYNC, OWN_KINDS.index(CommKind.ALL_REDUCE), 1, 5 * 4 * 4),
            (Rec.OWN_WAIT, OWN_KINDS.index(CommKind.ALL_REDUCE), 0, None), (Rec.OWN_COLL, OWN_KINDS.index(CommKind.ALL_TO_ALL), 1, 5 * 4 * 4),
            (Rec.OWN_ASYNC, OWN_KINDS.index(CommKind.BROADCAST), 1, 2 * 8 * 4), (Rec.OWN_ASYNC, OWN_KINDS.index(CommKind.ALL_TO_ALL), 1, 2 * 8 * 4),
            (Rec.OWN_ASYNC, OWN_KINDS.index(CommKind.ALL_REDUCE), 1, 2 * 8 * 4),  # gloo's reduce-scatter: an all-reduce of its input
            (Rec.OWN_WAIT, OWN_KINDS.index(CommKind.BROADCAST), 0, None), (Rec.OWN_WAIT, OWN_KINDS.index(CommKind.ALL_TO_ALL), 0, None),
            (Rec.OWN_WAIT, OWN_KINDS.index(CommKind.ALL_REDUCE), 0, None)]
    assert [(r[Col.CODE], r[Col.A], r[Col.B], None if r[Col.CODE] == Rec.OWN_WAIT else r[Col.X]) for r in own] == step * 2
    calls = {r[Col.T_NS] for r in own if r[Col.CODE] == Rec.OWN_ASYNC}
    assert {r[Col.X] for r in own if r[Col.CODE] == Rec.OWN_WAIT} == calls


def test_compute_what_ifs_and_the_profilers_cost_leave_them_alone():
    """A faster device or the profiler's cost taken off the host work does not shorten a collective the model ran."""
    from dagprof.passes.compute import scale_compute
    from dagprof.passes.profiler_cost import scale_host_work

    g = open_run(FRESH / "syncbn-sized").graph
    v = in_op_pieces(g)
    for h in (scale_compute(g, 2.0), scale_host_work(g, 0.5)):
        assert np.array_equal(h.dur[v], g.dur[v])
    assert not np.array_equal(scale_compute(g, 2.0).dur, g.dur)


def test_re_bucketing_keeps_them_as_measured():
    """A pass that rebuilds DDP's collectives prices them on the link it was given: the pieces keep their time."""
    from dagprof.passes.buckets import set_buckets

    g = open_run(FRESH / "clip-sized").graph
    h = set_buckets(g, cap_bytes=1 << 20)
    names = lambda x: sorted((x.node_name(int(v)), round(float(x.dur[v]), 6)) for v in in_op_pieces(x))  # noqa: E731
    assert names(h) == names(g) and len(names(g)) == 2 * 2 * 6  # steps x ranks x collectives
