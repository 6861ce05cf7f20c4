"""The PowerSGD benches' pure splits: a chain on both ranks' one clock, a chain beside the backward hand-off by
hand-off, a step's period between the chain's syncs, and a step's backward beside the buckets, and the stock network's
backward beside its own DDP buckets."""
from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import sys

import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import bench_strategy_pace  # noqa: E402
import bench_wire_pace  # noqa: E402
from bench_powersgd_backward import covered, stock_backward, summarise  # noqa: E402
from bench_powersgd_chain import kept_marks, split as split_handoffs  # noqa: E402
from bench_powersgd_parts import callback_cpu_us, split_chains  # noqa: E402
from bench_powersgd_phases import CYCLE, cycle  # noqa: E402


def _chain(n: int, issue: list[float], done: list[float], end: float, cpu: float | None) -> dict:
    return {"bucket": 1, "n": n, "t0": 0.0, "issue": issue, "done": done, "end": end,
            "callback_cpu_us": {"unpack": cpu, "middle": cpu, "decode": None}}


def test_split_chains_from_the_later_rank():
    # rank 1 issues each all-reduce later; the transfers run from its issue to the first completion
    r0 = [_chain(n, [1.0, 3.0, 6.0], [2.0, 4.5, 7.0], 8.0, 100.0) for n in range(3)]
    r1 = [_chain(n, [1.2, 3.2, 6.2], [2.1, 4.5, 7.1], 8.5, 300.0) for n in range(3)]
    s = split_chains([r0, r1], skip=2)
    assert len(s["chain"]) == 1  # the first two occurrences skipped
    assert s["chain"][0] == pytest.approx(7.3e6)
    assert s["transfer_unc"][0] == pytest.approx(0.8e6) and s["peer_wait_unc"][0] == pytest.approx(0.2e6)
    assert s["gap_unpack"][0] == pytest.approx(1.2e6) and s["gap_decode"][0] == pytest.approx(1.5e6)
    assert s["gap_middle_cpu"][0] == 300.0  # the later rank's thread CPU
    # the pieces add up to the chain
    assert sum(s[k][0] for k in ("transfer_unc", "gap_unpack", "transfer_p", "gap_middle", "transfer_q", "gap_decode")) == pytest.approx(s["chain"][0])


def test_callback_cpu_only_on_one_thread():
    marks = [("issue", 0.0, 1), ("done", 1.0, 2), ("issue", 1.5, 2), ("done", 9.0, 3), ("issue", 2.0, 2), ("done", 9.0, 3)]
    cpu = callback_cpu_us(marks, 2.5, 2)
    assert cpu == {"unpack": pytest.approx(5e5), "middle": pytest.approx(5e5), "decode": pytest.approx(5e5)}
    assert callback_cpu_us(marks, 9.5, 3)["decode"] == pytest.approx(5e5)  # decoded on the thread that saw Q complete
    assert callback_cpu_us(marks, 9.5, 4)["decode"] is None


def test_cycle_follows_the_rank_last_at_the_next_sync():
    step0 = {0: {"ready": 5.0, "issued": 7.0, "done": 25.0, "end": 31.0}, 1: {"ready": 4.0, "issued": 6.0, "done": 26.0, "end": 30.0}}
    step1 = {0: {"ready": 36.0, "issued": 38.0, "done": 55.0, "end": 60.0}, 1: {"ready": 37.0, "issued": 40.0, "done": 55.0, "end": 61.0}}
    c = cycle([step0, step1])
    assert c["cycle"] == [33.0]  # 7 -> 40: rank 1 issued last at the next sync
    assert [c[k][0] for k in CYCLE] == [19.0, 4.0, 7.0, 3.0]
    assert sum(c[k][0] for k in CYCLE) == c["cycle"][0]
    assert cycle([step0]) == {"cycle": []}


