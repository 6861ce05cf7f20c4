"""Record an MXNet ``dist_sync`` parameter-server job (ps-lite: scheduler, servers, workers) with mx.profiler.

Standard library only: it runs under the Python that has MXNet 1.x, which pins numpy<1.24 and so cannot
hold dagprof's dependencies. Two halves:

- ``profile(trainer)``, the lines a user adds to a ``dist_sync`` training script::

      from dagprof.collect import mxnet_ps
      with mxnet_ps.profile(trainer) as prof:
          for x, y in batches:
              with autograd.record():
                  loss = loss_fn(net(x), y)
              loss.backward()
              trainer.step(batch_size)
              prof.step()  # marks the end of a step (waits for it: nd.waitall)

  (a loop with no Trainer, pushing and pulling itself: ``profile(kv, net, params=params)``, key ``i`` = ``params[i]``).

  After ``warmup`` steps it turns mx.profiler on in every worker and (worker 0 sends the commands)
  every server, for one start-up step and ``profile_steps`` steps, then off; the steps after are
  timed without the profiler. On exit it writes ``worker<R>.meta.json`` (steps, keys, layers, a row_sparse key's
  rows per step) into the run folder, which the launcher turns into the manifest.
- ``launch_command(out, command, ...)`` (``python -m dagprof.collect.hooks.mxnet_ps run --out DIR -- CMD``)
  starts the scheduler and servers (this file's ``role`` program) and the workers (the user's
  command) with the ``DMLC_*`` variables, each wrapped in ``timeout`` (a worker whose scheduler died
  hangs), through a ``spawn`` callable (the same code runs on localhost or in the namespace
  testbed), puts this package on the workers' ``PYTHONPATH`` and writes the manifest.
  ``launch(...)`` runs the built-in script (a small Gluon CNN, ``nd.waitall()`` before the pushes).

The run folder: ``mxnet-run.json`` (the manifest, ``traces.mxnet.MxManifest``), ``worker<R>.json`` and
``server<K>.json`` (mx.profiler Chrome traces, absolute epoch microseconds). Backward ops are
visible one by one only with ``MXNET_EXEC_BULK_EXEC_TRAIN=0``, which the launcher sets.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

from ...traces import cpu_sets, mxnet_mark, profiling_mark  # standard library only, like this module
from .stop_signals import terminate_raises

FORMAT = "dagprof-mxnet-run"
VERSION = 2  # traces.mxnet.VERSION: the reader's
MANIFEST = "mxnet-run.json"
BIGARRAY_BOUND = 1_000_000  # ps-lite splits arrays of at least this many elements over all servers (MXNET_KVSTORE_BIGARRAY_BOUND)
# a row_sparse gradient's rows are counted in this many equal ranges of the table's row ids: ps-lite cuts a big row_sparse
# key over S servers by row-id range, and 840 ranges add up to each server's for every S dividing 840 (1-8, 10, 12...)
ROW_RANGES = 840
# a server's file (in the run folder) of its updater's calls, each ``CLOCKS`` before and after: wall, the process's CPU (all
# its threads), the updater thread's CPU and its time runnable waiting for a core (-1: the kernel does not say)
SERVER_CPU = "server{}.cpu.json"
CLOCKS = ("epoch_ns", "process_cpu_ns", "thread_cpu_ns", "thread_runnable_ns")
ENV_OUT, ENV_WARMUP, ENV_PROFILE = "DAGPROF_MXNET_OUT", "DAGPROF_MXNET_WARMUP", "DAGPROF_MXNET_PROFILE_STEPS"
# Gluon block prefixes -> block class (the reader maps classes to operator names)
_BLOCK = {"dense": "Dense", "conv": "Conv2D", "batchnorm": "BatchNorm", "embedding": "Embedding", "layernorm": "LayerNorm",
          "instancenorm": "InstanceNorm", "groupnorm": "GroupNorm", "conv2dtranspose": "Conv2DTranspose"}


def _write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


# -- the worker side (runs under MXNet's Python) --------------------------------------------------
class profile:
    """Profile a window of a ``dist_sync`` worker's steps (see the module docstring for the lines to add).

    ``trainer`` is the ``gluon.Trainer``, or, for a loop that calls ``kv.push``/``kv.pull`` itself, the dist
    kvstore with ``params``: the parameters in key order (key ``i`` is ``params[i]``) or a dict key -> parameter,
    as the loop numbers them (ps-lite places a key on a server by its number). ``out`` (default
    ``$DAGPROF_MXNET_OUT``, which the launcher sets) is the run folder; ``net`` (optional) gives the layers'
    model order and classes, otherwise they come from the parameter names (Gluon numbers blocks of a class in
    creation order: ``dense0``, ``dense1``...).
    """

    def __init__(self, trainer, net=None, *, params=None, out: str | None = None, warmup: int | None = None,
                 profile_steps: int | None = None):
        self.out = os.path.abspath(out or os.environ.get(ENV_OUT, ""))
        if not (out or os.environ.get(ENV_OUT)):
            raise RuntimeError("dagprof.collect.mxnet_ps.profile: no run folder (pass out= or launch with python -m dagprof.collect.hooks.mxnet_ps run)")
        if hasattr(trainer, "_kvstore"):  # a gluon.Trainer: its parameters, numbered as it pushes them
            if params is not None:
                raise RuntimeError("dagprof.collect.mxnet_ps.profile: params= is for a kvstore; a Trainer numbers its own keys")
            self.keyed = dict(enumerate(trainer._params))
        elif hasattr(trainer, "push") and hasattr(trainer, "num_workers"):
            if params is None:
                raise RuntimeError("dagprof.collect.mxnet_ps.profile(kv): pass params=, the parameters in key order (or a dict key -> parameter)")
            self.keyed = dict(params.items() if isinstance(params, dict) else enumerate(params))
        else:
            raise RuntimeError(f"dagprof.collect.mxnet_ps.profile: expected a gluon.Trainer or a dist kvstore, got {type(trainer).__name__}")
        self.trainer, self.net = trainer, net
        self.warmup = int(os.environ.get(ENV_WARMUP, 2)) if warmup is None else warmup
        self.profile_steps = int(os.environ.get(ENV_PROFILE, 3)) if profile_steps is None else profile_steps
        self.steps: list[list[int]] = []
        self.cpu_s: list[float] = []  # the process's CPU time per step, all its threads (engine, ps-lite): what it asks of the cores
        # the calling (Python) thread's CPU time per step: MXNet's front end (dispatch, autograd, the Trainer), which
        # mx.profiler does not trace; one clock_gettime per step
        self.main_cpu_s: list[float] = []
        self.profiled = [0, 0]
        # key -> per step, the rows its row_sparse gradient pushed in each of ROW_RANGES row-id ranges (the rows pulled
        # back by ``row_sparse_pull`` are the batch's, the same ones): the bytes of a row_sparse push and pull
        self.sparse = {k: p for k, p in self.keyed.items() if getattr(p, "_grad_stype", "default") == "row_sparse" and p.grad_req != "null"}
        self.rows: dict[int, list[list[int]]] = {k: [] for k in self.sparse}
        self.running = False
        self._clocks()

    def _clocks(self) -> None:
        self.t0, self.c0, self.m0 = time.time_ns(), time.process_time(), time.thread_time()

    def __enter__(self) -> profile:
        self._clocks()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()

    def step(self) -> None:
        """End of a training step: wait for its work, time it, turn the profiler on or off at the window's edges."""
        import mxnet as mx

        mx.nd.waitall()
        k = len(self.steps) + 1
        self.steps.append([k, self.t0, time.time_ns()])
        self.cpu_s.append(time.process_time() - self.c0)
        self.main_cpu_s.append(time.thread_time() - self.m0)
        for key, p in self.sparse.items():
            self.rows[key].append(_row_ranges(p))
        if k == self.warmup and self.profile_steps:
            self._start(mx)  # the next step pays the profiler's start-up: traced, outside the window
            self.profiled = [k + 2, k + 2 + self.profile_steps]
        elif self.running and k == self.profiled[1] - 1:
            self._stop(mx)
        self._clocks()

    def _kv(self):
        kv = getattr(self.trainer, "_kvstore", self.trainer)
        if kv is None or "dist" not in kv.type:
            raise RuntimeError("dagprof.collect.mxnet_ps.profile: no dist kvstore (gluon.Trainer(..., kvstore='dist_sync'), or mx.kv.create('dist_sync'))")
        return kv

    def _start(self, mx) -> None:
        kv = self._kv()
        opts = dict(profile_symbolic=True, profile_imperative=True, profile_memory=False, profile_api=True, aggregate_stats=False)
        mx.profiler.set_config(filename=os.path.join(self.out, f"worker{kv.rank}.json"), **opts)
        if kv.rank == 0:  # servers write rank<K>_<filename> in their working directory (the run folder)
            mx.profiler.set_config(filename="server.json", profile_process="server", **opts)
            mx.profiler.set_state("run", profile_process="server")
        kv._barrier()
        mx.profiler.set_state("run")
        # mx.profiler records no worker id: the trace names its worker itself (``traces.mxnet_mark``), so that two
        # workers' traces swapped are refused rather than read as each other's
        mx.profiler.Marker(mx.profiler.Domain(mxnet_mark.DOMAIN), mxnet_mark.name(kv.rank)).mark("process")
        self.running = True

    def _stop(self, mx) -> None:
        kv = self._kv()
        mx.profiler.set_state("stop")
        kv._barrier()
        if kv.rank == 0:
            mx.profiler.set_state("stop", profile_process="server")
            mx.profiler.dump(profile_process="server")
        mx.profiler.dump()
        kv._barrier()  # the timed steps start together
        self.running = False

    def close(self) -> None:
        """Write ``worker<R>.meta.json`` (the launcher merges the workers' into the manifest)."""
        import mxnet as mx

        if self.running:  # the loop ended inside the window
            self.profiled[1] = len(self.steps) + 1
            self._stop(mx)
        kv = self._kv()
        keys, layers = _keys_and_layers(self.keyed, self.net)
        on_servers = getattr(self.trainer, "_update_on_kvstore", None)  # a bare kvstore: the servers update if the loop set an optimizer
        _write_json(os.path.join(self.out, f"worker{kv.rank}.meta.json"), {
            "rank": kv.rank, "pid": os.getpid(), "steps": self.steps, "profiled": self.profiled, "keys": keys,
            "update_on_kvstore": on_servers,
            "layers": layers, "num_workers": kv.num_workers, "mxnet": mx.__version__, "host": socket.gethostname(),
            "cpus": cpu_sets.usable_cpus(), "cpu_set": cpu_sets.this_process(), "cpu_s": self.cpu_s,
            "main_cpu_s": self.main_cpu_s, "rows": {str(k): v for k, v in self.rows.items()},
        })


