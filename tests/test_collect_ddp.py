"""Real multi-process gloo DDP runs profiled by dagprof: the API (Kineto on) and the zero-code launcher (hooks only)."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from dagprof.cli.main import main  # noqa: E402
from dagprof.collect.jobs.demo_train import DemoConfig, build_model  # noqa: E402
from dagprof.traces.dagprof_run import read_run  # noqa: E402
from dagprof.traces.events import Kind, LaneKind  # noqa: E402

SMALL = DemoConfig.small()


def leaf_paths():
    return [p for p, m in build_model(SMALL).named_modules() if next(m.children(), None) is None]


def param_bytes():
    return sum(p.numel() * 4 for p in build_model(SMALL).parameters())


@pytest.fixture(scope="module")
def api_run(small_ddp_run):
    """The session's shared run (conftest): the tiny demo model, Kineto on, steps 2-5 of 8."""
    return read_run(small_ddp_run)


@pytest.fixture(scope="module")
def launcher_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp-launcher")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "dagprof.collect.jobs.demo_train",
           "--small", "--steps", "6"]
    assert main(["profile", "-o", str(out), "--steps", "2:4", "--no-kineto", "--"] + cmd) == 0
    return read_run(out)


def check_rank(t, leaves):
    ev = t.events
    assert t.layers == leaves
    steps = t.meta.steps_profiled
    assert steps[0] == 2 and len(steps) >= 2
    assert len(t.buckets) > 2 and sum(b.nbytes for b in t.buckets) == param_bytes()
    assert sorted(p for b in t.buckets for p in b.params) == sorted(p for p, _ in build_model(SMALL).named_parameters())
    for step in steps:
        s = ev.step == step
        for kind in (Kind.FORWARD, Kind.BACKWARD):
            assert sorted(t.layers[i] for i in ev.layer[s & (ev.kind == kind)]) == sorted(leaves)
        enq = np.flatnonzero(s & (ev.kind == Kind.COMM_ENQUEUE) & (ev.bucket >= 0))
        assert sorted(ev.bucket[enq]) == list(range(len(t.buckets)))
        assert ev.nbytes[enq].sum() == param_bytes()
        ddp_wait = np.array(["blocked on a collective" not in ev.names[n] for n in ev.name])  # not the buffer-broadcast waits
        assert (s & (ev.kind == Kind.COMM_WAIT) & ddp_wait).sum() == 1 and (s & (ev.kind == Kind.UPDATE)).sum() == 1
        # depth-0 events of the main lane tile the step
        main = np.flatnonzero(s & (ev.lane == 0) & (ev.depth == 0))
        main = main[np.argsort(ev.start[main])]
        assert np.allclose(ev.end[main[:-1]], ev.start[main[1:]], atol=1e-3)
    comm = np.flatnonzero(ev.kind == Kind.COMM)
    assert all(t.lanes[ev.lane[i]].kind == LaneKind.COMM_THREAD for i in comm)
    assert set(t.meta.comm_lanes) == {t.lanes[ev.lane[i]].name for i in comm}
    # every transfer has its enqueue before it and a successor (the wait) after it
    flows = {tuple(f) for f in t.flows.tolist()}
    for i in comm:
        src = [a for a, b in flows if b == i]
        dst = [b for a, b in flows if a == i]
        assert len(src) == 1 and ev.kind[src[0]] == Kind.COMM_ENQUEUE and ev.seq[src[0]] == ev.seq[i]
        assert len(dst) == 1 and ev.kind[dst[0]] in (Kind.COMM_WAIT, Kind.UPDATE, Kind.FORWARD, Kind.OTHER)
    return {int(ev.seq[i]): (int(ev.bucket[i]), int(ev.nbytes[i])) for i in comm}