def test_the_backward_is_its_start_to_the_last_bucket_ready_less_the_hooks_run_inline():
    """A step whose first bucket's hook ran 2 ms on the training thread and stayed in flight 30 ms, its second (last)
    ready at 50 ms: the backward is 48 ms, its CPU and waits less the hook's, the other threads' CPU what the process
    spent beyond the training thread, and the bucket in flight 30 of its 50 ms (10 to 40 ms)."""
    ns = 1_000_000  # schedstat's units: (process CPU, process wait, thread CPU, thread wait), ns
    hook = [0.010, 0.012, 0.040, (5 * ns, 0, 5 * ns, 1 * ns), (7 * ns, 0, 7 * ns, 1 * ns), True]
    last = [0.050, 0.0505, 0.090, (40 * ns, 0, 30 * ns, 8 * ns), (40 * ns, 0, 30 * ns, 8 * ns), True]
    rows = [{"config": "strategy", "block": 0, "step": k, "t0": -0.01, "bwd": 0.0, "bwd_sched": (0, 0, 0, 0), "after_bwd": 0.1,
             "end": 0.12, "hooks": [hook, last]} for k in range(3)]
    got = summarise(rows, skip=1)["strategy"]
    assert got["backward"] == pytest.approx(48.0)
    assert got["inline"] == pytest.approx(2.0)
    assert got["cpu"] == pytest.approx(28.0) and got["wait"] == pytest.approx(8.0)
    assert got["others_cpu"] == pytest.approx(10.0)
    assert got["overlap"] == pytest.approx(0.6)
    assert got["step"] == pytest.approx(130.0)


def test_covered_counts_each_instant_once():
    """Spans that overlap, nest, or start before ``t0`` count the time after ``t0`` that any covers, once."""
    assert covered(1.0, [(0.0, 2.0), (1.5, 3.0), (2.5, 2.8), (4.0, 5.0)]) == pytest.approx(3.0)
    assert covered(0.0, []) == 0.0


