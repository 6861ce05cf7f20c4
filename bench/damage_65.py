"""Damages of the inputs added at stop 64 that no sweep fed yet (``damage_64``/``damage_63`` are the machinery; this file
adds kinds, damages and flags to them): ``replicate_with_fsdp``'s recording (``replicate/with-fsdp``: FSDP2 units on a 1-D
"replicate" mesh, one all-reduce a unit), a user's Kineto traces of a DDP job saving with DCP before its next forward
(``ddp-fresh/dcp-kineto-early``), MXNet worker traces recorded before the collector's rank mark (``mxnet/user_bow_2bit``,
``testbed_attn/warmup_s1_500M``: swapped, cut, moved) and a 2-bit server without its dequantize spans, and the
several-root strategies ``optimize`` writes for the GAN's and the actor-critic's two ``fully_shard`` roots, given to
``dagprof.apply`` damaged or with the roots in the wrong order (``--apply``: one process, world size 1).

Damages: ``damage_63``'s generic rank damages; each format's own fields (the units' mesh dimension renamed or dropped on one
rank, its all-reduces called reduce-scatters or moved to another group; MXNet traces' first or last events moved past their
worker's profiler edges, a server's ``DequantizeCPU`` gone; a strategy's roots swapped, renumbered, not numbers, a root's
units gone or renamed, another version); wrong flags on every command that gained one at stop 64 (``optimize`` of several
roots with a wrong memory budget, ``optimize --verify`` and what-ifs beyond the link on ``replicate_with_fsdp``,
``--data-parallel ddp`` there, ``--workers`` on the early save, ...), with and without ``--json``::

    python bench/damage_65.py [--kinds with-fsdp,dcp-early] [--damages swap,wfs-mesh-dp] [--json FILE] [--src DIR]
    python bench/damage_65.py --apply gan,a2c [--out DIR]
    python bench/damage_65.py --compare BEFORE.json AFTER.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import damage_63 as d63  # noqa: E402  (the sweep, judge and damages)
import damage_64 as d64  # noqa: E402  (its tables, registered into d63's, and its judge)
import damage_inputs as di  # noqa: E402

DATA = di.DATA
K = di.Kind
KINDS = [
    K("with-fsdp", DATA / "replicate/with-fsdp", "rank1.json", "rank0.json", "rank2.json"),
    K("dcp-early", DATA / "ddp-fresh/dcp-kineto-early", "rank1.1796633393720752705.pt.trace.json.gz",
      "rank0.1796633393749898287.pt.trace.json.gz", "rank2.1796633393720752706.pt.trace.json.gz", named_by_content=True),
    K("mx-attn-warm", DATA / "mxnet/testbed_attn/warmup_s1_500M", "worker1.json.gz", "worker0.json.gz", "worker2.json.gz",
      only=("clean", "swap", "dupover", "mx-first-early", "mx-stop-early")),
    K("mx-bow65", DATA / "mxnet/user_bow_2bit", "worker1.json.gz", "worker0.json.gz", "worker2.json.gz",
      only=("clean", "swap", "dupover", "mx-first-early", "mx-stop-early")),
    K("mx-bow65-server", DATA / "mxnet/user_bow_2bit", "server0.json.gz", only=("clean", "deq-gone", "deq-half", "deq-renamed")),
]
MESH = ["wfs-mesh-dp", "wfs-mesh-gone", "wfs-mesh-size", "wfs-coll-rs", "wfs-coll-group"]
MX = ["mx-first-early", "mx-stop-early", "deq-gone", "deq-half", "deq-renamed"]
NEW = [*MESH, *MX]
GENERIC = d64.GENERIC

WFS, GAN, A2C = (str(DATA / p) for p in ("replicate/with-fsdp", "fsdp-fresh/gan-roots", "fsdp-fresh/a2c-roots"))
FEATURE = {
    "with-fsdp": [["whatif", "RUN", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"]],
    "dcp-early": [["whatif", "RUN", "--workers", "4", "--allow-model-error", "--no-trace", "-o", "OUT"]],
    "mx-attn-warm": [["whatif", "RUN", "--bandwidth", "100Mbit", "--no-trace", "-o", "OUT"]],
    "mx-bow65": [["whatif", "RUN", "--bandwidth", "100Mbit", "--no-trace", "-o", "OUT"]],
    "mx-bow65-server": [["whatif", "RUN", "--bandwidth", "100Mbit", "--no-trace", "-o", "OUT"]],
}
# name -> (argv with RUN/OUT, the kinds it is given to, whether an answer is right there)
ROOTS = ("gan-roots", "a2c-roots")
FLAGS: dict[str, tuple[list[str], tuple[str, ...], bool]] = {
    "f65-optimize-roots": (["optimize", "RUN", "--budget", "2", "-o", "OUT"], ROOTS, True),  # answered since stop 64
    "f65-optimize-roots-mem-tiny": (["optimize", "RUN", "--budget", "2", "--memory-budget", "1KB", "-o", "OUT"], ROOTS, False),
    "f65-optimize-roots-mem-neg": (["optimize", "RUN", "--budget", "2", "--memory-budget", "-2GB", "-o", "OUT"], ("gan-roots",), False),
    "f65-optimize-roots-mem-word": (["optimize", "RUN", "--budget", "2", "--memory-budget", "lots", "-o", "OUT"], ("a2c-roots",), False),
    "f65-optimize-roots-budget0": (["optimize", "RUN", "--budget", "0", "-o", "OUT"], ROOTS, False),
    "f65-optimize-roots-verify": (["optimize", "RUN", "--budget", "2", "--verify", "-o", "OUT"], ("gan-roots",), False),  # no command
    "f65-optimize-wfs": (["optimize", "RUN", "--budget", "2", "-o", "OUT"], ("with-fsdp",), False),
    "f65-optimize-verify-wfs": (["optimize", "RUN", "--budget", "2", "--verify", "-o", "OUT", "--", "python", "-c", "pass"],
                                ("with-fsdp",), False),
    "f65-workers-wfs": (["whatif", "RUN", "--workers", "4", "--no-trace", "-o", "OUT"], ("with-fsdp",), False),
    "f65-ddp-wfs": (["whatif", "RUN", "--data-parallel", "ddp", "--no-trace", "-o", "OUT"], ("with-fsdp",), False),
    "f65-fsdp-wfs": (["whatif", "RUN", "--data-parallel", "fsdp", "--no-trace", "-o", "OUT"], ("with-fsdp",), False),
    "f65-mesh-wfs": (["whatif", "RUN", "--mesh", "2x2", "--no-trace", "-o", "OUT"], ("with-fsdp",), False),
    "f65-units-wfs": (["whatif", "RUN", "--units", "merge:all", "--no-trace", "-o", "OUT"], ("with-fsdp",), False),
    "f65-reshard-wfs": (["whatif", "RUN", "--reshard-after-forward", "on", "--no-trace", "-o", "OUT"], ("with-fsdp",), False),
    "f65-dtype-wfs": (["whatif", "RUN", "--reduce-dtype", "bfloat16", "--no-trace", "-o", "OUT"], ("with-fsdp",), False),
    "f65-bucket-wfs": (["whatif", "RUN", "--bucket-mb", "4", "--no-trace", "-o", "OUT"], ("with-fsdp",), False),
    "f65-cores-wfs": (["whatif", "RUN", "--cores", "1", "--no-trace", "-o", "OUT"], ("with-fsdp",), True),  # two ranks on one core
    "f65-link-w4-wfs": (["whatif", "RUN", "--link-from", str(d63.W4), "--link-to", str(d63.W4), "--no-trace", "-o", "OUT"],
                        ("with-fsdp",), False),
    "f65-link-w2-wfs": (["whatif", "RUN", "--link-from", str(d63.W2), "--link-to", str(d63.W2), "--no-trace", "-o", "OUT"],
                        ("with-fsdp",), True),
    "f65-diff-wfs-roots": (["diff", GAN, "RUN", "--no-report", "-o", "OUT"], ("with-fsdp",), False),
    "f65-diff-wfs-self": (["diff", "RUN", "RUN", "--no-report", "-o", "OUT"], ("with-fsdp", "dcp-early"), True),
    "f65-sgd-wfs": (["sgd", "RUN"], ("with-fsdp",), False),
    "f65-workers1-early": (["whatif", "RUN", "--workers", "1", "--no-trace", "-o", "OUT"], ("dcp-early",), True),
    "f65-workers0-early": (["whatif", "RUN", "--workers", "0", "--no-trace", "-o", "OUT"], ("dcp-early",), False),
    "f65-optimize-early": (["optimize", "RUN", "--budget", "2", "-o", "OUT"], ("dcp-early",), False),
    "f65-steps-early": (["analyze", "RUN", "--steps", "9:12"], ("dcp-early", "with-fsdp"), False),
    "f65-tp-early": (["whatif", "RUN", "--tp-degree", "2", "--no-trace", "-o", "OUT"], ("dcp-early",), False),
    "f65-workers-mx": (["whatif", "RUN", "--workers", "0", "--no-trace", "-o", "OUT"], ("mx-bow65",), False),
}


def _units(o) -> list[dict]:
    return ((o.get("fsdp") or {}).get("units") or []) if isinstance(o, dict) else []


def _mesh_edit(damage: str):
    """Rank 1's record of ``replicate_with_fsdp``'s mesh or its all-reduces changed."""
    def edit(o) -> bool:
        units = _units(o)
        if not units or units[0].get("mesh_dims") != ["replicate"]:
            return False
        for u in units:
            if damage == "wfs-mesh-dp":
                u["mesh_dims"] = ["dp"]
            elif damage == "wfs-mesh-gone":
                u.pop("mesh_dims")
            elif damage == "wfs-mesh-size":
                u["mesh"] = [4]
        for c in o["fsdp"].get("collectives") or []:
            if damage == "wfs-coll-rs":
                c["kind"] = "reduce_scatter"
            elif damage == "wfs-coll-group":
                c["group"] = "0"
        return True
    return edit


def _mx_edit(damage: str):
    """An MXNet trace's edges moved (its first event 50 ms early, its stop's call 50 ms early) or a server's
    ``DequantizeCPU`` spans gone, half gone, or renamed."""
    def edit(o) -> bool:
        ev = di._events(o)
        timed = [e for e in ev if isinstance(e, dict) and e.get("ph") not in ("M", "C") and isinstance(e.get("ts"), (int, float))]
        if damage == "mx-first-early":
            first = min(timed, key=lambda e: e["ts"])
            ev.append(dict(first, ts=first["ts"] - 50_000))
            return True
        if damage == "mx-stop-early":
            last = max(timed, key=lambda e: e["ts"])
            if last.get("name") != "MXKVStoreGetType":
                return False
            o["traceEvents"] = [e for e in ev if not (isinstance(e, dict) and isinstance(e.get("ts"), (int, float)) and e["ts"] > last["ts"] - 50_000
                                                      and e.get("cat") != "operator")] + [dict(last, ts=last["ts"] - 50_000)]
            return True
        deq = [e for e in ev if isinstance(e, dict) and e.get("name") == "DequantizeCPU"]
        if not deq:
            return False
        if damage == "deq-renamed":
            for e in deq:
                e["name"] = "DequantizeGPU"
            return True
        drop = {id(e) for e in (deq if damage == "deq-gone" else deq[: len(deq) // 2])}
        o["traceEvents"] = [e for e in ev if id(e) not in drop]
        return True
    return edit


EDITS = {**{d: _mesh_edit(d) for d in MESH}, **{d: _mx_edit(d) for d in MX}}
APPLIES = {**dict.fromkeys(MESH, ("with-fsdp",)), "mx-first-early": ("mx-attn-warm", "mx-bow65"),
           "mx-stop-early": ("mx-attn-warm", "mx-bow65"), **dict.fromkeys(("deq-gone", "deq-half", "deq-renamed"), ("mx-bow65-server",))}


make_case = d64.case_maker(EDITS, APPLIES, d64.make_case)  # this file's damages; the others as ``damage_64`` makes them


# ---------------------------------------------------------------- strategies given to dagprof.apply
APPLY_DAMAGES = ["clean", "roots-reversed", "one-module", "root-swapped", "root-renumbered", "root-str", "root-neg", "root1-gone",
                 "unit-renamed", "unit-numel", "version-9", "fsdp-gone", "units-empty", "truncated", "not-json"]


def _strategy_edit(damage: str, doc: dict) -> None:
    units = doc["fsdp"]["units"]
    if damage == "root-swapped":
        for u in units:
            u["root"] = 1 - u.get("root", 0)
    elif damage == "root-renumbered":
        for u in units:
            u["root"] = u.get("root", 0) + 3
    elif damage == "root-str":
        for u in units:
            u["root"] = str(u.get("root", 0))
    elif damage == "root-neg":
        for u in units:
            if u.get("root"):
                u["root"] = -1
    elif damage == "root1-gone":
        doc["fsdp"]["units"] = [u for u in units if not u.get("root")]
    elif damage == "unit-renamed":
        units[-1]["name"] += "_x"
    elif damage == "unit-numel":
        units[-1]["numel"] += 7
    elif damage == "version-9":
        doc["version"] = 9
    elif damage == "fsdp-gone":
        doc.pop("fsdp")
    elif damage == "units-empty":
        doc["fsdp"]["units"] = []


def apply_all(script: str, cases: list[str]) -> None:
    """In this process (world size 1, gloo; torch imported once): for each ``PATH=DAMAGE`` of ``cases`` the script's two roots
    built as it builds them and the strategy applied; one JSON line each: exit 0, a ``DagprofError`` (2) with its text, or
    anything else raised (a traceback)."""
    import traceback

    import torch.distributed as dist

    from dagprof import apply
    from dagprof.errors import DagprofError

    sys.path.insert(0, str(di.REPO / "bench" / "fsdp_fresh"))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    for case in cases:
        path, _, damage = case.rpartition("=")
        roots = _roots(script)
        try:
            apply(roots[0] if damage == "one-module" else roots[::-1] if damage == "roots-reversed" else roots, path)
            rc, err = 0, ""
        except DagprofError as e:
            rc, err = 2, f"error: {e}"
        except Exception:  # noqa: BLE001 - a crash is this sweep's finding
            rc, err = 1, traceback.format_exc()
        print(json.dumps({"damage": damage, "rc": rc, "err": err}), flush=True)
    dist.destroy_process_group()


def _roots(script: str) -> list:
    """The two ``fully_shard`` roots each script builds by default (the order they first run forward)."""
    if script == "gan":
        import gan_two_roots as g
        import torch.nn as nn

        gen, disc = g.mlp([32, 256, 256, 256, 64], nn.Tanh()), g.mlp([64, 256, 256, 1], None)
        g.shard(gen, None)
        g.shard(disc, None)
        return [gen, disc]
    import actor_critic as a

    return [a.shard(a.Tower(48, 192, 3, 12), None), a.shard(a.Tower(48, 256, 2, 1), None)]


def apply_sweep(out: Path, src: str, timeout: float, scripts: list[str]) -> list[dict]:
    """Each damaged copy of each several-root strategy (``optimize`` of the GAN's and the actor-critic's profiles) given to
    ``dagprof.apply`` in a child; a refusal naming the file (or what it was given) is good, exit 0 on a damage bad."""
    rows = []
    for script, run in ((s, {"gan": GAN, "a2c": A2C}[s]) for s in scripts):
        base = out / script
        base.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=src)
        made = subprocess.run([sys.executable, "-m", "dagprof.cli.main", "optimize", run, "--budget", "5", "-o", str(base / "opt")],
                              env=env, capture_output=True, text=True, timeout=600)
        clean = base / "opt" / "strategy.json"
        if not clean.is_file():
            print(f"{script}: optimize wrote no strategy ({made.stderr.strip()[-200:]})")
            continue
        cases = []
        for damage in APPLY_DAMAGES:
            path = base / f"{damage}.json"
            text = clean.read_text()
            if damage == "truncated":
                text = text[: len(text) // 2]
            elif damage == "not-json":
                text = "strategy: best"
            elif damage not in ("clean", "roots-reversed", "one-module"):
                doc = json.loads(text)
                _strategy_edit(damage, doc)
                text = json.dumps(doc)
            path.write_text(text)
            cases.append(f"{path}={damage}")
        try:
            p = subprocess.run([sys.executable, __file__, "--apply-all", script, *cases], env=env, capture_output=True, text=True,
                               timeout=timeout)
            done = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        except subprocess.TimeoutExpired as e:
            done = [json.loads(x) for x in (e.stdout or b"").decode().splitlines() if x.startswith("{")]
        for case in cases:
            path, _, damage = case.rpartition("=")
            got = next((d for d in done if d["damage"] == damage), {"rc": "hang", "err": ""})
            rc, err = got["rc"], got["err"]
            last = err.strip().splitlines()[-1] if err.strip() else ""
            if rc == "hang" or "Traceback" in err:
                cls = "hang" if rc == "hang" else "traceback"
            elif rc == 0:
                cls = "clean-ok" if damage == "clean" else "silent"
            elif rc == 2 and (path in last or damage in ("roots-reversed", "one-module")) and len(err.strip().splitlines()) == 1:
                cls = "refused"
            else:
                cls = "refused-vague"
            verdict = "good" if cls in ("clean-ok", "refused") else "bad"
            rows.append({"kind": f"apply-{script}", "damage": damage, "argv": "apply", "json": False, "cmd": 0, "rc": rc,
                         "class": cls, "verdict": verdict, "number": None, "clean": None, "stderr": last[:300], "file": path,
                         "line": f"apply {script} {path}"})
            print(f"apply-{script:8} {damage:16} rc={rc!s:4} {cls:13} {verdict:5} {last[:150]}", flush=True)
    return rows


def register() -> None:
    """This file's features and flags added to ``damage_63``'s tables, after ``damage_64``'s."""
    d64.register()
    d63.FEATURE.update(FEATURE)
    d63.FLAGS.update(FLAGS)


def main() -> int:
    if sys.argv[1:2] == ["--apply-all"]:
        apply_all(sys.argv[2], sys.argv[3:])
        return 0
    ap = d63.sweep_parser(__doc__, "/tmp/damage65/cases", [*(k.name for k in KINDS), *ROOTS], [*GENERIC, *NEW, *FLAGS])
    ap.add_argument("--apply", metavar="SCRIPTS", help="gan,a2c: their strategies given to dagprof.apply instead of the CLI sweep")
    a = ap.parse_args()
    register()
    if a.apply and not a.compare:
        os.environ.setdefault("DAGPROF_CACHE_DIR", str(Path(a.out).parent / "cache"))
        return d63.report_rows(apply_sweep(Path(a.out) / "apply", a.src, a.timeout, a.apply.split(",")), a.json_out)
    return d63.sweep_main(a, lambda: [*KINDS, *d63.KINDS], make_case, d64.problem_named)


if __name__ == "__main__":
    sys.exit(main())
