"""A DDP comm hook the user wrote puts its own collectives on the wire; the collector records them per bucket call
(``Rec.HOOK_COLL``, ``Rec.HOOK_BLOCKING``) and link and worker what-ifs price each bucket at them
(tests/data/ddp-fresh/{int8-hook,topk-hook}: ``bench/ddp_fresh/int8_hook_flow.py``, an int8 all-reduce after a blocking
scale all-reduce; ``bench/ddp_fresh/topk_hook_pointnet.py``, two all-gathers of the top-k values and indices)."""
from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch
from testdata import DATA

from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.passes.buckets import refuse_own_ddp_setup
from dagprof.passes.workers import scale_workers
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import CommKind, CommRole, Kind
from dagprof.traces.run_rank import read_rank
from dagprof.traces.run_schema import Col, Rec

FRESH = DATA / "ddp-fresh"


def hook_comms(g) -> np.ndarray:
    return np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.bucket >= 0))


def test_an_int8_hook_is_priced_at_its_int8_all_reduce():
    run = read_run(FRESH / "int8-hook")
    layout = {b.index: b.nbytes for b in run.ranks[0].buckets}
    for t in run.ranks:
        w = t.meta.hook_wire
        assert t.meta.comm_hook == "int8_hook" and w.kinds == ["all_reduce"] and w.unpriced == 0 and not w.varying
        assert w.blocking == w.calls and w.blocking_bytes == 4 * w.calls  # the scale's one float, blocking inside the call
        assert w.wire == {i: nb // 4 for i, nb in layout.items()}  # one int8 per fp32 gradient
    g = build_graph(run)
    comms = hook_comms(g)
    assert len(comms) == len(g.meta.steps) * len(layout)
    assert all(CommRole(int(g.role[v])) == CommRole.HOOK and CommKind(int(g.comm_kind[v])) == CommKind.ALL_REDUCE for v in comms)
    assert {int(g.bucket[v]): int(g.nbytes[v]) for v in comms} == {i: nb // 4 for i, nb in layout.items()}
    refuse_own_ddp_setup(g, "a link what-if", wire=True)
    refuse_own_ddp_setup(g, "--workers", wire=True)
    with pytest.raises(DagprofError, match=r"--bucket-mb: .*int8_hook.*not modelled"):  # it would re-bucket under the hook
        refuse_own_ddp_setup(g, "--bucket-mb")
    # its all-reduce's bytes stay with more ranks
    assert (scale_workers(g, 4).nbytes[hook_comms(scale_workers(g, 4))] == g.nbytes[comms]).all()


def test_a_topk_hooks_all_gathers_grow_with_the_workers():
    run = read_run(FRESH / "topk-hook")
    (nbytes,) = [b.nbytes for b in run.ranks[0].buckets]
    k = int(0.1 * nbytes // 4)  # --ratio 0.1 of the bucket's fp32 gradients: values (fp32) and indices (int64)
    w = run.ranks[0].meta.hook_wire
    assert w.kinds == ["all_gather"] and w.most == 2 and w.blocking == 0 and w.wire == {0: 2 * k * (4 + 8)}
    g = build_graph(run)
    comms = hook_comms(g)
    assert all(CommKind(int(g.comm_kind[v])) == CommKind.ALL_GATHER and int(g.nbytes[v]) == 2 * k * 12 for v in comms)
    g4 = scale_workers(g, 4)
    assert (g4.nbytes[hook_comms(g4)] == 2 * g.nbytes[comms][0]).all()  # 4 ranks gather twice the rows of 2


def test_without_kineto_the_hooks_span_carries_the_same_wire(tmp_path):
    """The hooks-only reader (the comm hook's issue to completion) prices the bucket alike."""
    for name, kind in (("int8-hook", CommKind.ALL_REDUCE), ("topk-hook", CommKind.ALL_GATHER)):
        t = read_rank(str(FRESH / name / "rank0.json"), kineto=False)
        ev = t.events
        comms = np.flatnonzero((ev.kind == Kind.COMM) & (ev.bucket >= 0))
        assert len(comms) and all(CommKind(int(ev.comm_kind[i])) == kind and CommRole(int(ev.role[i])) == CommRole.HOOK for i in comms)
        assert {int(ev.nbytes[i]) for i in comms} == set(t.meta.hook_wire.wire.values())


def test_kinetos_hook_transfers_are_the_buckets_not_collectives_of_the_model():
    """The hook's int8 all-reduce and blocking scale all-reduce are taken by its bucket: nothing is left as the model's
    own collective or as a host collective outside the buckets."""
    run = read_run(FRESH / "int8-hook")
    for t in run.ranks:
        ev = t.events
        assert not t.meta.unseen_collectives
        assert ((ev.kind == Kind.COMM) & (ev.bucket < 0)).sum() == 0
        assert ((ev.kind == Kind.COMM_ENQUEUE) & (ev.bucket < 0)).sum() == 0


def hooked(g, **change):
    return g.replace(meta=g.meta.replace(hook_wire=msgspec.structs.replace(g.meta.hook_wire, **change)))


def test_what_the_hooks_record_cannot_say_is_refused_in_one_line():
    g = build_graph(read_run(FRESH / "topk-hook"))
    varying = hooked(g, varying=True)  # a size the data decides: the link prices what was measured, more ranks unknown
    refuse_own_ddp_setup(varying, "a link what-if", wire=True)
    with pytest.raises(DagprofError, match=r"--workers: .*other bytes on the wire .* not modelled"):
        refuse_own_ddp_setup(varying, "--workers", wire=True)
    with pytest.raises(DagprofError, match=r"no one kind's all-reduces or all-gathers .* in 1 of its 2 bucket calls"):
        refuse_own_ddp_setup(hooked(g, unpriced=1), "a link what-if", wire=True)
    with pytest.raises(DagprofError, match=r"blocked on 1 collectives .* stay as measured"):
        refuse_own_ddp_setup(hooked(g, blocking=1, blocking_bytes=g.meta.hook_wire.issued_bytes), "a link what-if", wire=True)
    with pytest.raises(DagprofError, match=r"--scheme: .*topk_hook.* calls its own collectives"):
        refuse_own_ddp_setup(g, "--scheme", wire=True)
    with pytest.raises(DagprofError, match="bytes on the wire are not recorded"):
        refuse_own_ddp_setup(g.replace(meta=g.meta.replace(hook_wire=None)), "--workers", wire=True)


def test_a_whatif_under_the_users_hook_answers_and_says_what_stays_measured(tmp_path, capsys):
    assert main(["whatif", str(FRESH / "int8-hook"), "--bandwidth", "200Mbit", "--workers", "4", "--no-trace",
                 "-o", str(tmp_path / "out"), "--allow-model-error"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # wherever the terminal's width folds a line
    assert "comm hook (int8_hook): each bucket priced at the all_reduce it issued" in out
    assert "blocking collectives inside its calls (4 B a call) stay as measured" in out
    assert main(["whatif", str(FRESH / "topk-hook"), "--bucket-mb", "1", "--no-trace", "-o", str(tmp_path / "out"),
                 "--allow-model-error"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "topk_hook" in err[0]


def profiled_under(tmp_path, hook):
    """One gloo rank trains 4 steps of a small DDP MLP with ``hook`` registered inside the window (DDP allows one hook:
    dagprof's runs the user's inside), profiled over steps 1-2 without Kineto: (the run's folder, the module DDP wrapped)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof import profile

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = tmp_path / "run"
        with profile(out, steps=range(1, 3), model=model, kineto=False) as prof:
            model.register_comm_hook(None, hook)
            for _ in range(4):
                opt.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
                prof.step()
    finally:
        dist.destroy_process_group()
    # the model goes at the return, after its group was destroyed: dagprof holds the group (``collect.hooks.exit_gc``), so
    # DDP's reducer does not free it joining gloo's threads with the GIL held (pytorch/pytorch#56297; hung so once, 2026-12-05)
    return out, model.module


def records_of(out) -> np.ndarray:
    from dagprof.traces.run_schema import RankFile

    return np.asarray(msgspec.json.decode((out / "rank0.json").read_bytes(), type=RankFile).records, dtype=np.int64)


def test_the_collector_records_the_collectives_a_users_hook_calls(tmp_path):
    """One gloo rank: a hook of the user's own that blocks on a one-float all-reduce and issues the bucket's for later;
    each call writes one ``Rec.HOOK_BLOCKING`` and one ``Rec.HOOK_COLL`` of the bucket's bytes against its seq."""
    import torch.distributed as dist

    def my_hook(state, bucket):
        dist.all_reduce(torch.ones(1))
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    out, model = profiled_under(tmp_path, my_hook)
    rec = records_of(out)
    enq = rec[rec[:, Col.CODE] == Rec.ENQ_BEGIN]
    coll, blocking = rec[rec[:, Col.CODE] == Rec.HOOK_COLL], rec[rec[:, Col.CODE] == Rec.HOOK_BLOCKING]
    grads = sum(p.numel() * 4 for p in model.parameters())
    assert len(enq) == len(coll) == len(blocking) == 2
    assert sorted(coll[:, Col.B]) == sorted(enq[:, Col.B]) and set(coll[:, Col.X]) == {grads} and set(blocking[:, Col.X]) == {4}
    assert not (rec[:, Col.CODE] == Rec.OWN_COLL).any()  # the hook's calls are not the model's own


def test_a_collective_that_raises_inside_a_users_hook_raises_once_and_profiling_goes_on(tmp_path):
    """The collector's wrapper records and then calls the collective once: an error of the user's own call is the user's
    (caught by the user's code here), never taken for the collector's, which would stop profiling, nor issued again."""
    import warnings

    import torch.distributed as dist

    caught = []

    def my_hook(state, bucket):
        try:
            dist.all_reduce(torch.ones(1), op="not an op")
        except Exception as err:  # noqa: BLE001
            caught.append(type(err))
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        out, _ = profiled_under(tmp_path, my_hook)
    assert len(caught) == 4 and not [w for w in said if "profiling disabled" in str(w.message)]
    assert (records_of(out)[:, Col.CODE] == Rec.HOOK_COLL).sum() == 2


class _Later(torch.futures.Future):
    """A future a timer completes once a callback is chained on it: the callback then runs later, on the timer's thread
    (one rank's own futures complete at once; a timer started earlier could fire before the hook chains it)."""

    def __init__(self, value) -> None:
        super().__init__()
        self.value_later = value

    def then(self, callback):
        import threading

        out = super().then(callback)
        threading.Timer(0.005, self.set_result, (self.value_later,)).start()
        return out


def _delayed_buffer(bucket) -> torch.futures.Future:
    """The bucket's buffer in a future completed after the hook chains its callback (``_Later``)."""
    return _Later(bucket.buffer())


def _reduce_later(buf, f):  # a module-level callback: defined inside no hook
    import torch.distributed as dist

    dist.all_reduce(buf)
    return buf


class _ErrorFeedback:
    """A hook held in an object: ``__call__`` chains a bound method of its own."""

    def __call__(self, state, bucket):
        self.buf = bucket.buffer()
        return _delayed_buffer(bucket).then(self.reduce)

    def reduce(self, f):
        return _reduce_later(self.buf, f)


def _factory(inner):
    """A hook two closures deep: the registered function calls one that calls ``inner``."""
    def middle(state, bucket):
        return inner(state, bucket)

    def outer(state, bucket):
        return middle(state, bucket)

    return outer


def _hook_forms():
    from functools import partial

    from dagprof.collect.deploy.apply import chained

    def delayed(state, bucket):
        return _delayed_buffer(bucket).then(partial(_reduce_later, bucket.buffer()))

    state = _ErrorFeedback()  # DDP refuses the object itself and a partial (no __name__): see the test below
    return {"bound method": state.__call__, "closures": _factory(delayed), "dagprof.apply's chained": chained(delayed)}


def test_collectives_from_a_hooks_callbacks_after_its_call_refuse_the_wire(tmp_path):
    """A hook that calls a collective from a callback chained on a future completed later (PowerSGD's later all-reduces,
    on 2 ranks: gloo's thread runs them): no bucket call holds it (``Rec.HOOK_LATE``), so the wire is refused, not priced
    at the call's part. One rank's futures complete at once, so a timer completes this one (``_Later``)."""
    import torch.distributed as dist

    def delayed_hook(state, bucket):
        buf = bucket.buffer()

        def later(f):
            dist.all_reduce(buf)
            return buf

        return _delayed_buffer(bucket).then(later)

    g = build_graph(read_run(profiled_under(tmp_path, delayed_hook)[0]))
    assert g.meta.hook_wire.late == 2 and g.meta.hook_wire.unpriced == 2
    with pytest.raises(DagprofError, match=r"called 2 collectives from its futures' callbacks"):
        refuse_own_ddp_setup(g, "a link what-if", wire=True)


@pytest.mark.parametrize("form", list(_hook_forms()))
def test_a_hooks_callbacks_are_its_own_whatever_holds_them(tmp_path, form):
    """Callbacks a hook chains are told where it chains them, not by where they were defined: a hook held in an object,
    as a bound method or a ``functools.partial``, or behind closures, whose callbacks are bound methods, partials or other
    module-level functions, has each collective they call recorded (``Rec.HOOK_LATE``), so its wire is refused."""
    g = build_graph(read_run(profiled_under(tmp_path, _hook_forms()[form])[0]))
    assert g.meta.hook_wire.late == 2 and g.meta.hook_wire.unpriced == 2


def test_a_hook_ddp_refuses_is_refused_with_ddps_error_under_dagprof(tmp_path):
    """dagprof's stand-in for ``register_comm_hook`` changes no outcome: the hooks DDP refuses (a callable object or a
    ``functools.partial``: no ``__name__``; a parameter not named ``bucket``; a second hook) raise DDP's own error, and
    one it accepts is accepted and named in DDP's logging data as without dagprof."""
    from functools import partial

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof import profile

    def named(state, bucket):
        return _delayed_buffer(bucket)

    def other(state, grads):
        return _delayed_buffer(grads)

    def outcome(model, hooks):
        try:
            for h in hooks:
                model.register_comm_hook(None, h)
        except Exception as err:  # noqa: BLE001
            return type(err), str(err)
        return model.logger._get_ddp_logging_data().strs_map["comm_hook"]

    cases = {"object": [_ErrorFeedback()], "partial": [partial(named)], "parameter": [other], "twice": [named, named], "named": [named]}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        for case, hooks in cases.items():
            plain = outcome(DDP(torch.nn.Linear(4, 2)), hooks)
            model = DDP(torch.nn.Linear(4, 2))
            with profile(tmp_path / case, steps=range(1, 2), model=model, kineto=False):
                assert outcome(model, hooks) == plain, case
            assert plain == named.__qualname__ if case == "named" else plain[0] in (AttributeError, KeyError, RuntimeError), (case, plain)
    finally:
        dist.destroy_process_group()


def test_a_hook_record_of_no_known_kind_prices_nothing():
    """A damaged file's kind past ``OWN_KINDS`` (or a group other than DDP's: bytes -1) leaves the call unpriced."""
    from dagprof.traces.run_comm import hook_calls, hook_transfer, hook_wire

    rec = np.array([[Rec.ENQ_END, 0, 5, 10, 64], [Rec.HOOK_COLL, 99, 5, 5, 16],
                    [Rec.ENQ_END, 0, 6, 30, 64], [Rec.HOOK_COLL, 1, 6, 25, -1]], dtype=np.int64)
    assert [hook_transfer(c, 2) for c in hook_calls(rec).values()] == [None, None]
    assert hook_wire(rec, 2).unpriced == 2


def test_another_ranks_refusal_facts_refuse_for_the_job():
    """Rank 0's wire is the job's, but a late callback, an unpriced call or blocking bytes on any rank refuse for all."""
    from dagprof.traces.meta import HookWire

    clean = HookWire(calls=4, unpriced=0, kinds=["all_reduce"], most=1, issued_bytes=4000, blocking=0, blocking_bytes=0, late=0,
                     wire={0: 1000}, varying=False)
    other = HookWire(calls=4, unpriced=1, kinds=["all_gather"], most=2, issued_bytes=4000, blocking=4, blocking_bytes=400, late=3,
                     wire={0: 1000}, varying=False)
    both = clean.merged(other)
    assert (both.unpriced, both.late, both.blocking, both.blocking_bytes, both.most) == (1, 3, 4, 400, 2)
    assert both.kinds == ["all_gather", "all_reduce"] and not both.varying and both.wire == clean.wire
    assert clean.merged(None).varying


def test_a_collective_the_collector_does_not_size_leaves_the_hooks_wire_refused(tmp_path):
    """A hook that also calls a collective the collector does not size (here ``dist.barrier``) is refused, not priced at
    its all-reduce alone."""
    import torch.distributed as dist

    def my_hook(state, bucket):
        dist.barrier()
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    g = build_graph(read_run(profiled_under(tmp_path, my_hook)[0]))
    assert g.meta.hook_wire.unpriced == g.meta.hook_wire.calls == 2
    with pytest.raises(DagprofError, match=r"in 2 of its 2 bucket calls \(kinds seen: all_reduce, unknown\)"):
        refuse_own_ddp_setup(g, "a link what-if", wire=True)


def test_a_bucket_call_the_hook_skipped_is_said_as_skipped(tmp_path):
    """A hook that issued nothing for one bucket call (as a local-SGD hook skips steps) has no Kineto transfer to find: the
    rank falls back to the hook's spans, and the warning says the hook skipped it, not that Kineto lost a transfer."""
    import shutil

    from dagprof.traces.run_schema import RankFile

    for f in (FRESH / "int8-hook").iterdir():
        shutil.copy(f, tmp_path / f.name)
    f = msgspec.json.decode((tmp_path / "rank0.json").read_bytes(), type=RankFile)
    rec = np.asarray(f.records, dtype=np.int64)
    first = int(rec[rec[:, Col.CODE] == Rec.HOOK_COLL][0, Col.B])
    keep = ~((rec[:, Col.CODE] == Rec.HOOK_COLL) & (rec[:, Col.B] == first))
    f = msgspec.structs.replace(f, records=[tuple(r) for r in rec[keep].tolist()])
    (tmp_path / "rank0.json").write_bytes(msgspec.json.encode(f))
    said = [str(w) for w in read_rank(str(tmp_path / "rank0.json")).meta.warnings]
    assert any("the comm hook issued no collective for later in 1 of its" in w for w in said)
    assert not any("transfers nowhere" in w for w in said)