def test_stock_backward_on_one_rank(tmp_path):
    """The stock network's A/B on a real one-rank gloo group: a sample per block pair, the share in flight a fraction."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        got = stock_backward(1 << 18, blocks=2, steps=2, batch=2)
    finally:
        dist.destroy_process_group()
    assert len(got.samples) == 2 and got.slowdown >= 0 and 0 <= got.in_flight <= 1


def test_strategy_pace_reads_each_round_against_its_defaults(tmp_path, capsys):
    """``bench_strategy_pace``: each kept round's strategy run over its defaults' run, rank by rank, part by part; the same run
    on both sides reads x1.00 everywhere, and a round cut short (no run) is left out."""
    for mode in ("lossless", "lossy"):
        for side in "AB":
            shutil.copytree(DATA / "ddp-fresh" / "sparse", tmp_path / "w0-2" / mode / "verify" / f"round0-{side}" / "run")
    (tmp_path / "w0-2" / "lossy" / "verify" / "round1-A").mkdir()
    (tmp_path / "w0-2" / "lossy" / "verify" / "round1-B").mkdir()
    rows = bench_strategy_pace.rows_of(str(tmp_path))
    assert [(r["mode"], r["round"]) for r in rows] == [("lossless", 0)] * 2 + [("lossy", 0)] * 2
    assert all(r[f"log_{x}"] == 0.0 for r in rows for x in ("forward", "backward", "optimizer", "stretch"))
    sys.argv = ["bench_strategy_pace.py", str(tmp_path)]
    assert bench_strategy_pace.main() == 0
    out = capsys.readouterr()
    assert "   lossy   forward B/A: x1.00" in out.out and "round1-A/run" in out.err


def _times(folder, step_ms: float) -> None:
    folder.mkdir(parents=True)
    for rank in (0, 1):
        (folder / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "step_s": [step_ms / 1e3] * 6, "micro_batches": [1] * 6}))


def test_strategy_pace_reproducibility(tmp_path):
    """``bench_strategy_pace.reproducibility``: rounds of one cell against each other, pooled over cells; a round cut short
    (no step times) is left out, a cell of one round too."""
    steps = {"lossless": [(300, 300), (300, 290)], "lossy": [(300, 100), (300, 150), (300, 120)]}
    for c in range(2):
        for mode, rounds in steps.items():
            for k, (a, b) in enumerate(rounds):
                _times(tmp_path / f"w{c}-2" / mode / "verify" / f"round{k}-A" / "times", a)
                _times(tmp_path / f"w{c}-2" / mode / "verify" / f"round{k}-B" / "times", b)
    (tmp_path / "w1-2" / "lossy" / "verify" / "round3-A").mkdir()
    (tmp_path / "w1-2" / "lossy" / "verify" / "round3-B").mkdir()
    cells = bench_strategy_pace.rounds_of(str(tmp_path))
    assert [(c["cell"], c["mode"], len(c["strategy_ms"])) for c in cells] == [("w0-2", "lossless", 2), ("w0-2", "lossy", 3),
                                                                               ("w1-2", "lossless", 2), ("w1-2", "lossy", 3)]
    lossless = bench_strategy_pace.reproducibility(cells, "lossless")
    assert lossless["sd_defaults"] == 0.0 and lossless["sd_speedup"] == pytest.approx(math.log(300 / 290) / math.sqrt(2))
    assert lossless["pairs_within"] == 1.0 and lossless["pairs"] == 2 and lossless["rounds"] == 4
    lossy = bench_strategy_pace.reproducibility(cells, "lossy")
    logs = [math.log(3), math.log(2), math.log(2.5)]
    assert lossy["sd_speedup"] == pytest.approx(statistics.stdev(logs)) and lossy["pairs_within"] == 0.0
    assert lossy["exact_within"] == pytest.approx(2 * statistics.NormalDist().cdf(math.log(1.05) / statistics.stdev(logs)) - 1)
    assert bench_strategy_pace.reproducibility(cells[:1], "lossless") is None


def test_wire_pace_summary(capsys):
    """``bench_wire_pace.summary``: per way the median step's parts, each way over the wire-bound run of its round and rank, and
    the probe's costs per MB a rank sent."""
    step = {"forward": [2.0, 1.0, 0.5], "backward": [10.0, 4.0, 1.0], "optimizer": [3.0, 2.0, 1.0], "others_cpu_ms": 1.0}
    machine = {"irq_ms": 0.0, "softirq_ms": 50.0, "steal_ms": 0.0, "net_rx": 10, "net_tx": 5, "timers": 2}
    probe = {"busy": [[3.0, 2.0, 1.0]] * 2, "idle": [[1.0, 1.0, 0.0]] * 2, "gloo_cpu_ms": 4.0, "sent_bytes": 2_000_000,
             "softirq_busy_ms": 30.0, "softirq_idle_ms": 10.0}
    idle = {**step, "forward": [1.0, 0.5, 0.5]}
    runs = [{"mode": "wire", "round": 0, "rank": 0, "steps": [step] * 8, "machine": machine, "sent_bytes": 8e6, "probe": [probe]},
            {"mode": "idle", "round": 0, "rank": 0, "steps": [idle] * 8, "machine": machine, "sent_bytes": 0, "probe": []}]
    bench_wire_pace.summary(runs)
    out = capsys.readouterr().out
    assert "forward cpu, idle over wire per round and rank: x0.50 (0.50-0.50, 1 pairs)" in out
    assert "wire (1 rank-runs), per step ms: forward wall 2.00 cpu 1.00 wait 0.50 rest 0.50;" in out
    assert "sent 2.00 MB; machine softirq 12.50" in out  # 8 steps less the 4 of warm-up
    assert "gloo's threads' CPU 2.00; the machine's softirq, busy less idle 10.00; forward wall, busy less idle 2.00; forward CPU, busy less idle 1.00" in out


