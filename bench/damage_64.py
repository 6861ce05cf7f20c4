"""Damages of the inputs added at stop 63 that no sweep fed yet (``damage_63`` is the machinery; this file adds kinds,
damages and flags to it): the composable ``replicate()`` recording (``replicate/realnvp``), a DDP job's Kineto traces
around a distributed checkpoint save (``ddp-fresh/dcp-kineto``), the HSDP dual encoder (``fsdp-fresh/dual-negatives``),
the 2-bit bag-of-n-grams (``mxnet/user_bow_2bit``), a Kineto trace recorded ``with_stack`` (``clip-kineto`` with a
Python-call event beside each op, made here), and the FSDP2 jobs of two ``fully_shard`` roots with each root's records
damaged on its own (``a2c-roots``, ``gan-roots``, ``dino-both``, ``gan-late``).

Damages: ``damage_63``'s generic rank damages; each format's own fields (``ddp_api`` another word, missing or on one rank
only; root ids of one root renamed, dropped, swapped, not numbers, one root's units or collectives gone from one rank;
MXNet ``QuantizeCPU``/``DequantizeCPU`` spans reversed, unpaired, renamed or gone; Python-call events on one rank only
or not timed); wrong flags on every command (``--data-parallel ddp`` on several roots, ``optimize`` on ``replicate()``,
``--workers 0``, link files of another world size, FSDP flags on DDP and MXNet, ...), with and without ``--json``::

    python bench/damage_64.py [--kinds realnvp,a2c-roots] [--damages api-ddp,f64-workers0] [--json FILE] [--src DIR]
    python bench/damage_64.py --compare BEFORE.json AFTER.json
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import damage_63 as d63  # noqa: E402  (the sweep, judge and damages this file extends)
import damage_inputs as di  # noqa: E402

DATA = di.DATA
K = di.Kind
STACK = "with-stack"  # its input is made at run time (``_with_stack``): clip-kineto's traces with Python-call events
KINDS = [
    K("realnvp", DATA / "replicate/realnvp", "rank1.json", "rank0.json", "rank2.json", ddp=True),
    K("dcp-kineto", DATA / "ddp-fresh/dcp-kineto", "rank1.1796618979694615864.pt.trace.json.gz",
      "rank0.1796618979693449400.pt.trace.json.gz", "rank2.1796618979694615865.pt.trace.json.gz", named_by_content=True),
    K("dual-neg", DATA / "fsdp-fresh/dual-negatives", "rank1.json", "rank0.json", "rank4.json"),
    K("mx-bow", DATA / "mxnet/user_bow_2bit", "worker1.json.gz", "worker0.json.gz", "worker2.json.gz"),
    K("mx-bow-server", DATA / "mxnet/user_bow_2bit", "server0.json.gz", only=("clean", "trunc50", "empty", "nan", "neg",
                                                                              "quant-rev", "quant-unpaired", "quant-gone")),
    K("mx-bow-man", DATA / "mxnet/user_bow_2bit", "mxnet-run.json"),
    K("dino-both", DATA / "fsdp-fresh/dino-both", "rank1.json", "rank0.json", "rank2.json"),
    K("gan-late", DATA / "fsdp-fresh/gan-late", "rank1.json", "rank0.json", "rank2.json"),
]
ROOTED = ("a2c-roots", "gan-roots", "dino-both", "gan-late")

API = ["api-ddp", "api-missing", "api-num", "api-fsdp", "api-rank1-plain"]
ROOTS = ["root0-renamed", "root1-renamed", "root0-dropped", "root1-dropped", "root-swapped", "root-str", "root-neg",
         "root1-units-gone", "root1-colls-gone", "root0-colls-gone"]
QUANT = ["quant-rev", "quant-unpaired", "quant-renamed", "quant-gone"]
PYFN = ["pyfn-one-rank", "pyfn-nan", "pyfn-neg"]
NEW = [*API, *ROOTS, *QUANT, *PYFN]
GENERIC = [*d63.GENERIC, "trunc25", "trunc75", "cross-fw"]

W2, W4 = d63.W2, d63.W4
RUN2 = str(d63.RUN2)
REALNVP, A2C = str(DATA / "replicate/realnvp"), str(DATA / "fsdp-fresh/a2c-roots")
EVERY = tuple(k.name for k in KINDS if k.name not in ("mx-bow-server", "mx-bow-man")) + ("a2c-roots", "gan-roots", STACK)
FEATURE = {
    "realnvp": [["whatif", "RUN", "--bucket-mb", "4", "--no-trace", "-o", "OUT"]],
    "dcp-kineto": [["whatif", "RUN", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"]],
    "dual-neg": [["whatif", "RUN", "--mesh", "1x4", "--no-trace", "-o", "OUT"]],
    "mx-bow": [["whatif", "RUN", "--bandwidth", "100Mbit", "--no-trace", "-o", "OUT"]],
    "mx-bow-server": [["whatif", "RUN", "--bandwidth", "100Mbit", "--no-trace", "-o", "OUT"]],
    "mx-bow-man": [["whatif", "RUN", "--bandwidth", "100Mbit", "--no-trace", "-o", "OUT"]],
    "dino-both": [["whatif", "RUN", "--units", "merge:all", "--no-trace", "-o", "OUT"]],
    "gan-late": [["whatif", "RUN", "--reshard-after-forward", "off", "--no-trace", "-o", "OUT"]],
    STACK: [["whatif", "RUN", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"]],
}
# name -> (argv with RUN/OUT, the kinds it is given to, whether an answer is right there)
FLAGS: dict[str, tuple[list[str], tuple[str, ...], bool]] = {
    "f64-workers0": (["whatif", "RUN", "--workers", "0", "--no-trace", "-o", "OUT"], EVERY, False),
    "f64-workers-frac": (["whatif", "RUN", "--workers", "2.5", "--no-trace", "-o", "OUT"], ("realnvp", "mx-bow"), False),
    "f64-ddp-roots": (["whatif", "RUN", "--data-parallel", "ddp", "--no-trace", "-o", "OUT"],  # answered with its held-out range
                      ("gan-roots", "dino-both", "gan-late"), True),
    "f64-ddp-roots-workers": (["whatif", "RUN", "--data-parallel", "ddp", "--workers", "4", "--no-trace", "-o", "OUT"],
                              ("a2c-roots", "dino-both"), False),
    "f64-fsdp-from-replicate": (["whatif", "RUN", "--data-parallel", "fsdp", "--no-trace", "-o", "OUT"], ("realnvp",), True),
    "f64-optimize-replicate": (["optimize", "RUN", "--budget", "1", "-o", "OUT"], ("realnvp",), True),
    "f64-optimize-verify-replicate": (["optimize", "RUN", "--budget", "1", "--verify", "-o", "OUT"], ("realnvp",), False),
    "f64-optimize-roots": (["optimize", "RUN", "--budget", "1", "-o", "OUT"], ("dino-both", "gan-late"), False),
    "f64-optimize-mx": (["optimize", "RUN", "--budget", "1", "-o", "OUT"], ("mx-bow", "dcp-kineto"), False),
    "f64-units-replicate": (["whatif", "RUN", "--units", "merge:all", "--no-trace", "-o", "OUT"], ("realnvp", "mx-bow"), False),
    "f64-reshard-ddp": (["whatif", "RUN", "--reshard-after-forward", "off", "--no-trace", "-o", "OUT"],
                        ("realnvp", "mx-bow", "dcp-kineto"), False),
    "f64-mesh-dual-wrong": (["whatif", "RUN", "--mesh", "2x3", "--no-trace", "-o", "OUT"], ("dual-neg",), True),
    "f64-mesh-dual-zero": (["whatif", "RUN", "--mesh", "0x4", "--no-trace", "-o", "OUT"], ("dual-neg",), False),
    "f64-mesh-replicate": (["whatif", "RUN", "--mesh", "2x2", "--no-trace", "-o", "OUT"], ("realnvp", "mx-bow"), False),
    "f64-fusion-kineto": (["whatif", "RUN", "--fusion-mb", "8", "--no-trace", "-o", "OUT"], ("dcp-kineto", "realnvp"), False),
    "f64-cycle-mx": (["whatif", "RUN", "--cycle-ms", "5", "--no-trace", "-o", "OUT"], ("mx-bow",), False),
    "f64-bucket-fsdp": (["whatif", "RUN", "--bucket-mb", "4", "--no-trace", "-o", "OUT"], ("dual-neg", "dino-both"), False),
    "f64-bucket-neg": (["whatif", "RUN", "--bucket-mb", "-4", "--no-trace", "-o", "OUT"], ("realnvp", "dcp-kineto"), False),
    "f64-link-w2-on-4": (["whatif", "RUN", "--link-from", str(W2), "--link-to", str(W2), "--no-trace", "-o", "OUT"],
                         ("dual-neg",), False),
    "f64-link-w4-on-2": (["whatif", "RUN", "--link-from", str(W4), "--link-to", str(W4), "--no-trace", "-o", "OUT"],
                         ("realnvp", "gan-late", STACK), False),
    "f64-link-w2": (["whatif", "RUN", "--link-from", str(W2), "--link-to", str(W2), "--no-trace", "-o", "OUT"],
                    ("realnvp", "gan-late"), True),
    "f64-link-mx": (["whatif", "RUN", "--link-from", str(W2), "--link-to", str(W2), "--no-trace", "-o", "OUT"],
                    ("mx-bow",), False),
    "f64-link-model-mx": (["whatif", "RUN", "--link-model", str(W2), "--no-trace", "-o", "OUT"], ("mx-bow",), False),
    "f64-steps-rev": (["analyze", "RUN", "--steps", "5:2"], EVERY, False),
    "f64-steps-out": (["analyze", "RUN", "--steps", "90:99"], ("realnvp", "dual-neg", "mx-bow", "dcp-kineto", STACK), False),
    "f64-template-one": (["replay", "RUN", "--template", "--steps", "1:1", "-o", "OUT"], ("realnvp", "dcp-kineto"), False),
    "f64-cores0": (["whatif", "RUN", "--workers", "4", "--cores", "0", "--no-trace", "-o", "OUT"], ("realnvp", "mx-bow"), False),
    "f64-tp-replicate": (["whatif", "RUN", "--tp-degree", "2", "--no-trace", "-o", "OUT"], ("realnvp", "dino-both"), False),
    "f64-reduce-dtype-word": (["whatif", "RUN", "--reduce-dtype", "float7", "--no-trace", "-o", "OUT"],
                              ("dual-neg", "gan-late"), False),
    "f64-reduce-dtype-ddp": (["whatif", "RUN", "--reduce-dtype", "bfloat16", "--no-trace", "-o", "OUT"], ("mx-bow",), False),
    "f64-prefetch-neg": (["whatif", "RUN", "--prefetch", "-1", "--no-trace", "-o", "OUT"], ("dual-neg", "a2c-roots"), False),
    "f64-diff-replicate-roots": (["diff", A2C, "RUN", "--no-report", "-o", "OUT"], ("realnvp",), False),
    "f64-diff-replicate-ddp": (["diff", RUN2, "RUN", "--no-report", "-o", "OUT"], ("realnvp",), False),
    "f64-diff-self": (["diff", "RUN", "RUN", "--no-report", "-o", "OUT"], ("realnvp", "mx-bow", "dual-neg"), True),
    "f64-diff-replicate-mx": (["diff", REALNVP, "RUN", "--no-report", "-o", "OUT"], ("mx-bow",), False),
    "f64-report-steps": (["report", "RUN", "--steps", "x:3", "-o", "OUT"], ("realnvp", "dual-neg"), False),
    "f64-sgd-run": (["sgd", "RUN"], ("realnvp", "mx-bow"), False),
    "f64-max-bytes": (["analyze", "RUN", "--max-trace-bytes", "100"], ("dcp-kineto", STACK, "mx-bow"), False),
}


def _units(o) -> list[dict]:
    return ((o.get("fsdp") or {}).get("units") or []) if isinstance(o, dict) else []


def _root_edit(damage: str):
    """Rank 1's records of one root changed: its root id renamed/dropped/swapped/a string/negative, or one root's units
    (and their collectives) or collectives alone gone."""
    def edit(o) -> bool:
        units = _units(o)
        if len({u.get("root") for u in units}) < 2:
            return False
        which = 0 if damage.startswith("root0") else 1
        mine = [i for i, u in enumerate(units) if u.get("root") == which]
        if damage.endswith("-renamed"):
            for i in mine:
                units[i]["root"] = which + 5
        elif damage.endswith("-dropped"):
            for i in mine:
                units[i].pop("root")
        elif damage == "root-swapped":
            for u in units:
                u["root"] = 1 - u["root"]
        elif damage == "root-str":
            for i in mine:
                units[i]["root"] = str(which)
        elif damage == "root-neg":
            for i in mine:
                units[i]["root"] = -1
        elif damage.endswith("-colls-gone") or damage == "root1-units-gone":
            o["fsdp"]["collectives"] = [c for c in o["fsdp"].get("collectives") or [] if c.get("unit") not in mine]
            if damage == "root1-units-gone" and mine == list(range(mine[0], len(units))):
                del units[mine[0]:]
            elif damage == "root1-units-gone":
                return False  # its units are not the last: removing them would renumber the other root's
        return True
    return edit


def _api_edit(damage: str):
    def edit(o) -> bool:
        if not isinstance(o, dict) or o.get("ddp_api") != "replicate":
            return False
        if damage == "api-missing":
            o.pop("ddp_api")
        else:
            o["ddp_api"] = {"api-ddp": "ddp", "api-num": 5, "api-fsdp": "fully_shard", "api-rank1-plain": ""}[damage]  # plain: DistributedDataParallel
        return True
    return edit


def _quant_edit(damage: str):
    """The 2-bit compression's spans (the worker's ``QuantizeCPU``, the server's ``DequantizeCPU``) damaged."""
    def edit(o) -> bool:
        ev = di._events(o)
        spans = [e for e in ev if isinstance(e, dict) and e.get("name") in ("QuantizeCPU", "DequantizeCPU") and e.get("ph") in ("B", "E")]
        if not spans:
            return False
        if damage == "quant-rev":  # every other span's end before its begin
            ends = [e for e in spans if e["ph"] == "E"]
            for e in ends[::2]:
                e["ts"] = e["ts"] - 10_000_000
        elif damage == "quant-unpaired":
            drop = {id(e) for e in [e for e in spans if e["ph"] == "E"][::2]}
            o["traceEvents"] = [e for e in ev if id(e) not in drop]
        elif damage == "quant-renamed":
            for e in spans[::2]:
                e["name"] = "QuantizeGPU"
        else:  # gone
            drop = {id(e) for e in spans}
            o["traceEvents"] = [e for e in ev if id(e) not in drop]
        return True
    return edit