def test_api_run_two_ranks(api_run):
    assert api_run.world_size == 2 and api_run.meta.ddp and not api_run.meta.warnings
    leaves = leaf_paths()
    by_rank = [check_rank(t, leaves) for t in api_run.ranks]
    assert by_rank[0] == by_rank[1]  # the same collective at the same (group, seq) on both ranks
    t = api_run.ranks[0]
    assert t.meta.comm_source.startswith("Kineto") and t.backend == "gloo"
    assert any(b < 0 for b, _ in by_rank[0].values())  # DDP's buffer broadcast, visible through Kineto


def test_launcher_zero_code(launcher_run):
    assert launcher_run.meta.manifest.mode == "launcher" and launcher_run.world_size == 2
    leaves = leaf_paths()
    by_rank = [check_rank(t, leaves) for t in launcher_run.ranks]
    assert by_rank[0] == by_rank[1]
    assert launcher_run.ranks[1].meta.comm_source.startswith("comm hook")
    assert launcher_run.ranks[0].meta.kineto is None


def test_launcher_adds_no_collective_to_the_users_job(launcher_run):
    """The zero-code profile never measures the compute slowdown beside collectives inside the user's job (it would add
    collectives to their process group): no overlap.json; ``dagprof calibrate --overlap`` measures it on our own ranks."""
    from dagprof.collect.measure.overlap import load_overlap

    assert load_overlap(launcher_run.source) is None


def test_launcher_without_ddp_says_so(tmp_path, capsys):
    script = "import torch; m = torch.nn.Linear(2, 2); o = torch.optim.SGD(m.parameters(), 0.1)\n" \
             "for _ in range(3): m(torch.ones(1, 2)).sum().backward(); o.step()"
    assert main(["profile", "-o", str(tmp_path), "--", sys.executable, "-c", script]) == 2
    assert "sees only models wrapped in torch.nn.parallel.DistributedDataParallel" in capsys.readouterr().err


def test_launcher_json_summary(tmp_path, capsys):
    assert main(["profile", "--json", "-o", str(tmp_path)]) == 2
    assert "no command to profile" in json.loads(capsys.readouterr().out)["error"]


def test_launcher_failing_command_and_foreign_files(tmp_path, capsys):
    (tmp_path / "rank0.json").write_text('{"traceEvents": []}')  # a user's own file: left alone
    assert main(["profile", "-o", str(tmp_path), "--", sys.executable, "-c", "import sys; sys.exit(3)"]) == 2
    assert "exited with status 3" in capsys.readouterr().err
    assert (tmp_path / "rank0.json").read_text() == '{"traceEvents": []}'


def test_launcher_replaces_an_earlier_profile(tmp_path, capsys):
    stale = ["manifest.json", "rank0.json", "rank0.kineto.json.gz"]
    (tmp_path / "manifest.json").write_text('{"format": "dagprof-run"}')
    (tmp_path / "rank0.json").write_text('{"format":"dagprof-rank","version":1}')
    (tmp_path / "rank0.kineto.json.gz").write_bytes(b"")
    assert main(["profile", "-o", str(tmp_path), "--", sys.executable, "-c", "pass"]) == 2
    assert "no rank wrote a profile" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in stale)


def test_every_profiled_step_records_the_training_threads_cpu_and_waits(api_run, launcher_run):
    """Both collectors' ranks carry, per profiled step, the thread that marked the steps: its CPU and its waits for a
    core from the kernel's schedstat (``collect.hooks.thread_sched``), which ``search.measured.profiled_stretch`` reads."""
    from dagprof.search.measured import profiled_stretch

    for run in (api_run, launcher_run):
        for t in run.ranks:
            steps = t.meta.train_thread
            assert [s.step for s in steps] == t.meta.steps_profiled
            assert all(0 < s.cpu_us <= t.meta.step_times_us[s.step] * 1.01 and s.wait_us >= 0 for s in steps)
            assert all(s.runs is not None and s.runs >= 1 for s in steps)  # the times it got a core (a step's at least once)
            # the process's other threads (gloo's run each bucket's all-reduce): their CPU, waits and runs, summed
            assert all(s.others is not None and s.others.cpu_us >= 0 and s.others.wait_us >= 0 and s.others.runs >= 1 for s in steps)
        assert profiled_stretch(run) >= 1.0
