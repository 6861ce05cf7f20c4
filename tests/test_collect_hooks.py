"""dagprof.profile in one process (no DDP): hook records, partition of each step, failure and bad-input handling."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dagprof.collect import parse_steps, profile  # noqa: E402
from dagprof.errors import DagprofError  # noqa: E402
from dagprof.traces.dagprof_run import read_run  # noqa: E402
from dagprof.traces.events import Dep, Kind, LaneKind  # noqa: E402
from dagprof.traces.load import load  # noqa: E402
from dagprof.traces.run_schema import MANIFEST, rank_file  # noqa: E402

LEAVES = ["0", "1", "2", "3.0", "3.1", "4"]


def tiny_model():
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 16), nn.Sequential(nn.Tanh(), nn.Linear(16, 16)), nn.Linear(16, 2))


def train(out, steps, n=5, model=None, kineto=False, pass_model=True, before_step=None):
    model = model or tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    with profile(out, steps=steps, model=model if pass_model else None, kineto=kineto) as prof:
        for i in range(n):
            if before_step:
                before_step(i, prof)
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            prof.step()
    return prof


def check_partition(trace):
    """Depth-0 events of the main lane tile every step exactly."""
    ev = trace.events
    for step, t0, t1 in trace.step_spans():
        sel = np.flatnonzero((ev.lane == 0) & (ev.depth == 0) & (ev.step == step))
        sel = sel[np.argsort(ev.start[sel])]
        assert ev.start[sel[0]] == pytest.approx(t0, abs=1e-3)
        assert ev.end[sel[-1]] == pytest.approx(t1, abs=1e-3)
        assert np.allclose(ev.end[sel[:-1]], ev.start[sel[1:]], atol=1e-3)  # no gap, no overlap
        assert (ev.dur[sel] >= 0).all()


def test_parse_steps():
    assert parse_steps("10:20") == range(10, 20)
    assert parse_steps((3, 5)) == range(3, 5)
    assert parse_steps(4) == parse_steps("4") == range(4, 5)  # a number is one step, everywhere
    for bad in ("10:5", "x", "-1", (3, 3)):
        with pytest.raises(ValueError):
            parse_steps(bad)


def test_plain_model_layers_steps_update(tmp_path):
    prof = train(tmp_path, range(1, 3))
    assert not prof.warnings
    run = read_run(tmp_path)
    (t,) = run.ranks
    assert run.world_size == 1 and not run.meta.ddp
    assert any("not a DDP job" in str(w) for w in run.meta.warnings)
    assert t.layers == LEAVES
    assert t.meta.steps_profiled == [1, 2]
    assert sorted(t.meta.unprofiled_step_times_us) == [0, 3, 4]
    ev = t.events
    for step in (1, 2):
        in_step = ev.step == step
        for kind in (Kind.FORWARD, Kind.BACKWARD):
            layers = ev.layer[in_step & (ev.kind == kind)]
            assert sorted(t.layers[i] for i in layers) == sorted(LEAVES)  # one node per leaf call
        assert (in_step & (ev.kind == Kind.UPDATE)).sum() == 1
        assert not (in_step & np.isin(ev.kind, [Kind.COMM, Kind.COMM_ENQUEUE, Kind.COMM_WAIT])).any()
        fwd = np.flatnonzero(in_step & (ev.kind == Kind.FORWARD))
        bwd = np.flatnonzero(in_step & (ev.kind == Kind.BACKWARD))
        assert [t.layers[ev.layer[i]] for i in fwd[np.argsort(ev.start[fwd])]] == LEAVES
        assert [t.layers[ev.layer[i]] for i in bwd[np.argsort(ev.start[bwd])]] == LEAVES[::-1]
        assert ev.start[fwd].max() < ev.start[bwd].min() < ev.start[in_step & (ev.kind == Kind.UPDATE)][0]
    check_partition(t)
    assert t.meta.layer_grad_bytes["0"] == (8 * 16 + 16) * 4
    assert t.meta.layer_output_bytes["0"] == 4 * 16 * 4  # what it returned: the gradient reaching it is as large (DDP -> FSDP's memory)
    with pytest.raises(DagprofError, match="not a DDP job"):
        read_run(tmp_path, require_ddp=True)


def test_a_compiled_model_is_left_unhooked(tmp_path):
    """Hooks on a compiled model's modules would be traced by Dynamo, which breaks its graphs at each and recompiles
    them (the profiled steps of bench/ddp_fresh/compiled_lm.py ran 1.9-2.8x the others): none is installed, no graph
    breaks in the window, and the parameters' gradient hooks, outside the graphs, still count what the reader warns of."""
    from torch._dynamo.utils import counters

    model = torch.compile(tiny_model(), backend="eager")
    hooked = []
    train(tmp_path, range(2, 4), model=model, before_step=lambda i, prof: hooked.append(any(m._forward_hooks for m in model.modules())))
    assert hooked == [False] * 5 and not counters["graph_break"]
    assert not json.loads((tmp_path / rank_file(0)).read_text())["layer_saved_bytes"]
    (said,) = [str(w) for w in read_run(tmp_path).meta.warnings if "no layer's forward or backward hook ran" in str(w)]
    assert "16 gradients were accumulated in its 2 profiled steps" in said