def _pyfn_edit(damage: str):
    def edit(o) -> bool:
        ev = di._events(o)
        py = [e for e in ev if isinstance(e, dict) and e.get("cat") == "python_function"]
        if not py:
            return False
        if damage == "pyfn-one-rank":
            o["traceEvents"] = [e for e in ev if not (isinstance(e, dict) and e.get("cat") == "python_function")]
        for e in py[::2]:
            e["dur"] = float("nan") if damage == "pyfn-nan" else -abs(e.get("dur", 1))
        return True
    return edit


def _with_stack(root: Path) -> di.Kind:
    """clip-kineto's traces with a ``python_function`` event around each CPU op of the loop's thread, as ``with_stack=True``
    records them (stock traces of such jobs hold thousands)."""
    src = DATA / "ddp-fresh/clip-kineto"
    out = root / "_src" / STACK
    out.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir()):
        obj, gz = di.damage_more._json(p)
        ev = di._events(obj)
        ops = [e for e in ev if isinstance(e, dict) and e.get("cat") == "cpu_op" and e.get("ph") == "X"]
        ev += [{"ph": "X", "cat": "python_function", "name": "torch/nn/modules/module.py(1750): _call_impl", "pid": e["pid"],
                "tid": e["tid"], "ts": e["ts"] - 1, "dur": e.get("dur", 0) + 2, "args": {"Python id": i}} for i, e in enumerate(ops)]
        di.damage_more._put(out / p.name, json.dumps(obj).encode(), gz)
    names = sorted(p.name for p in src.iterdir())
    return K(STACK, out, names[1], names[0], names[1].replace("rank1.", "rank2."), named_by_content=True,
             unread=("pyfn-nan", "pyfn-neg"))  # Python-call events are counted, never timed