def _marks(rank_late_ms: float) -> dict:
    """One rank's marks for steps 0-1 of bucket 0: the training thread (tid 1) runs the hook and issues the first
    all-reduce, gloo's worker 2 completes each, the callbacks' thread 3 issues P and Q and ends; every thread's
    (CPU, wait) in ns grows by known amounts."""
    ms = 1_000_000
    marks = []
    for step in (0, 1):
        base = step * 100 * ms
        cpu = {1: 0, 2: 0, 3: 0}
        wait = {1: 0, 2: 0, 3: 0}

        def at(t_ms: float, b: int, what: str, tid: int, grow: dict[int, tuple[float, float]]) -> None:
            for k, (c, w) in grow.items():
                cpu[k] += int(c * ms)
                wait[k] += int(w * ms)
            marks.append([step, b, what, base + int(t_ms * ms), tid, {str(k): (cpu[k], wait[k]) for k in cpu}])

        at(0.0, -1, "ready", 1, {})
        at(0.0, 0, "hook", 1, {})
        at(3.0 + rank_late_ms, 0, "issue", 1, {1: (2.5, 0.5)})  # the hook: 2.5 ms CPU, 0.5 waiting for a core
        at(6.0, 0, "done", 2, {2: (0.2, 1.0)})  # the uncompressed all-reduce: gloo's thread waits 1 ms for a core
        at(6.5, 0, "issue", 3, {3: (0.4, 0.0)})  # unpack on the callbacks' thread, 0.1 ms asleep
        at(10.0, 0, "done", 2, {2: (0.3, 2.0)})
        at(12.0, 0, "issue", 3, {3: (1.5, 0.25)})  # orthogonalise, Q = M^T P
        at(15.0, 0, "done", 2, {2: (0.3, 1.5)})
        at(20.0, -1, "ready", 1, {1: (20.0, 2.0)})
        at(18.0, 0, "end", 3, {3: (2.0, 0.5)})  # decode, error feedback
    return {"main": 1, "marks": marks}


def test_chain_beside_the_backward_split_hand_off_by_hand_off():
    out = split_handoffs([_marks(0.0), _marks(1.0)], bucket=0, skip=1)
    assert len(out["chain.wall"]) == 2  # step 1 on both ranks
    r0 = {k: v[0] for k, v in out.items()}
    assert r0["hook.wall"] == pytest.approx(3.0) and r0["hook.cpu"] == pytest.approx(2.5) and r0["hook.wait"] == pytest.approx(0.5)
    assert r0["unc.wire"] == pytest.approx(3.0) and r0["unc.gloo_wait"] == pytest.approx(1.0) and r0["unc.gloo_cpu"] == pytest.approx(0.2)
    assert r0["unc.peer_lag"] == pytest.approx(1.0)  # rank 1 issued the first all-reduce 1 ms later
    assert r0["unc.after"] == pytest.approx(0.5) and r0["unc.cb_cpu"] == pytest.approx(0.4) and r0["unc.asleep"] == pytest.approx(0.1)
    assert r0["p.cb_wait"] == pytest.approx(0.25) and r0["q.cb_cpu"] == pytest.approx(2.0)
    assert r0["chain.end_after_backward"] == pytest.approx(-2.0)
    for name in ("unc", "p", "q"):  # each completion's remainder: CPU, a wait for a core, or asleep
        assert r0[f"{name}.cb_cpu"] + r0[f"{name}.cb_wait"] + r0[f"{name}.asleep"] == pytest.approx(r0[f"{name}.after"])
    # the parts add up to the chain, the first issue to the hook's end
    assert sum(r0[f"{n}.{k}"] for n in ("unc", "p", "q") for k in ("wire", "after")) == pytest.approx(r0["chain.wall"])
    assert out["unc.peer_lag"][1] == 0.0  # rank 1 was the later
    # rank 0's 3 ms: gloo's thread waited 1 ms for a core on the slower rank, the peer issued 1 ms later, 1 ms neither
    assert r0["unc.either_wait"] == pytest.approx(1.0) and r0["unc.unexplained"] == pytest.approx(1.0)