def test_a_block_compiled_in_place_leaves_the_model_unhooked(tmp_path):
    """``block.compile()`` (per-block compile before FSDP's ``fully_shard``: bench/fsdp_fresh/compiled_fsdp.py --compile
    blocks) makes no OptimizedModule, and Dynamo does not guard on hooks added after it compiled: the hooks on the block's
    leaves never ran, silently, and its forward and backward were gaps among the timed layers outside it (no warning).
    The model is left unhooked like a compiled one, and the reader warns."""
    model = tiny_model()
    model[3].compile(backend="eager")
    hooked = []
    train(tmp_path, range(2, 4), model=model, before_step=lambda i, prof: hooked.append(any(m._forward_hooks for m in model.modules())))
    assert hooked == [False] * 5
    (said,) = [str(w) for w in read_run(tmp_path).meta.warnings if "no layer's forward or backward hook ran" in str(w)]
    assert "16 gradients were accumulated in its 2 profiled steps" in said


def test_model_discovered_and_kineto_written(tmp_path):
    train(tmp_path, range(1, 2), n=3, pass_model=False, kineto=True)
    (t,) = read_run(tmp_path).ranks
    assert t.layers == LEAVES
    assert os.path.exists(tmp_path / "rank0.kineto.json.gz")
    with gzip.open(tmp_path / "rank0.kineto.json.gz", "rt") as f:
        doc = json.load(f)
    assert any(e.get("name") == "ProfilerStep#1" for e in doc["traceEvents"])
    check_partition(t)


def test_hook_failure_disables_profiling_not_training(tmp_path):
    class Exploding(list):
        def append(self, item):
            raise RuntimeError("boom")

    def sabotage(i, prof):
        if i == 2:
            prof._collector.records = Exploding(prof._collector.records)

    with pytest.warns(RuntimeWarning, match="profiling disabled.*boom"):
        prof = train(tmp_path, range(1, 4), n=6, before_step=sabotage)
    assert prof._collector.step == 6  # training went on to the end
    run = read_run(tmp_path)  # step 1 was complete before the failure
    assert run.ranks[0].meta.steps_profiled == [1]
    assert any("boom" in str(w) for w in run.meta.warnings)


def test_window_past_the_end(tmp_path):
    train(tmp_path, range(50, 60), n=20)
    with pytest.raises(DagprofError, match=r"steps 50-59 requested but training ended after 20 steps \(last step 19\)"):
        read_run(tmp_path)


def test_window_cut_short_keeps_what_ran(tmp_path):
    train(tmp_path, range(2, 10), n=5)
    run = read_run(tmp_path)
    assert run.ranks[0].meta.steps_profiled == [2, 3, 4]
    assert any("steps 2-9 requested but training ended after 5 steps" in str(w) for w in run.meta.warnings)