EDITS = {**{d: _api_edit(d) for d in API}, **{d: _root_edit(d) for d in ROOTS}, **{d: _quant_edit(d) for d in QUANT},
         **{d: _pyfn_edit(d) for d in PYFN}}
APPLIES = {**dict.fromkeys(API, ("realnvp",)), **dict.fromkeys(ROOTS, ROOTED), **dict.fromkeys(QUANT, ("mx-bow", "mx-bow-server")),
           **dict.fromkeys(PYFN, (STACK,))}


def case_maker(edits: dict, applies: dict, fallback):
    """A ``make_case`` for a damage file's own JSON edits (``edits``, on the kinds ``applies`` names for each); the other
    damages (and the flags) as ``fallback`` makes them."""
    def make(kind: di.Kind, damage: str, root: Path) -> tuple[Path, str] | None:
        if kind.only and damage not in kind.only and damage not in d63.FLAGS:
            return None
        if damage not in edits:
            return fallback(kind, damage, root)
        if kind.name not in applies[damage]:
            return None
        copied = d63.d58.clean_copy(kind, damage, root)
        if copied is None:
            return None
        case, arg = copied
        t = case / kind.target
        return (arg, str(t)) if d63._edit_json(t, edits[damage]) else None
    return make


make_case = case_maker(EDITS, APPLIES, d63.make_case)  # this file's damages; the others as ``damage_63`` makes them