def test_chain_split_of_the_kept_testbed_marks():
    """The fixed recording's split (docs/evidence.md, branch psgdchain): every rank-step past the first 4 has its chain,
    and the medians the evidence quotes."""
    docs = [json.loads((DATA / "powersgd-chain" / f"marks.{r}").read_text()) for r in (0, 1)]
    out = split_handoffs(docs, bucket=0, skip=4)
    assert len(out["chain.wall"]) == 40
    for k in range(40):  # the parts add up to each chain
        assert sum(out[f"{n}.{p}"][k] for n in ("unc", "p", "q") for p in ("wire", "after")) == pytest.approx(out["chain.wall"][k])
    med = {k: statistics.median(v) for k, v in out.items()}
    assert med["chain.wall"] == pytest.approx(17.59, abs=0.01)
    assert [round(med[f"{n}.wire"], 2) for n in ("unc", "p", "q")] == [3.54, 3.83, 3.36]
    assert [round(med[f"{n}.gloo_wait"], 2) for n in ("unc", "p", "q")] == [0.04, 2.15, 1.66]
    assert [round(med[f"{n}.after"], 2) for n in ("unc", "p", "q")] == [0.13, 1.6, 2.49]
    share = {n: sum(out[f"{n}.either_wait"]) / sum(out[f"{n}.wire"]) for n in ("unc", "p", "q")}
    assert [round(share[n], 2) for n in ("unc", "p", "q")] == [0.23, 0.85, 0.65]  # the slower rank's gloo threads waiting for a core
    # 3 of the 40 chains ran inline on the training thread (the uncompressed all-reduce done before the hook attached its callbacks)
    assert sum(out["unc.on_training_thread"]) == 3 and out["unc.on_training_thread"] == out["q.on_training_thread"]


def test_kept_marks_that_are_missing_or_not_marks_are_refused_in_one_line(tmp_path):
    """``--offline DIR`` reads both ranks' kept marks; a missing file, or one that is not a marks file, is one line naming it."""
    assert [d["main"] for d in kept_marks(str(DATA / "powersgd-chain"))] == [d["main"] for d in (
        json.loads((DATA / "powersgd-chain" / f"marks.{r}").read_text()) for r in (0, 1))]
    with pytest.raises(SystemExit, match=f"{tmp_path / 'marks.0'}: not a kept marks file .FileNotFoundError"):
        kept_marks(str(tmp_path))
    (tmp_path / "marks.0").write_text("[1]")
    with pytest.raises(SystemExit, match="marks.0: not a kept marks file .no 'main' and 'marks'."):
        kept_marks(str(tmp_path))


def test_chain_split_of_the_kept_embedding_marks_one_bucket_after_the_backward():
    """The embedding's one bucket (``--workload embed``, docs/evidence.md, branch psgdfresh): its chain starts at the last
    gradient, so no chain has a second bucket's ready to end after; every rank-step past the first 4 has its chain, the
    parts add up, the 139 KB P all-reduce is the longest of the three, and the callbacks ran on gloo's thread each time."""
    docs = [json.loads((DATA / "powersgd-chain-embed" / f"marks.{r}").read_text()) for r in (0, 1)]
    out = split_handoffs(docs, bucket=0, skip=4)
    assert len(out["chain.wall"]) == 72 and "chain.end_after_backward" not in out
    for k in range(72):
        assert sum(out[f"{n}.{p}"][k] for n in ("unc", "p", "q") for p in ("wire", "after")) == pytest.approx(out["chain.wall"][k])
    med = {k: statistics.median(v) for k, v in out.items()}
    assert med["chain.wall"] == pytest.approx(14.70, abs=0.01)
    assert [round(med[f"{n}.wire"], 2) for n in ("unc", "p", "q")] == [1.5, 6.65, 2.17]
    assert [round(med[f"{n}.after"], 2) for n in ("unc", "p", "q")] == [0.13, 1.16, 1.79]
    assert sum(out["unc.on_training_thread"]) == 0