def test_bad_run_folders(tmp_path):
    with pytest.raises(DagprofError, match="not a dagprof run folder"):
        read_run(tmp_path)
    train(tmp_path, range(1, 2), n=2)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    (tmp_path / MANIFEST).write_text(json.dumps({**manifest, "world_size": 2}))
    rank0 = (tmp_path / rank_file(0)).read_text()
    (tmp_path / rank_file(0)).write_text(json.dumps({**json.loads(rank0), "world_size": 2}))
    with pytest.raises(DagprofError, match=r"rank 1 of 2: nothing written \(no rank1.json"):
        load(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    (tmp_path / rank_file(0)).write_text(rank0)
    body = (tmp_path / rank_file(0)).read_bytes()
    (tmp_path / rank_file(0)).write_bytes(body[: len(body) // 2])
    with pytest.raises(DagprofError, match=r"rank0.json: corrupt or truncated"):
        read_run(tmp_path)


def test_truncated_kineto_trace(tmp_path):
    train(tmp_path, range(1, 2), n=2, kineto=True)
    path = tmp_path / "rank0.kineto.json.gz"
    body = path.read_bytes()
    path.write_bytes(body[: len(body) // 3])
    with pytest.raises(DagprofError, match="rank0.kineto.json.gz"):
        read_run(tmp_path)


def test_stale_rank_file_from_another_run(tmp_path):
    train(tmp_path, range(1, 2), n=2)
    doc = json.loads((tmp_path / rank_file(0)).read_text())
    doc.update(rank=1, world_size=2, pid=doc["pid"] + 1, records=[[r[0], r[1], r[2], r[3] - 3600 * 10**9, r[4]] for r in doc["records"]])
    (tmp_path / rank_file(1)).write_text(json.dumps(doc))
    (tmp_path / rank_file(0)).write_text(json.dumps({**json.loads((tmp_path / rank_file(0)).read_text()), "world_size": 2}))
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    (tmp_path / MANIFEST).write_text(json.dumps({**manifest, "world_size": 2}))
    with pytest.raises(DagprofError, match="3600 s apart: they are from different runs"):
        read_run(tmp_path)


def test_import_dagprof_does_not_import_torch():
    code = "import sys, dagprof, dagprof.collect, dagprof.traces.dagprof_run; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_layer_ranges_appear_in_kineto(tmp_path):
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(tmp_path, steps=range(0, 1), model=model, kineto=True, ranges=True) as prof:
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        prof.step()
    with gzip.open(tmp_path / "rank0.kineto.json.gz", "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {f"{leaf}.forward" for leaf in LEAVES} <= names
    check_partition(read_run(tmp_path).ranks[0])


def test_ddp_user_comm_hook_registered_later_is_wrapped(tmp_path, one_rank_group):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(tiny_model(), bucket_cap_mb=0.0005)
    called = []

    def user_hook(state, bucket):
        called.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    out = tmp_path / "run"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(out, steps=range(1, 3), model=model, kineto=False) as prof:
        model.register_comm_hook(None, user_hook)  # DDP allows one hook: ours runs the user's inside
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            prof.step()
    run = read_run(out, require_ddp=True)
    (t,) = run.ranks
    assert called and len(t.buckets) > 1 and t.backend == "gloo"
    ev = t.events
    for step in (1, 2):
        s = ev.step == step
        assert sorted(ev.bucket[s & (ev.kind == Kind.COMM_ENQUEUE)]) == list(range(len(t.buckets)))
        assert (s & (ev.kind == Kind.COMM)).sum() == len(t.buckets)
        assert (s & (ev.kind == Kind.COMM_WAIT)).sum() == 1
    check_partition(t)


def test_ddp_attached_after_training_started(tmp_path, one_rank_group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(tiny_model(), bucket_cap_mb=0.0005)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def one_step():
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()

    one_step()
    one_step()  # DDP has rebuilt its buckets by now
    with profile(tmp_path / "run", steps=range(0, 2), kineto=False) as prof:  # model found at its first call
        for _ in range(2):
            one_step()
            prof.step()
    (t,) = read_run(tmp_path / "run", require_ddp=True).ranks
    assert t.meta.bucket_cap_mb == pytest.approx(0.0005, rel=1e-3)
    assert ((t.events.kind == Kind.COMM) & (t.events.step == 1)).sum() == len(t.buckets) > 1


def test_dataloader_time_is_data(tmp_path):
    from torch.utils.data import DataLoader, TensorDataset

    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(16, 8), torch.randn(16, 2)), batch_size=4)
    original_next = torch.utils.data.dataloader._BaseDataLoaderIter.__next__
    with profile(tmp_path, steps=range(1, 3), model=model, kineto=False) as prof:
        for x, y in loader:
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            prof.step()
    assert torch.utils.data.dataloader._BaseDataLoaderIter.__next__ is original_next  # patch undone
    (t,) = read_run(tmp_path).ranks
    ev = t.events
    for step in (1, 2):
        s = ev.step == step
        data = np.flatnonzero(s & (ev.kind == Kind.DATA))
        assert len(data) == 1
        assert ev.start[data[0]] < ev.start[s & (ev.kind == Kind.FORWARD)].min()
    check_partition(t)


def test_gpu_kernels_from_kineto_join_the_layer_that_launched_them(tmp_path):
    """A CPU run's Kineto trace with a kernel, its launch and a stream sync added in the format GPU traces use."""
    train(tmp_path, range(1, 2), n=2, kineto=True)
    (t,) = read_run(tmp_path).ranks
    ev = t.events
    fwd = int(np.flatnonzero((ev.kind == Kind.FORWARD) & (ev.layer == t.layers.index("2")))[0])
    upd = int(np.flatnonzero(ev.kind == Kind.UPDATE)[0])
    path = tmp_path / "rank0.kineto.json.gz"
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    base = doc["baseTimeNanoseconds"]
    main_tid = next(e["tid"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    pid = next(e["pid"] for e in doc["traceEvents"] if e.get("tid") == main_tid)

    def kineto_us(i, frac):
        return (t.base_ns + (ev.start[i] + frac * ev.dur[i]) * 1e3 - base) / 1e3

    launch, sync = kineto_us(fwd, 0.5), kineto_us(upd, 0.5)
    doc["traceEvents"] += [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": main_tid, "ts": launch, "dur": 0.1,
         "args": {"correlation": 424242}},
        {"ph": "X", "cat": "kernel", "name": "void gemm_kernel<float>", "pid": 0, "tid": 7, "ts": launch + 5, "dur": 3.0,
         "args": {"correlation": 424242, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": pid, "tid": main_tid, "ts": sync, "dur": 0.1,
         "args": {"correlation": 424243}},
    ]
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    (t,) = read_run(tmp_path).ranks
    ev = t.events
    (k,) = np.flatnonzero(np.array([ev.name_of(i) == "void gemm_kernel<float>" for i in range(len(ev))]))
    assert t.lanes[ev.lane[k]].kind == LaneKind.GPU_STREAM
    assert ev.kind[k] == Kind.FORWARD and t.layers[ev.layer[k]] == "2" and ev.step[k] == 1
    # joined where the trace joins them: after its launch call, a call inside the forward span (not after the span's
    # end); the sync call inside the update span waits for it
    rule = {tuple(f): Dep(int(r)) for f, r in zip(t.flows.tolist(), t.rules().tolist())}
    (call,) = [u for (u, v), r in rule.items() if v == k and r == Dep.LAUNCH]
    (sync,) = [v for (u, v), r in rule.items() if u == k and r == Dep.SYNC]
    for inner, outer in ((call, fwd), (sync, upd)):
        assert ev.depth[inner] == 1 and ev.lane[inner] == ev.lane[outer]
        assert ev.start[outer] <= ev.start[inner] <= ev.start[inner] + ev.dur[inner] <= ev.start[outer] + ev.dur[outer]
    check_partition(t)


def test_the_training_threads_cpu_and_waits_survive_in_the_step_files(tmp_path):
    """Each step's CPU and waits for a core of the thread that marks the steps (and its process's CPU) go into the step log
    as the step completes: a rank killed mid-window (here its folder copied then) keeps those of its completed steps."""
    import shutil

    cut = tmp_path / "cut"

    def snapshot(i, prof):
        if i == 3:  # steps 1 and 2 of the window 1-3 completed
            shutil.copytree(tmp_path / "run", cut)

    train(tmp_path / "run", range(1, 4), before_step=snapshot)
    whole = read_run(tmp_path / "run").ranks[0].meta
    assert [s.step for s in whole.train_thread] == [1, 2, 3] and all(s.cpu_us > 0 <= s.wait_us for s in whole.train_thread)
    # the steps outside the window too, each with its process's CPU (every thread's): what the profiler added is told by them
    assert [s.step for s in whole.unprofiled_train_thread] == sorted(whole.unprofiled_step_times_us)
    assert all(s.process_cpu_us > 0 for s in whole.train_thread + whole.unprofiled_train_thread)
    rebuilt = read_run(cut).ranks[0].meta
    assert not (cut / rank_file(0)).exists() and rebuilt.train_thread == whole.train_thread[:2]
    assert rebuilt.unprofiled_train_thread == [s for s in whole.unprofiled_train_thread if s.step < 1]


def installed(model):
    """What a collector may change in the process: FSDP's unit methods and the c10d functions it patches, autograd's
    backward, the DataLoader's ``next``, module and parameter hooks, torch.profiler's state and Python's profile/trace."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.utils.data import dataloader

    return {"group": dict(vars(FSDPParamGroup)), "dist": dict(vars(dist)), "backward": torch.autograd.backward,
            "next": dataloader._BaseDataLoaderIter.__next__, "profiler": torch.autograd._profiler_enabled(),
            "module_hooks": sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules()),
            "param_hooks": sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in model.parameters()),
            "sys": (sys.getprofile(), sys.gettrace())}


def test_fsdp_steps_outside_the_window_run_unpatched(tmp_path, one_rank_group):
    """The profiler must not slow the steps outside its window (the cost correction compares the job's steps inside the
    window with those outside it, and cannot see a cost both pay): an FSDP2 job's patches, hooks and torch.profiler are
    all in place during the window only, and the process after it is as before it (bench/review6/convnext_accum.py)."""
    from torch.distributed.fsdp import fully_shard

    model = tiny_model()
    fully_shard(model[3])
    fully_shard(model)
    seen = []
    train(tmp_path, range(1, 3), n=4, model=model, kineto=True, before_step=lambda i, prof: seen.append(installed(model)))
    seen.append(installed(model))
    before, inside = seen[0], seen[1]  # as each step begins: 0 before the window, 1 and 2 in it, 3 after it; then at exit
    assert before == seen[3] == seen[4]
    assert inside["group"] != before["group"] and inside["dist"] != before["dist"] and inside["backward"] is not before["backward"]
    assert inside["profiler"] and inside["module_hooks"] > before["module_hooks"] and inside["param_hooks"] > 0


def test_async_calls_under_a_comm_hook_are_the_buckets_not_the_models(tmp_path, one_rank_group):
    """The model's own asynchronous all-reduce is recorded (``Rec.OWN_ASYNC``); the one the user's comm hook issues for a
    bucket is not (the bucket recorder has it): told by the hook's code on the stack, however deep the call."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof.traces.run_schema import Rec

    class Gathers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = tiny_model()

        def forward(self, x):
            dist.all_reduce(x, async_op=True).wait()  # the model's own: one a step
            return self.inner(x)

    def send(tensor):  # a helper the hook calls: the hook's frame is further up
        return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])

    def user_hook(state, bucket):
        return send(bucket.buffer())

    model = DDP(Gathers(), bucket_cap_mb=0.0005)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(tmp_path / "run", steps=range(1, 3), model=model, kineto=True) as prof:
        model.register_comm_hook(None, user_hook)
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            prof.step()
    own = [r for r in prof._collector.records if r[0] == Rec.OWN_ASYNC]
    assert len(own) == 2 and all(r[4] == 4 * 8 * 4 for r in own)  # two steps of one (4, 8) float32 tensor