SAME_WORDS = re.compile(r"its unit \d+ is (.+), rank \d+'s \1: ")


def problem_named(row: dict) -> dict:
    """A refusal that names the file but describes the rank's unit and rank 0's in the same words (the difference, a root
    id, unnamed) judged bad: ``same-words``; the model check's refusal of an undamaged input's what-if good; an answer to a
    flag ``FLAGS`` takes as a valid what-if good (a sweep's rows are judged when run: the table may have changed since)."""
    if row["class"] == "refused" and SAME_WORDS.search(row["stderr"]):
        return row | {"class": "same-words", "verdict": "bad"}
    if row["class"] == "silent" and FLAGS.get(row["damage"], ((), (), False))[2]:
        return row | {"class": "accepted", "verdict": "good"}  # a what-if this file's flags take as valid
    if row["damage"] == "root0-dropped" and row["class"] == "silent" and row["number"] == row["clean"]:
        return row | {"class": "unread", "verdict": "good"}  # an absent root id reads as 0: the file says what it said
    if row["damage"] == "clean" and row["class"] == "refused-model":
        return row | {"verdict": "good"}  # the model check's refusal of an undamaged what-if (dino-both's +2.1 %)
    return row


def register() -> None:
    """This file's features and flags added to ``damage_63``'s tables (its judge and commands read them)."""
    d63.FEATURE.update(FEATURE)
    d63.FLAGS.update(FLAGS)


def main() -> int:
    a = d63.sweep_parser(__doc__, "/tmp/damage64/cases", [*(k.name for k in KINDS), "a2c-roots", "gan-roots", STACK],
                         [*GENERIC, *NEW, *FLAGS]).parse_args()
    register()
    every = lambda: [*KINDS, *d63.KINDS, *([_with_stack(Path(a.out))] if STACK in a.kinds.split(",") else [])]  # noqa: E731
    return d63.sweep_main(a, every, make_case, problem_named)


if __name__ == "__main__":
    sys.exit(main())
