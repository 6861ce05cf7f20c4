"""``dagprof.apply`` and ``optimize --verify``'s zero-code apply on modules given to the composable ``replicate()``: real
2-rank gloo jobs (a strategy's buckets rebuilt in replicate()'s DDP, its accumulation through the module's own sync flag,
the same training as DistributedDataParallel under the same strategy), and the refusals in one line."""
from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")

from dagprof.collect.deploy.strategy import Bucket, Compression, Strategy, save_strategy  # noqa: E402
from dagprof.collect.jobs.launch import Bootstrap, launch  # noqa: E402

WIDTHS = [16, 64, 64, 64, 64, 64, 4]  # six Linear layers, at 0, 2, ... 10 of a Sequential with ReLUs between
LINEARS = [2 * i for i in range(len(WIDTHS) - 1)]
NAMES = [f"{k}.{w}" for k in LINEARS for w in ("weight", "bias")]
SIZES = {f"{k}.weight": WIDTHS[i] * WIDTHS[i + 1] for i, k in enumerate(LINEARS)} | {f"{k}.bias": WIDTHS[i + 1] for i, k in enumerate(LINEARS)}


def strategy(**kw) -> Strategy:
    """Three buckets of two layers each, in gradient-ready order (the last layers first), two micro-batches a step."""
    pairs = [LINEARS[4:], LINEARS[2:4], LINEARS[:2]]
    buckets = tuple(Bucket(tuple(f"{k}.{w}" for k in reversed(p) for w in ("weight", "bias")),
                           4 * sum(SIZES[f"{k}.{w}"] for k in p for w in ("weight", "bias"))) for p in pairs)
    return Strategy(tuple((n, SIZES[n]) for n in NAMES), 2, buckets=buckets, **kw)


# a user's script: the model replicated as torch documents it; MODE "api": dagprof.apply on the module and on a DDP twin,
# trained alike; "hook": apply a compressing strategy beside a comm hook given to the module; "bare": no dagprof call at all
SCRIPT = """
import json, os, sys, torch, torch.nn as nn, torch.distributed as dist
from torch.distributed._composable import replicate
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
from torch.nn.parallel import DistributedDataParallel as DDP
mode, strategy, out = sys.argv[1:4]
dist.init_process_group("gloo")
rank = dist.get_rank()
def model():
    torch.manual_seed(0)
    w = WIDTHS
    layers = []
    for i in range(len(w) - 1):
        layers += [nn.Linear(w[i], w[i + 1]), nn.ReLU()]
    return nn.Sequential(*layers[:-1])
def train(m, plan=None, steps=3):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        for i in range(plan.micro_batches if plan else 1):
            with (plan.sync(i) if plan else torch.enable_grad()):
                m(torch.randn(8, WIDTHS[0], generator=g)).pow(2).mean().backward()
        opt.step(); opt.zero_grad()
    return m
res = {}
if mode == "api":
    import dagprof
    m = replicate(model())
    plan = dagprof.apply(m, strategy)
    res["again"] = dagprof.apply(m, strategy) is plan
    res["state_no_sync_before"] = replicate.state(m)._no_sync
    train(m, plan)
    res["rebuilt"] = replicate.state(m)._ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes")
    res["differences"] = plan.layout_differences()
    twin = DDP(model())
    train(twin, dagprof.apply(twin, strategy))
    res["max_diff"] = max(float((a - b).abs().max()) for a, b in zip(m.parameters(), twin.module.parameters()))
    res["no_sync_after"] = replicate.state(m)._no_sync
elif mode == "hook":
    import dagprof
    from dagprof.errors import DagprofError
    m = replicate(model())
    m.register_comm_hook(None, bf16_compress_hook)
    try:
        dagprof.apply(m, strategy)
    except DagprofError as err:
        res["refused"] = str(err)
else:
    m = replicate(model())
    train(m, steps=4)
    res["rebuilt"] = replicate.state(m)._ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes")
with open(os.path.join(out, f"res{rank}.json"), "w") as f:
    json.dump(res, f)
dist.destroy_process_group()
""".replace("WIDTHS", repr(WIDTHS))


def _run(tmp_path, mode: str, s: Strategy, bootstrap: Bootstrap | None = None) -> list[dict]:
    script, path = tmp_path / "train.py", tmp_path / "strategy.json"
    script.write_text(SCRIPT)
    save_strategy(s, path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), mode, str(path), str(tmp_path)]
    assert launch(cmd, bootstrap, log_dir=str(tmp_path / "log"), timeout_s=300) == 0, (tmp_path / "log" / "job.log").read_text()
    return [json.loads((tmp_path / f"res{r}.json").read_text()) for r in range(2)]


def test_apply_rebuilds_replicates_ddp_buckets_and_accumulates_through_the_modules_sync_flag(tmp_path):
    """The strategy's three buckets are the ones replicate()'s DDP rebuilds; two micro-batches a step (the first with the
    module's gradient sync off) train the module exactly as DistributedDataParallel does under the same strategy."""
    s = strategy(accumulate=2)
    for r in _run(tmp_path, "api", s):
        assert r["again"] and r["differences"] is None
        assert [int(x) for x in r["rebuilt"].split(", ")] == [b.nbytes for b in s.buckets]
        assert r["max_diff"] < 1e-6 and r["state_no_sync_before"] is False and r["no_sync_after"] is False


def test_a_compressing_strategy_beside_the_modules_own_comm_hook_is_refused_in_one_line(tmp_path):
    for r in _run(tmp_path, "hook", strategy(compression=Compression("fp16"))):
        assert r["refused"].endswith("strategy.json: strategy does not fit the job: its comm hook would replace the one given to "
                                     "replicate()'s module (bf16_compress_hook): apply it without that hook") and "\n" not in r["refused"]


def test_the_zero_code_bootstrap_applies_a_strategy_to_a_replicated_module_and_times_its_steps(tmp_path):
    """``optimize --verify``'s runs: the script calls no dagprof API; replicate()'s DDP gets the strategy's buckets at its lazy
    init, and each rank's step times are written with one forward per step (counted on the module, not on DDP's flat list)."""
    s = strategy()
    times = tmp_path / "times"
    for r in _run(tmp_path, "bare", s, Bootstrap(times=str(times), strategy=str(tmp_path / "strategy.json"))):
        assert [int(x) for x in r["rebuilt"].split(", ")] == [b.nbytes for b in s.buckets]
    for rank in range(2):
        t = json.loads((times / f"rank{rank}.json").read_text())
        assert len(t["step_s"]) == 4 and t["micro_batches"] == [1, 1, 1, 1], t