def _row_ranges(p) -> list[int]:
    """The rows ``p``'s row_sparse gradient holds (the rows pushed: a gradient on several devices is summed first, its
    rows the union), counted per ``ROW_RANGES`` equal ranges of row ids."""
    import numpy as np  # MXNet's own dependency

    grads = p.list_grad()
    rows = grads[0].indices.asnumpy() if len(grads) == 1 else np.unique(np.concatenate([g.indices.asnumpy() for g in grads]))
    return np.bincount(rows.astype(np.int64) * ROW_RANGES // p.shape[0], minlength=ROW_RANGES).tolist()


def _keys_and_layers(keyed: dict, net) -> tuple[list[dict], list[dict]]:
    """Keys as the loop numbers them (``gluon.Trainer``: its parameters sorted by name; frozen ones keep a number but
    are never pushed; ps-lite places a key by that number), and the layers in model order: the blocks that own the
    parameters (a ``gluon.rnn.GRU`` owns its ``l0_i2h_weight``...: one layer, one fused ``RNN`` op), else the name
    less its last part."""
    import numpy as np  # MXNet's own dependency

    key_of = {p.name: int(k) for k, p in keyed.items()}
    order = [p.name for p in net.collect_params().values()] if net is not None else sorted(key_of, key=_natural)
    params = {p.name: p for p in keyed.values()}
    owner = {p.name: b for b in (net, *_blocks(net)) for p in b._reg_params.values()} if net is not None else {}
    keys, layers = [], {}
    for name in order:
        p = params.get(name)
        if p is None or p.grad_req == "null":
            continue
        block = owner.get(name)
        layer = block.prefix.rstrip("_") if block is not None else name.rsplit("_", 1)[0]
        if layer not in layers:
            base = re.sub(r"\d+$", "", layer.rsplit("_", 1)[-1])
            layers[layer] = {"name": layer, "op": type(block).__name__ if block is not None else _BLOCK.get(base, base), "keys": []}
        layers[layer]["keys"].append(key_of[name])
        n = 1
        for d in p.shape:
            n *= d
        keys.append({"key": key_of[name], "name": name, "shape": list(p.shape), "elements": n, "nbytes": n * np.dtype(p.dtype).itemsize,
                     "layer": layer, "stype": getattr(p, "_stype", "default"), "grad_stype": getattr(p, "_grad_stype", "default")})
    keys.sort(key=lambda k: k["key"])  # trainer.step pushes in key order
    return keys, list(layers.values())


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _blocks(block):
    for child in block._children.values():
        yield child
        yield from _blocks(child)


# -- the built-in script and the server/scheduler program (runs under MXNet's Python) --------------
def _role(args: argparse.Namespace) -> int:
    import mxnet as mx  # a scheduler or server serves here and exits
    from mxnet import autograd, gluon, nd

    kv = mx.kv.create("dist_sync")
    mx.random.seed(kv.rank)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1, activation="relu"), gluon.nn.Conv2D(32, 3, padding=1, activation="relu"),
            gluon.nn.MaxPool2D(2), gluon.nn.Flatten(), gluon.nn.Dense(args.width, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x = nd.random.uniform(shape=(args.batch, 3, 32, 32))
    y = nd.array([i % 10 for i in range(args.batch)])
    with profile(trainer, net) as prof:
        for _ in range(prof.warmup + (1 + prof.profile_steps if prof.profile_steps else 0) + args.steps):
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            nd.waitall()  # pushes start after the backward pass
            trainer.step(args.batch)
            prof.step()
    return 0


def _serve() -> int:
    """A server, as ``import mxnet`` would run it, with each call of its updater timed (``SERVER_CPU``): mx.profiler traces
    the updater's engine calls, not what the server's threads spend on the cores between them (ps-lite taking pushes in and
    answering pulls) nor its waits for a core, which the wall clock alone books alike as busy time."""
    os.environ["DMLC_ROLE"] = "worker"  # ``import mxnet`` serves inside the import where the role is a server's: not yet
    import mxnet as mx
    from mxnet.kvstore.kvstore_server import KVStoreServer

    os.environ["DMLC_ROLE"] = "server"
    kv = mx.kv.create("dist")
    calls: list[list[int]] = []
    rank: list[int] = []  # the server's, known while it serves
    set_updater = kv._set_updater

    def timed(updater):
        rank[:] = [kv.rank]

        def update(key, *args):
            before = _clocks()
            updater(key, *args)
            calls.append(before + _clocks())
        return set_updater(update)

    kv._set_updater = timed  # the optimizer a worker sends (``set_optimizer``) arrives as an updater here
    KVStoreServer(kv).run()
    if rank:  # no optimizer sent: the workers update, nothing timed
        _write_json(SERVER_CPU.format(rank[0]), {"fields": list(CLOCKS) * 2, "calls": calls})
    return 0


def _clocks() -> list[int]:
    """``CLOCKS`` now, in ns."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            waited = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        waited = -1
    return [time.time_ns(), time.process_time_ns(), time.thread_time_ns(), waited]


# -- the launcher (any Python: dagprof's, or MXNet's) ----------------------------------------------
Spawn = Callable[..., subprocess.Popen]
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # holds dagprof/


def local_spawn(node: int, argv: list, env: dict, log: str, cwd: str | None = None) -> subprocess.Popen:
    """Start ``argv`` on this host (every node on 127.0.0.1)."""
    with open(log, "w") as f:
        return subprocess.Popen(argv, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT, cwd=cwd)


def launch_command(out: str, command: list[str], *, python: str | None = None, servers: int = 1, workers: int = 2, warmup: int = 2,
                   profile_steps: int = 3, port: int | None = None, addr: Callable[[int], str] = lambda node: "127.0.0.1",
                   ifname: Callable[[int], str] | None = None, spawn: Spawn = local_spawn, timeout_s: float = 300, cwd: str | None = None,
                   extra: dict | None = None) -> dict:
    """Run one job: the scheduler (beside server 0) and ``servers`` servers run this file's ``role`` program under
    ``python`` (default: the command's own Python when it starts with one), nodes ``servers..`` run ``command``
    as workers. Returns the manifest written to ``out/mxnet-run.json``. ``port``: the scheduler's, by default one free on
    this host now (on a fixed one, a second job on the host, or one's leftover, failed to bind).

    While the job runs ``out`` holds ``profiling_mark``'s mark, and SIGTERM stops it as SIGINT does (``KeyboardInterrupt``,
    every process ended): a job stopped so has no manifest (it is written last) and leaves the mark, so every reader
    refuses the folder in one line; an earlier run's manifest there is removed first, not read beside this run's traces."""
    if warmup < 1:
        raise ValueError("warmup must be >= 1 step (the first one initialises the kvstore)")
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, MANIFEST)):
        os.remove(os.path.join(out, MANIFEST))
    if python is None:
        python = command[0] if os.path.basename(command[0]).startswith("python") else sys.executable
    path = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    # servers unpickle the optimizer the script sets (kv.set_optimizer): under MXNet's launcher they run the script
    # itself, whose folder (``python train.py``) or working directory (``python -m``) is on their path; so here too
    script = next((a for a in command[1:] if a.endswith(".py") and os.path.isfile(os.path.join(cwd or "", a))), None)
    served = [os.path.dirname(os.path.abspath(os.path.join(cwd or "", script)))] if script else []
    served_path = os.pathsep.join([*served, os.path.abspath(cwd or os.getcwd()), path])
    if port is None:
        with socket.socket() as probe:  # a port free on this host now (``collect.jobs`` comes after the hooks)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    base = {"DMLC_PS_ROOT_URI": addr(0), "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(workers),
            "OMP_NUM_THREADS": "1", "MXNET_EXEC_BULK_EXEC_TRAIN": "0", "MXNET_KVSTORE_BIGARRAY_BOUND": str(BIGARRAY_BOUND), "PS_VERBOSE": "0",
            "PYTHONPATH": path, ENV_OUT: out, ENV_WARMUP: str(warmup), ENV_PROFILE: str(profile_steps)}
    wrap = ["timeout", "-k", "5", str(int(timeout_s))]
    serve = wrap + [python, "-m", "dagprof.collect.hooks.mxnet_ps", "role"]
    plan = [("scheduler", 0)] + [("server", s) for s in range(servers)] + [("worker", servers + w) for w in range(workers)]
    procs = []
    with profiling_mark.marked(out, list(command)), terminate_raises():
        try:
            for role, node in plan:
                env = {**base, "DMLC_ROLE": role, "DMLC_NODE_HOST": addr(node)}
                if ifname is not None:
                    env["DMLC_INTERFACE"] = ifname(node)
                if role != "worker":
                    env["PYTHONPATH"] = served_path
                log = os.path.join(out, {"scheduler": "scheduler", "server": f"server{node}", "worker": f"worker{node - servers}"}[role] + ".log")
                argv, where = (wrap + list(command), cwd) if role == "worker" else (serve, out)
                procs.append((os.path.basename(log)[:-4], spawn(node, argv, env, log, cwd=where)))
            _wait_all(procs, time.monotonic() + timeout_s + 10, out)
            for s in range(servers):  # MXNet prints and ignores a server's exception (an optimizer it cannot unpickle) and exits 0
                failed = _ignored_exception(os.path.join(out, f"server{s}.log"))
                if failed:
                    raise RuntimeError(f"MXNet server {s} raised {failed} and went on without it (MXNet ignores it); see server{s}.log in {out}")
        finally:
            _stop(p for _, p in procs)
        return write_manifest(out, servers, workers, {"command": list(command), **(extra or {})})


def _stop(procs) -> None:
    """End the processes still running. Each is a ``timeout`` wrapper: SIGTERM first, which it passes on to the command it
    runs; a SIGKILL alone ends the wrapper and leaves its command running (the workers of a job whose server MXNet aborted
    stayed behind, waiting for their scheduler, an hour on)."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.terminate()
    deadline = time.monotonic() + 5.0
    for p in live:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _wait_all(procs: list[tuple[str, subprocess.Popen]], deadline: float, out: str) -> None:
    """Wait for every process, failing on the first that exits non-zero, whichever it is: a worker MXNet aborted
    (ps-lite's checks call ``terminate``) leaves the scheduler waiting for it until the timeout, which then was all
    the job said ("scheduler exited with 124", 5 minutes on)."""
    pending = list(procs)
    while pending:
        for name, p in list(pending):
            rc = p.poll()
            if rc is None:
                continue
            pending.remove((name, p))
            if rc != 0:
                signum = -rc if rc < 0 else rc - 128 if rc > 128 else 0  # ``timeout`` passes on a signal as 128 + its number
                how = f" (killed by {signal.Signals(signum).name})" if signum in signal.valid_signals() else ""
                what = "ran past the launcher's timeout" if rc == 124 else f"exited with {rc}{how}"
                raise RuntimeError(f"MXNet {name} {what}; see {name}.log in {out}")
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"MXNet {', '.join(n for n, _ in pending)} still running past the launcher's timeout; see the logs in {out}")
        time.sleep(0.2)


def _ignored_exception(log: str) -> str:
    """The last exception a server's log reports (``ModuleNotFoundError: No module named 'opt'``), or ''."""
    if not os.path.exists(log):
        return ""
    with open(log, errors="replace") as f:
        lines = f.read().splitlines()
    if not any(line.startswith("Traceback") for line in lines):
        return ""
    return next((line.strip() for line in reversed(lines) if re.match(r"^\w+(\.\w+)*(Error|Exception)\b", line.strip())), "an exception")


def write_manifest(out: str, servers: int, workers: int, extra: dict | None = None) -> dict:
    """Merge the workers' ``worker<R>.meta.json`` (``profile`` writes them) and the servers' traces into the manifest
    (a job started by another launcher, with the run folder shared: ``python -m dagprof.collect.hooks.mxnet_ps manifest``)."""
    metas = []
    for w in range(workers):
        path = os.path.join(out, f"worker{w}.meta.json")
        if not os.path.exists(path):
            raise RuntimeError(f"{path} is missing: did the script use dagprof.collect.mxnet_ps.profile and end its with-block?")
        with open(path) as f:
            metas.append(json.load(f))
        os.remove(path)
    first, stop = metas[0]["profiled"]
    done = min(len(m["steps"]) for m in metas)
    if not stop or done < stop - 1:
        raise RuntimeError(f"the script ran {done} steps; profiling needs warmup + 1 + profiled steps ({max(stop - 1, 0)} or more)")
    files: dict[str, dict[str, str]] = {"workers": {str(w): f"worker{w}.json" for w in range(workers)}, "servers": {}}
    for s in range(servers):
        src = os.path.join(out, f"rank{s}_server.json")
        if os.path.exists(src):
            os.replace(src, os.path.join(out, f"server{s}.json"))
            files["servers"][str(s)] = f"server{s}.json"
    updates = {}  # server -> its updater's calls (``_serve``; none from another launcher's servers)
    for s in range(servers):
        path = os.path.join(out, SERVER_CPU.format(s))
        if os.path.exists(path):
            with open(path) as f:
                updates[str(s)] = json.load(f)["calls"]
            os.remove(path)
    manifest = {
        "format": FORMAT, "version": VERSION, "kvstore": "dist_sync", "num_workers": workers, "num_servers": servers,
        "bigarray_bound": BIGARRAY_BOUND, "mxnet": metas[0]["mxnet"], "keys": metas[0]["keys"],
        "layers": metas[0]["layers"], "profiled_steps": [first, stop], "files": files,
        "steps": {str(m["rank"]): m["steps"] for m in metas},
        "hosts": {str(m["rank"]): m["host"] for m in metas}, "cpus": {str(m["rank"]): m["cpus"] for m in metas},
        "cpu_sets": {str(m["rank"]): m.get("cpu_set", "") for m in metas},
        "cpu_s": {str(m["rank"]): m["cpu_s"] for m in metas}, "main_cpu_s": {str(m["rank"]): m.get("main_cpu_s", []) for m in metas},
        "rows": {str(m["rank"]): m["rows"] for m in metas if m.get("rows")}, "row_ranges": ROW_RANGES,
        "server_updates": updates,
        **(extra or {}),
    }
    if metas[0].get("update_on_kvstore") is not None:  # a Trainer says where its optimizer runs; a bare kvstore's loop does not
        manifest["update_on_kvstore"] = bool(metas[0]["update_on_kvstore"])
    _write_json(os.path.join(out, MANIFEST), manifest)
    return manifest


def launch(out: str, python: str, *, batch: int = 32, width: int = 128, steps: int = 5, **kw) -> dict:
    """The built-in script (a small Gluon CNN) as the workers' command; ``kw`` as ``launch_command``'s (2 servers by default)."""
    kw.setdefault("servers", 2)
    extra = {"batch": batch, "width": width, **kw.pop("extra", {})}
    command = [python, "-m", "dagprof.collect.hooks.mxnet_ps", "builtin", "--steps", str(steps), "--batch", str(batch), "--width", str(width)]
    return launch_command(out, command, python=python, extra=extra, **kw)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("role", help="a scheduler's or server's program (DMLC_ROLE says which)")
    b = sub.add_parser("builtin", help="the built-in worker script")
    b.add_argument("--steps", type=int, default=5, help="timed steps after the profiled window (default 5)")
    b.add_argument("--batch", type=int, default=32, help="samples a worker's step (default 32)")
    b.add_argument("--width", type=int, default=128, help="the built-in model's hidden dense width (default 128)")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", required=True, help="the run folder")
    common.add_argument("--servers", type=int, default=1, help="parameter servers to start (default 1)")
    common.add_argument("--workers", type=int, default=2, help="workers to start, each running the command (default 2)")
    common.add_argument("--warmup", type=int, default=2, help="steps before the profiler starts, the first one starting the kvstore (>= 1, default 2)")
    common.add_argument("--profile-steps", type=int, default=3,
                        help="steps profiled, after one that pays the profiler's start-up (default 3)")
    common.add_argument("--port", type=int, help="the scheduler's port (default: one free on this host now)")
    common.add_argument("--timeout", type=float, default=600, help="seconds before every process is killed (default 600)")
    common.add_argument("--fixture", action="store_true", help="gzip the traces and drop the logs (how tests/data/mxnet* is recorded)")
    r = sub.add_parser("run", parents=[common], help="profile a user's dist_sync job on this host: run --out DIR [options] -- python train.py ...")
    r.add_argument("--python", default=None, help="the Python that imports mxnet, for the scheduler and servers (default: the command's)")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...: the workers' training command, e.g. python train.py")
    loc = sub.add_parser("local", parents=[common], help="profile the built-in script on this host")
    loc.add_argument("--python", required=True, help="the Python that imports mxnet")
    m = sub.add_parser("manifest", help="write the manifest of a job started by another launcher (run folder shared by every worker)")
    m.add_argument("--out", required=True, help="the run folder every worker wrote into ($DAGPROF_MXNET_OUT)")
    m.add_argument("--servers", type=int, required=True, help="the job's servers")
    m.add_argument("--workers", type=int, required=True, help="the job's workers")
    args = ap.parse_args(argv)
    if args.cmd == "role":
        if os.environ.get("DMLC_ROLE") == "server":
            return _serve()
        import mxnet  # noqa: F401  (a scheduler serves inside the import and exits)

        return 0
    if args.cmd == "builtin":
        return _role(args)
    if args.cmd == "manifest":
        write_manifest(os.path.abspath(args.out), args.servers, args.workers)
        print(args.out)
        return 0
    kw = dict(servers=args.servers, workers=args.workers, warmup=args.warmup, profile_steps=args.profile_steps, port=args.port, timeout_s=args.timeout)
    try:
        if args.cmd == "run":
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not command:
                ap.error("run needs the workers' command after --")
            man = launch_command(args.out, command, python=args.python, **kw)
        else:
            man = launch(args.out, args.python, **kw)
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as err:
        print(f"dagprof.collect.hooks.mxnet_ps: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # SIGINT or SIGTERM: the job was ended, the folder left marked incomplete
        print(f"dagprof.collect.hooks.mxnet_ps: interrupted; {args.out} is marked incomplete ({profiling_mark.INCOMPLETE})", file=sys.stderr)
        return 130
    if args.fixture:
        _compact(args.out, man)
    print(args.out)
    return 0


def _compact(out: str, m: dict) -> None:
    """Gzipped traces, no logs, no machine paths in the command: a small folder to keep as a test fixture."""
    import gzip
    import shutil

    if m.get("command"):
        m["command"] = [os.path.basename(m["command"][0])] + [os.path.relpath(a) if os.path.isabs(a) else a for a in m["command"][1:]]

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
