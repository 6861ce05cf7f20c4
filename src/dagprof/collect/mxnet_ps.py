"""Record an MXNet ``dist_sync`` parameter-server job (ps-lite: scheduler, servers, workers) with mx.profiler.

Two halves in one standard-library-only file, because the role half runs under the Python that has
MXNet 1.x (a separate environment: it imports only beside numpy<1.24), not under dagprof's:

- ``python mxnet_ps.py role --out DIR ...`` is the program every process runs; ``DMLC_ROLE`` says
  which. Importing mxnet turns a scheduler or server into its ps-lite loop (it never returns);
  workers train a small Gluon CNN with ``gluon.Trainer(kvstore=dist_sync)`` (the optimizer runs on the
  servers, ``update_on_kvstore``), one ``nd.waitall()`` per step, and profile a window of steps:
  their own operators and C-API calls, and (worker 0 sends the commands) every server's handling.
- ``launch(...)`` starts scheduler, servers and workers (each wrapped in ``timeout``: a worker
  whose scheduler died hangs) through a ``spawn`` callable, so the same code runs on localhost or
  in the namespace testbed, and leaves a run folder that ``dagprof.traces.mxnet`` reads:

  ``mxnet-run.json`` (the manifest: roles, keys with sizes and layers, step times, profiled
  window, timed step times), ``worker<R>.json`` and ``server<K>.json`` (mx.profiler Chrome traces,
  absolute epoch microseconds). Backward ops are visible one by one only with
  ``MXNET_EXEC_BULK_EXEC_TRAIN=0``, which the launcher sets.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Callable

FORMAT = "dagprof-mxnet-run"
VERSION = 1
MANIFEST = "mxnet-run.json"
BIGARRAY_BOUND = 1_000_000  # ps-lite splits arrays of at least this many elements over all servers (MXNET_KVSTORE_BIGARRAY_BOUND)


def _write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


# -- the role program (runs under MXNet's Python) -------------------------------------------------
def _model(mx, width: int):
    from mxnet import gluon

    net = gluon.nn.Sequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1, activation="relu"), gluon.nn.Conv2D(32, 3, padding=1, activation="relu"),
            gluon.nn.MaxPool2D(2), gluon.nn.Flatten(), gluon.nn.Dense(width, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    return net


def _role(args: argparse.Namespace) -> int:
    out = os.path.abspath(args.out)
    import mxnet as mx  # a scheduler or server serves here and exits
    from mxnet import autograd, gluon, nd

    kv = mx.kv.create("dist_sync")
    rank = kv.rank
    mx.random.seed(rank)
    net = _model(mx, args.width)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x = nd.random.uniform(shape=(args.batch, 3, 32, 32))
    y = nd.array([i % 10 for i in range(args.batch)])

    def step() -> None:
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        nd.waitall()  # pushes start after the backward pass, in key order: the trace does not name keys
        trainer.step(args.batch)
        nd.waitall()

    step()  # shapes are inferred on the first forward; keys are initialised on the servers
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    steps: list[list[int]] = []
    k = 1
    for _ in range(args.warmup):
        t0 = time.time_ns()
        step()
        steps.append([k, t0, time.time_ns()])
        k += 1
    profiled = [k, k + args.profile_steps]
    if args.profile_steps:
        opts = dict(profile_symbolic=True, profile_imperative=True, profile_memory=False, profile_api=True, aggregate_stats=False)
        mx.profiler.set_config(filename=os.path.join(out, f"worker{rank}.json"), **opts)
        if rank == 0:  # servers write rank<K>_<filename> in their working directory (the run folder)
            mx.profiler.set_config(filename="server.json", profile_process="server", **opts)
            mx.profiler.set_state("run", profile_process="server")
        kv._barrier()
        mx.profiler.set_state("run")
        t0 = time.time_ns()  # the first step under the profiler pays its start-up: traced, but outside the window
        step()
        steps.append([k, t0, time.time_ns()])
        k += 1
        profiled = [k, k + args.profile_steps]
        for _ in range(args.profile_steps):
            t0 = time.time_ns()
            step()
            steps.append([k, t0, time.time_ns()])
            k += 1
        mx.profiler.set_state("stop")
        kv._barrier()
        if rank == 0:
            mx.profiler.set_state("stop", profile_process="server")
            mx.profiler.dump(profile_process="server")
        mx.profiler.dump()
    timed = []
    kv._barrier()
    for _ in range(args.steps):
        t0 = time.time_ns()
        step()
        t1 = time.time_ns()
        steps.append([k, t0, t1])
        timed.append((t1 - t0) / 1e9)
        k += 1
    layers, keys = [], []
    names = [p.name for p in params]
    # gluon.Trainer numbers its kvstore keys in sorted parameter-name order (frozen ones too, which it never
    # pushes), and ps-lite places a key by that number; the layers stay in model order
    key_of = {name: i for i, name in enumerate(sorted(net.collect_params().keys()))}
    for p in params:
        layer = p.name.rsplit("_", 1)[0]
        if not layers or layers[-1]["name"] != layer:
            layers.append({"name": layer, "op": type(_block_of(net, layer)).__name__, "keys": []})
        layers[-1]["keys"].append(key_of[p.name])
        n = 1
        for d in p.shape:
            n *= d
        keys.append({"key": key_of[p.name], "name": p.name, "shape": list(p.shape), "elements": n, "nbytes": 4 * n, "layer": layer})
    keys.sort(key=lambda k: k["key"])  # trainer.step pushes in key order
    _write_json(os.path.join(out, f"worker{rank}.meta.json"), {
        "rank": rank, "pid": os.getpid(), "steps": steps, "profiled": profiled, "timed_s": timed, "keys": keys, "layers": layers,
        "param_names": names, "num_workers": kv.num_workers, "mxnet": mx.__version__,
    })
    return 0


def _block_of(net, prefix: str):
    for block in net._children.values():
        if block.prefix.rstrip("_") == prefix:
            return block
    return net


# -- the launcher (runs under dagprof's Python) ---------------------------------------------------
Spawn = Callable[[int, list, dict, str], subprocess.Popen]


def local_spawn(node: int, argv: list, env: dict, log: str, cwd: str | None = None) -> subprocess.Popen:
    """Start ``argv`` on this host (every node on 127.0.0.1)."""
    with open(log, "w") as f:
        return subprocess.Popen(argv, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT, cwd=cwd)


def launch(out: str, python: str, *, servers: int = 2, workers: int = 2, warmup: int = 2, profile_steps: int = 3, steps: int = 5,
           batch: int = 32, width: int = 128, port: int = 9391, addr: Callable[[int], str] = lambda node: "127.0.0.1",
           ifname: Callable[[int], str] | None = None, spawn: Callable[..., subprocess.Popen] = local_spawn, timeout_s: float = 300,
           extra: dict | None = None) -> dict:
    """Run one job; nodes 0..servers-1 are servers (the scheduler beside server 0), then the workers.
    Returns the manifest written to ``out/mxnet-run.json``."""
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    me = os.path.abspath(__file__)
    base = {"DMLC_PS_ROOT_URI": addr(0), "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(workers),
            "OMP_NUM_THREADS": "1", "MXNET_EXEC_BULK_EXEC_TRAIN": "0", "MXNET_KVSTORE_BIGARRAY_BOUND": str(BIGARRAY_BOUND), "PS_VERBOSE": "0"}
    argv = ["timeout", "-k", "5", str(int(timeout_s)), python, me, "role", "--out", out, "--warmup", str(warmup),
            "--profile-steps", str(profile_steps), "--steps", str(steps), "--batch", str(batch), "--width", str(width)]
    plan = [("scheduler", 0)] + [("server", s) for s in range(servers)] + [("worker", servers + w) for w in range(workers)]
    procs = []
    try:
        for role, node in plan:
            env = {**base, "DMLC_ROLE": role, "DMLC_NODE_HOST": addr(node)}
            if ifname is not None:
                env["DMLC_INTERFACE"] = ifname(node)
            log = os.path.join(out, {"scheduler": "scheduler", "server": f"server{node}", "worker": f"worker{node - servers}"}[role] + ".log")
            procs.append((role, spawn(node, argv, env, log, cwd=out)))
        deadline = time.monotonic() + timeout_s + 10
        for role, p in procs:
            rc = p.wait(timeout=max(deadline - time.monotonic(), 1))
            if rc != 0:
                raise RuntimeError(f"MXNet {role} exited with {rc}; see the logs in {out}")
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    metas = [json.load(open(os.path.join(out, f"worker{w}.meta.json"))) for w in range(workers)]
    files = {"workers": {}, "servers": {}}
    for w in range(workers):
        os.remove(os.path.join(out, f"worker{w}.meta.json"))
        if profile_steps:
            files["workers"][str(w)] = f"worker{w}.json"
    for s in range(servers):
        src = os.path.join(out, f"rank{s}_server.json")
        if os.path.exists(src):
            os.replace(src, os.path.join(out, f"server{s}.json"))
            files["servers"][str(s)] = f"server{s}.json"
    manifest = {
        "format": FORMAT, "version": VERSION, "kvstore": "dist_sync", "num_workers": workers, "num_servers": servers,
        "bigarray_bound": BIGARRAY_BOUND, "update_on_kvstore": True, "mxnet": metas[0]["mxnet"], "batch": batch, "width": width,
        "keys": metas[0]["keys"], "layers": metas[0]["layers"], "profiled_steps": metas[0]["profiled"], "files": files,
        "steps": {str(m["rank"]): m["steps"] for m in metas}, "timed_s": {str(m["rank"]): m["timed_s"] for m in metas},
        **(extra or {}),
    }
    _write_json(os.path.join(out, MANIFEST), manifest)
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("role", help="the program every ps-lite process runs (DMLC_ROLE says which)")
    r.add_argument("--out", required=True)
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("--profile-steps", type=int, default=3)
    r.add_argument("--steps", type=int, default=5)
    r.add_argument("--batch", type=int, default=32)
    r.add_argument("--width", type=int, default=128)
    loc = sub.add_parser("local", help="run a whole job on this host (127.0.0.1)")
    loc.add_argument("--out", required=True)
    loc.add_argument("--python", required=True, help="the Python that imports mxnet")
    loc.add_argument("--servers", type=int, default=2)
    loc.add_argument("--workers", type=int, default=2)
    loc.add_argument("--fixture", action="store_true", help="gzip the traces and drop the logs (how tests/data/mxnet is recorded)")
    args = ap.parse_args(argv)
    if args.cmd == "role":
        return _role(args)
    m = launch(args.out, args.python, servers=args.servers, workers=args.workers)
    if args.fixture:
        _compact(args.out, m)
    print(args.out)
    return 0


def _compact(out: str, m: dict) -> None:
    """Gzipped traces, no logs: a small folder to keep as a test fixture."""
    import gzip
    import shutil

    for role in ("workers", "servers"):
        for k, name in list(m["files"][role].items()):
            with open(os.path.join(out, name), "rb") as src, gzip.open(os.path.join(out, name + ".gz"), "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
            os.remove(os.path.join(out, name))
            m["files"][role][k] = name + ".gz"
    for f in os.listdir(out):
        if f.endswith(".log"):
            os.remove(os.path.join(out, f))
    _write_json(os.path.join(out, MANIFEST), m)


if __name__ == "__main__":
    sys.exit(main())
