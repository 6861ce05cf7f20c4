"""Damages of the inputs of the features added at stops 60-62 that the earlier sweeps (``damage_inputs``, ``damage_more``,
``damage_58``, ``damage_59``) never fed: FSDP2 runs of several ``fully_shard`` roots, MXNet 2-bit compressed pushes, a
Horovod window the load swung and a loaded Horovod profile (negotiations scaled), TF's profiler-cost step times, a
script's own async collectives (a hand-bucketed ResNet, a GRU whose last all-gather is waited after the window, a DP x TP
ViT), a user's own trace whose last step is epoch-end code, a step GradScaler skipped, and ``dagprof calibrate``'s
version-5 link-model files (``times_us``, ``cpus``, ``load``).

Each rank-1 file is truncated at 10/25/50/75/99 %, dropped, duplicated under another rank's name, swapped with rank 0's,
replaced by another framework's file of the same name, its numbers made negative/NaN/infinite; each feature's own fields
are damaged (a root unit renamed on one rank, a compressed push among plain ones, NaN unprofiled step times, negative
negotiation spans, ``times_us`` of the wrong shape, a calibration of another world size or backend); each command
(``whatif``, ``replay``, ``analyze``, ``optimize``, ``diff``, ``report``, ``sgd``, ``calibrate``) is given wrong flags
and flag combinations, with and without ``--json``. Classes and verdicts as ``damage_inputs.classify`` and
``damage_58.judge``: one-line refusal naming the file (or flag), warning with a count, traceback, silent number, hang::

    python bench/damage_63.py [--kinds a2c-roots,linkv5] [--damages trunc25,cross-fw] [--json FILE] [--src DIR]
    python bench/damage_63.py --compare BEFORE.json AFTER.json
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import damage_58 as d58  # noqa: E402  (its sweep's judge and table; damage_inputs' kinds, runner and classes)
import damage_inputs as di  # noqa: E402

DATA = di.DATA
W2, W4 = DATA / "link-v5/gloo-w2.json", DATA / "link-v5/gloo-w4.json"  # dagprof calibrate --world 2/4 --max-mb 1 --iters 3
BCAFFE = DATA / "bcaffe-k80-googlenet/tmp4comm.log"

K = di.Kind
KINDS = [
    K("a2c-roots", DATA / "fsdp-fresh/a2c-roots", "rank1.json", "rank0.json", "rank2.json"),
    K("gan-roots", DATA / "fsdp-fresh/gan-roots", "rank1.json", "rank0.json", "rank2.json"),
    K("mx-2bit", DATA / "mxnet/user_resnet_2bit", "worker1.json.gz", "worker0.json.gz", "worker2.json.gz"),
    K("mx-2bit-man", DATA / "mxnet/user_resnet_2bit", "mxnet-run.json"),
    K("hvd-swung", DATA / "horovod/gine-swung", "rank1.horovod.json", "rank0.horovod.json", "rank2.horovod.json"),
    K("hvd-loaded", DATA / "horovod/pinned-loaded", "horovod_timeline.json"),
    K("tf-cost", DATA / "tf/fit-margins", "rank1.json", "rank0.json", "rank2.json"),
    K("gru-waited", DATA / "hand-dp/gru-last-gather", "rank1.kineto.json.gz", "rank0.kineto.json.gz", "rank2.kineto.json.gz"),
    K("convnet-async", DATA / "hand-dp/convnet-buckets", "rank1.kineto.json.gz", "rank0.kineto.json.gz", "rank2.kineto.json.gz"),
    K("vit-dptp", DATA / "tp-fresh/vit-tp-api-sized", "rank1.json", "rank0.json", "rank4.json"),
    K("cut-epoch", DATA / "cut-steps/epoch-end", "trace_rank1.json.gz", "trace_rank0.json.gz", "trace_rank2.json.gz",
      named_by_content=True),
    K("caps-skip", DATA / "ddp-fresh/caps-skip", "rank1.json", "rank0.json", "rank2.json", ddp=True),
    K("linkv5", W2, "gloo-w2.json"),  # the link-model file itself, given to whatif/sgd beside an undamaged run
    K("calibrate", W2, "gloo-w2.json", only=("clean",)),  # calibrate's own flags (a pseudo-kind: no input damaged)
]

GENERIC = ["trunc10", "trunc50", "trunc99", "truncgz", "empty", "missing", "dup", "swap", "dupover", "nan", "neg", "inf",
           "collsize", "onestep", "nosteps", "coll-drop", "stop-mid", "other-window"]
NEW = ["trunc25", "trunc75", "cross-fw", "root-renamed", "root-dropped", "mx-mixed-push", "mx-server-gone", "unprof-notnum",
       "unprof-neg", "unprof-str", "negotiate-neg", "negotiate-notnum", "times-notnum", "times-neg", "times-shape", "times-len",
       "times-str", "cpus-neg", "cpus-str", "load-str", "load-notnum", "world4", "backend-nccl", "v5-no-times",
       "kinds-no-times", "workers0"]
LINK_DAMAGES = ["trunc10", "trunc50", "trunc99", "empty", "garbage", *NEW[12:]]

# another framework's file given the rank-1 file's name (relative to DATA; gzipped where the name says so)
CROSS = {"rank1.json": "tf/fit-margins/rank1.json", "worker1.json.gz": "gloo-windows/same/rank-1.pt.trace.json.gz",
         "rank1.horovod.json": "mxnet/user_resnet_2bit/worker1.json.gz", "mxnet-run.json": "horovod/gine-swung/manifest.json",
         "horovod_timeline.json": "mxnet/user_resnet_2bit/worker1.json.gz",
         "rank1.kineto.json.gz": "horovod/gine-swung/horovod_timeline.json",
         "trace_rank1.json.gz": "mxnet/user_resnet_2bit/worker1.json.gz"}
TF_CROSS = "fsdp-fresh/gan-roots/rank1.json"

# what each kind's feature is asked (besides analyze): the input's place marked RUN, the output's OUT
FEATURE = {
    "a2c-roots": [["whatif", "RUN", "--units", "merge:all", "--no-trace", "-o", "OUT"],
                  ["whatif", "RUN", "--reshard-after-forward", "off", "--no-trace", "-o", "OUT"]],
    "gan-roots": [["whatif", "RUN", "--units", "merge:all", "--no-trace", "-o", "OUT"]],
    "mx-2bit": [["whatif", "RUN", "--bandwidth", "100Mbit", "--no-trace", "-o", "OUT"]],
    "mx-2bit-man": [["whatif", "RUN", "--bandwidth", "100Mbit", "--no-trace", "-o", "OUT"]],
    "hvd-swung": [["replay", "RUN", "--template", "-o", "OUT"]],
    "hvd-loaded": [["whatif", "RUN", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"]],
    "tf-cost": [["whatif", "RUN", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"]],
    "gru-waited": [["whatif", "RUN", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"]],
    "convnet-async": [["whatif", "RUN", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"]],
    "vit-dptp": [["whatif", "RUN", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"]],
    "cut-epoch": [["replay", "RUN", "-o", "OUT"]],
    "caps-skip": [["whatif", "RUN", "--bucket-mb", "1", "--no-trace", "-o", "OUT"]],
}
RUN2 = DATA / "ddp-testbed/run"  # 2 gloo ranks: the run a damaged link-model file is read beside
LINK_CMDS = [["whatif", str(RUN2), "--link-from", "LINK", "--link-to", str(W2), "--no-trace", "-o", "OUT"],
             ["whatif", str(RUN2), "--link-model", "LINK", "--allow-model-error", "--no-trace", "-o", "OUT"],
             ["sgd", str(BCAFFE), "--workers", "1,4", "--link-model", "LINK"]]

# wrong flags and flag combinations: name -> (argv with RUN/OUT, the kinds it is given to, whether an answer is right there)
A2C, GAN, SWUNG, CUT = (str(DATA / p) for p in ("fsdp-fresh/a2c-roots", "fsdp-fresh/gan-roots", "horovod/gine-swung", "cut-steps/epoch-end"))
FLAGS: dict[str, tuple[list[str], tuple[str, ...], bool]] = {
    "f-units-zero": (["whatif", "RUN", "--units", "merge:0", "--no-trace", "-o", "OUT"], ("a2c-roots",), False),
    "f-units-span": (["whatif", "RUN", "--units", "actor+critic", "--no-trace", "-o", "OUT"], ("a2c-roots",), False),
    "f-units-unknown": (["whatif", "RUN", "--units", "nosuch.0+nosuch.1", "--no-trace", "-o", "OUT"], ("gan-roots",), False),
    "f-units-ddp": (["whatif", "RUN", "--units", "merge:all", "--no-trace", "-o", "OUT"], ("caps-skip", "mx-2bit"), False),
    "f-reshard-word": (["whatif", "RUN", "--reshard-after-forward", "maybe", "--no-trace", "-o", "OUT"], ("a2c-roots",), False),
    "f-ddp-from-roots": (["whatif", "RUN", "--data-parallel", "ddp", "--no-trace", "-o", "OUT"], ("a2c-roots",), False),
    "f-optimize-roots": (["optimize", "RUN", "--budget", "1", "-o", "OUT"], ("a2c-roots",), False),
    "f-mesh-roots": (["whatif", "RUN", "--mesh", "2x2", "--no-trace", "-o", "OUT"], ("gan-roots",), True),
    "f-link-from-only": (["whatif", "RUN", "--link-from", str(W2), "--no-trace", "-o", "OUT"], ("caps-skip", "vit-dptp"), False),
    "f-link-to-only": (["whatif", "RUN", "--link-to", str(W2), "--no-trace", "-o", "OUT"], ("caps-skip",), False),  # --link-to needs --link-from
    "f-link-world4": (["whatif", "RUN", "--link-from", str(W4), "--link-to", str(W2), "--no-trace", "-o", "OUT"],
                      ("caps-skip", "vit-dptp"), False),
    "f-link-both-w4": (["whatif", "RUN", "--link-from", str(W4), "--link-to", str(W4), "--no-trace", "-o", "OUT"],
                       ("caps-skip",), False),  # a 4-rank calibration for a 2-rank run, both sides
    "f-link-and-bw": (["whatif", "RUN", "--link-to", str(W2), "--bandwidth", "1Gbit", "--no-trace", "-o", "OUT"],
                      ("vit-dptp",), False),
    "f-cycle-nonhvd": (["whatif", "RUN", "--cycle-ms", "5", "--no-trace", "-o", "OUT"], ("tf-cost", "mx-2bit"), False),
    "f-cycle-neg": (["whatif", "RUN", "--cycle-ms", "-1", "--no-trace", "-o", "OUT"], ("hvd-swung",), False),
    "f-fusion-nan": (["whatif", "RUN", "--fusion-mb", "nan", "--no-trace", "-o", "OUT"], ("hvd-swung",), False),
    "f-cores0": (["whatif", "RUN", "--workers", "4", "--cores", "0", "--no-trace", "-o", "OUT"], ("a2c-roots", "hvd-swung"), False),
    "f-cores-frac": (["whatif", "RUN", "--cores", "1.5", "--no-trace", "-o", "OUT"], ("tf-cost",), False),
    "f-template-steps-cut": (["replay", "RUN", "--template", "--steps", "6:8", "-o", "OUT"], ("cut-epoch",), False),
    "f-steps-one-cut": (["analyze", "RUN", "--steps", "7"], ("cut-epoch",), False),
    "f-template-one": (["replay", "RUN", "--template", "--steps", "6", "-o", "OUT"], ("hvd-swung",), True),  # its first step
    "f-tp-degree-dptp": (["whatif", "RUN", "--tp-degree", "3", "--no-trace", "-o", "OUT"], ("vit-dptp",), False),
    "f-pp-neg": (["whatif", "RUN", "--pp-degree", "-2", "--no-trace", "-o", "OUT"], ("vit-dptp",), False),
    "f-diff-roots-other": (["diff", GAN, "RUN", "--no-report", "-o", "OUT"], ("a2c-roots",), False),
    "f-diff-fw": (["diff", SWUNG, "RUN", "--no-report", "-o", "OUT"], ("mx-2bit",), False),
    "f-diff-top0": (["diff", "RUN", "RUN", "--top", "0", "-o", "OUT"], ("gru-waited",), False),
    "f-report-steps-neg": (["report", "RUN", "--steps", "-1:3", "-o", "OUT"], ("a2c-roots", "hvd-swung"), False),
    "f-analyze-steps-rev": (["analyze", "RUN", "--steps", "8:3"], ("mx-2bit", "tf-cost"), False),
    "f-optimize-mx": (["optimize", "RUN", "--budget", "1", "-o", "OUT"], ("mx-2bit",), False),
    "f-optimize-mem-nan": (["optimize", "RUN", "--memory-budget", "nanGB", "--budget", "1", "-o", "OUT"], ("caps-skip",), False),
    "f-sgd-link-w4": (["sgd", str(BCAFFE), "--workers", "1,4", "--link-model", str(W4), "--link-to", str(W2)], ("linkv5",), False),
    "f-sgd-workers0": (["sgd", str(BCAFFE), "--workers", "0", "--link-model", str(W2)], ("linkv5",), False),
    "f-sgd-kineto": (["sgd", "RUN"], ("cut-epoch",), False),
    "f-cal-world0": (["calibrate", "--world", "0", "-o", "OUT/cal.json"], ("calibrate",), False),
    "f-cal-maxmb-neg": (["calibrate", "--world", "2", "--max-mb", "-1", "-o", "OUT/cal.json"], ("calibrate",), False),
    "f-cal-iters0": (["calibrate", "--world", "2", "--iters", "0", "-o", "OUT/cal.json"], ("calibrate",), False),
    "f-cal-kinds": (["calibrate", "--world", "2", "--kinds", "all_to_none", "-o", "OUT/cal.json"], ("calibrate",), False),
    "f-cal-overlap-nan": (["calibrate", "--world", "2", "--overlap", "--overlap-mb", "nan", "-o", "OUT/cal.json"],
                          ("calibrate",), False),
    "f-cal-nccl-kineto": (["calibrate", "--nccl-tests", str(DATA / "gloo-windows/same/rank-0.pt.trace.json.gz"),
                           "-o", "OUT/cal.json"], ("calibrate",), False),
    "f-cal-nccl-v5": (["calibrate", "--nccl-tests", str(W2), "-o", "OUT/cal.json"], ("calibrate",), False),
    "f-cal-out-dir": (["calibrate", "--nccl-tests", str(DATA / "nccl-tests-lut/a100"), "-o", str(DATA)], ("calibrate",), False),
}


def _edit_json(t: Path, edit) -> bool:
    obj, gz = di.damage_more._json(t)
    if obj is None or not edit(obj):
        return False
    di.damage_more._put(t, json.dumps(obj).encode(), gz)
    return True


def _roots(o, how: str) -> bool:
    """Rank 1's second root renamed (its units' root index moved past the last root) or its units' root marks dropped."""
    units = (o.get("fsdp") or {}).get("units") if isinstance(o, dict) else None
    if not units or len({u.get("root") for u in units}) < 2:
        return False
    for u in units:
        if u.get("root"):
            if how == "renamed":
                u["root"] += 5
            else:
                u.pop("root")
    return True


def _mixed_push(o) -> bool:
    """Every other event of the 2-bit compressed pushes (their begins) renamed ``KVStoreDistPush``: half the pushes' begin and
    end no longer pair, and the reader drops both unseen (still open; the realistic mix, ``KVStoreDistDefaultPush``, is refused)."""
    ev = di._events(o)
    push = [e for e in ev if isinstance(e, dict) and "Compressed" in str(e.get("name", ""))]
    for e in push[::2]:
        e["name"] = str(e["name"]).replace("Compressed", "")
    return bool(push)


def _unprofiled(value):
    def edit(o) -> bool:
        u = o.get("unprofiled_step_times_us") if isinstance(o, dict) else None
        if not isinstance(u, dict) or not u:
            return False
        for s in list(u)[1::2]:
            u[s] = value
        return True
    return edit


def _negotiate(value):
    def edit(o) -> bool:
        spans = [e for e in di._events(o) if isinstance(e, dict) and "NEGOTIATE" in str(e.get("name", "")).upper()
                 and isinstance(e.get("ts"), (int, float))]
        for e in spans[::3]:
            if e.get("ph") == "X":
                e["dur"] = value
            else:
                e["ts"] = value if value != value else -abs(e["ts"])
        return bool(spans)
    return edit


def _link(damage: str):
    def edit(d) -> bool:
        t = d.get("times_us")
        if damage == "times-notnum":
            t[1][0][0] = float("nan")
        elif damage == "times-neg":
            t[2][1][1] = -3.0
        elif damage == "times-shape":
            t[1] = t[1][:1]  # one rank's row lost at one size
        elif damage == "times-len":
            d["times_us"] = t[:-1]
        elif damage == "times-str":
            t[0][0][0] = "12.5us"
        elif damage == "cpus-neg":
            d["cpus"] = -2
        elif damage == "cpus-str":
            d["cpus"] = "two"
        elif damage == "load-str":
            d["load"] = ["high", "low"]
        elif damage == "load-notnum":
            d["load"] = [float("nan"), 1.0]
        elif damage == "backend-nccl":
            d["backend"] = "nccl"
        elif damage == "v5-no-times":
            d.pop("times_us")
            for k in d.get("kinds", {}).values():
                k.pop("times_us", None)
        elif damage == "kinds-no-times":
            for k in d.get("kinds", {}).values():
                k.pop("times_us", None)
        elif damage == "workers0":
            d["workers"] = 0
        else:
            return False
        return True
    return edit


def make_case(kind: di.Kind, damage: str, root: Path) -> tuple[Path, str] | None:
    """A damaged copy of ``kind``'s input; the input given to the commands and the file damaged, or None."""
    if kind.name == "calibrate":
        return (root / "calibrate", str(W2)) if damage in FLAGS and kind.name in FLAGS[damage][1] or damage == "clean" else None
    if damage in FLAGS:
        return di.make_case(kind, "clean", root) if kind.name in FLAGS[damage][1] else None
    if kind.name == "linkv5":
        if damage not in ("clean", *LINK_DAMAGES):
            return None
        case = root / kind.name / damage
        shutil.rmtree(case, ignore_errors=True)
        case.mkdir(parents=True)
        t = case / "link.json"
        shutil.copy(W4 if damage == "world4" else W2, t)
        if damage.startswith("trunc"):
            di._truncate(t, int(damage[5:]) / 100)
        elif damage in ("empty", "garbage"):
            t.write_bytes(b"" if damage == "empty" else os.urandom(0) + bytes(range(256)) * 16)
        elif damage not in ("clean", "world4") and not _edit_json(t, _link(damage)):
            return None
        return t, str(t)
    if damage in GENERIC or damage == "clean":
        if damage in d58.DAMAGES:
            return d58.make_case(kind, damage, root)
        return di.make_case(kind, damage, root)
    if damage in NEW[:12]:
        copied = d58.clean_copy(kind, damage, root)
        if copied is None:
            return None
        case, arg = copied
        t = case / kind.target
        if damage in ("trunc25", "trunc75"):
            di._truncate(t, int(damage[5:]) / 100)
        elif damage == "cross-fw":
            src = DATA / (TF_CROSS if kind.name == "tf-cost" else CROSS.get(t.name, ""))
            if not src.is_file() or t.suffix == ".json" and kind.name.startswith("vit"):
                return None
            raw = src.read_bytes()
            plain = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
            t.write_bytes(gzip.compress(plain, mtime=0) if t.name.endswith(".gz") else plain)
        elif damage in ("root-renamed", "root-dropped"):
            if not _edit_json(t, lambda o: _roots(o, damage.split("-")[1])):
                return None
        elif damage == "mx-mixed-push":
            if not t.name.startswith("worker") or not _edit_json(t, _mixed_push):
                return None
        elif damage == "mx-server-gone":
            s = case / "server0.json.gz"
            if not s.is_file() or kind.name != "mx-2bit":
                return None
            s.unlink()
        elif damage.startswith("unprof-"):
            value = {"unprof-notnum": float("nan"), "unprof-neg": -5000.0, "unprof-str": "18 ms"}[damage]
            if not _edit_json(t, _unprofiled(value)):
                return None
        elif damage.startswith("negotiate-"):
            tl = case / "horovod_timeline.json"
            if not tl.is_file() or not _edit_json(tl, _negotiate(-250.0 if damage.endswith("neg") else float("nan"))):
                return None
            return arg, str(tl)
        return arg, str(t)
    return None


def commands(kind: di.Kind, damage: str, arg: Path, out: Path) -> list[list[str]]:
    """Each damage's commands, with and without --json: analyze and the kind's feature; a flag its own command."""
    def fill(argv: list[str]) -> list[str]:
        return [w.replace("OUT", str(out)) if w.startswith("OUT") else {"RUN": str(arg), "LINK": str(arg)}.get(w, w) for w in argv]

    def both(argv: list[str]) -> list[list[str]]:
        return [[argv[0], "--json", *argv[1:]], argv]
    if damage in FLAGS:
        return [fill(a) for a in both(FLAGS[damage][0])]
    if kind.name == "linkv5":
        return [fill(a) for c in LINK_CMDS for a in both(c)]
    base = [["analyze", "--json", str(arg)], ["analyze", str(arg)]]
    return base + [fill(a) for c in FEATURE.get(kind.name, []) for a in both(c)]


def must_flag(kind: di.Kind, damage: str) -> bool:
    if damage in FLAGS:
        return not FLAGS[damage][2]
    if kind.named_by_content and damage == "swap":
        return False
    return damage != "clean"


def judge(kind: di.Kind, damage: str, argv: list[str], rc, so: str, se: str, case: Path, clean) -> tuple[str, str]:
    """``damage_inputs.classify`` with this file's flags and link files: a refusal naming the flag or the damaged file is
    good; exit 0 with no warning on a damage that must be flagged is a silent number."""
    saved = dict(di.FLAGS)
    di.FLAGS.update({k: (v[0], ("*",) if v[2] else ()) for k, v in FLAGS.items()})
    try:
        cls, verdict = di.classify(kind, damage, rc, so, se, case, clean)
    finally:
        di.FLAGS.clear()
        di.FLAGS.update(saved)
    last = ([x for x in se.splitlines() if x.strip()] or [""])[-1]
    named = [w for w in argv if w.startswith(("/", "--")) and w != "--json"]
    if cls == "refused-vague" and "error" in last and any(w in last for w in named):
        cls, verdict = "refused", "good"
    if cls == "refused-vague" and "not predicting:" in last:
        cls, verdict = "refused-model", "good"
    if cls == "accepted":
        verdict = "bad" if must_flag(kind, damage) and damage != "clean" else "good"
        cls = "silent" if verdict == "bad" else cls
    if cls == "refused" and damage in FLAGS and FLAGS[damage][2]:
        verdict = "bad"  # a valid what-if refused
    if len([x for x in se.splitlines() if x.startswith(("error", "dagprof: error"))]) > 1:
        cls, verdict = "multi-line", "bad"
    return cls, verdict


def said(so: str, se: str) -> list[str]:
    """The warnings a run gave (stderr's warning lines, --json's ``warnings``), paths cut to their file names."""
    lines = [x for x in se.splitlines() if re.search(r"warn|note", x, re.I)] + [x for x in so.splitlines() if x.startswith(("warning", "note"))]
    try:
        doc = json.loads(so.strip().splitlines()[-1])
        lines += [str(w) for w in doc.get("warnings") or []] if isinstance(doc, dict) else []
    except (ValueError, IndexError):
        pass
    return sorted({re.sub(r"/\S*/", "", x)[:300] for x in lines})


def sweep(kinds: list[di.Kind], damages: list[str], root: Path, timeout: float, json_out: str | None,
          make=make_case) -> list[dict]:
    """Every command on each damage of each kind; a warning the undamaged input gives too is no warning of the damage.
    ``make``: the damaged copy's maker (``damage_64`` passes its own, which falls back to this file's)."""
    rows: list[dict] = []
    for kind in kinds:
        clean: dict[int, float | None] = {}
        clean_said: dict[int, list[str]] = {}
        for damage in ["clean", *damages]:
            made = make(kind, damage, root)
            if made is None:
                continue
            arg, damaged = made
            case = root / kind.name / damage
            out = root / "out" / kind.name / damage
            refused = False
            for i, argv in enumerate(commands(kind, damage, arg, out)):
                if kind.name == "calibrate" and damage == "clean":
                    break
                if refused and i > 2:
                    continue  # the same readers refuse every command: checked on analyze (json, text) and one more
                rc, so, se = di.run_cli(argv, out / f"c{i}", timeout)
                refused = refused or (i == 0 and rc == 2)
                if damage == "clean":
                    clean[i], clean_said[i] = di.headline(so), said(so, se)
                cls, verdict = judge(kind, damage, argv, rc, so.replace(str(case), "CASE").replace(str(out), "OUT"), se, case, clean.get(i))  # "nan" in a path
                if cls == "warned" and damage not in FLAGS and set(said(so, se)) <= set(clean_said.get(i, [])):
                    number = di.headline(so)
                    same = number is None or clean.get(i) is not None and abs(number - clean[i]) <= 1e-3 * abs(clean[i])
                    cls, verdict = ("unread", "good") if same else ("silent", "bad")
                if damage == "clean":
                    cls, verdict = ("clean-ok", "good") if rc == 0 else (cls, "bad")
                last = ([x for x in se.splitlines() if x.strip()] or [""])[-1]
                rows.append(allowed({"kind": kind.name, "damage": damage, "argv": argv[0], "json": "--json" in argv, "cmd": i, "rc": rc,
                                     "class": cls, "verdict": verdict, "number": di.headline(so), "clean": clean.get(i),
                                     "stderr": last[:300], "file": damaged, "line": " ".join(argv)}))
                cls, verdict = rows[-1]["class"], rows[-1]["verdict"]
                print(f"{kind.name:13} {damage:20} {argv[0]:9}{' J' if '--json' in argv else '  '} rc={rc!s:4} {cls:13} {verdict:5} "
                      f"{rows[-1]['number'] if rows[-1]['number'] is not None else '':<10} {last[:150]}", flush=True)
            if json_out:
                Path(json_out).write_text(json.dumps(rows, indent=1))
    return rows


# link-model damages an answer may read through: a file that keeps no repetitions is read at its medians (as version 4 is);
# another world size or backend is a what-if for --link-model and sgd, refused only as --link-from (the profiled link)
LINK_READABLE = {"v5-no-times": ("",), "kinds-no-times": ("",), "world4": ("--link-model", "sgd"), "backend-nccl": ("--link-model", "sgd")}


def allowed(row: dict) -> dict:
    """``row`` with a silent answer on a damage the command may read through (``LINK_READABLE``) judged good."""
    words = LINK_READABLE.get(row["damage"], ()) if row["kind"] == "linkv5" else ()
    if row["class"] == "silent" and any(w in row["line"].split() or w == "" for w in words):
        return row | {"class": "read-through", "verdict": "good"}
    return row


def rejudged(row: dict) -> dict:
    """A kept row's warnings read again from its kept output beside the undamaged input's (``said``)."""
    if row["class"] not in ("silent", "unread") or row["rc"] != 0 or f"/{row['kind']}/{row['damage']}" not in row["file"]:
        return row
    out = Path(row["file"].split(f"/{row['kind']}/{row['damage']}")[0]) / "out" / row["kind"]
    try:
        got, ref = ([said((d / f"c{row['cmd']}" / "stdout").read_text(), (d / f"c{row['cmd']}" / "stderr").read_text())
                     for d in (out / row["damage"], out / "clean")])
    except OSError:
        return row
    if set(got) - set(ref):
        same = row["number"] is None or row["clean"] is not None and abs(row["number"] - row["clean"]) <= 1e-3 * abs(row["clean"])
        return row | {"class": "warned", "verdict": "good" if same else "good?"}
    return row


def compare(before: list[dict], after: list[dict]) -> None:
    before, after = ([allowed(rejudged(r)) for r in rows] for rows in (before, after))
    key = lambda r: (r["kind"], r["damage"], r["argv"], r["json"], r["cmd"])  # noqa: E731
    b = {key(r): r for r in before}
    for r in after:
        old = b.get(key(r))
        if old is not None and (old["class"], old["verdict"]) != (r["class"], r["verdict"]):
            print(f"{r['kind']:13} {r['damage']:20} {r['argv']:9}{' J' if r['json'] else '  '} {old['class']}/{old['verdict']} -> "
                  f"{r['class']}/{r['verdict']}  {r['stderr'][:140]}")
    for name, rows in (("before", before), ("after", after)):
        classes = {c: sum(r["class"] == c for r in rows) for c in sorted({r["class"] for r in rows})}
        print(f"{name}: {len(rows)} runs, bad {sum(r['verdict'] == 'bad' for r in rows)}; {classes}")


def sweep_parser(doc: str, out: str, kinds: list[str], damages: list[str]) -> argparse.ArgumentParser:
    """The options every damage file's sweep takes (a file adds its own): its first docstring line, cases folder, kinds
    and damages by default."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=out)
    ap.add_argument("--kinds", default=",".join(kinds))
    ap.add_argument("--damages", default=",".join(damages))
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--src", default=str(di.REPO / "src"))
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    return ap


def sweep_main(a: argparse.Namespace, kinds, make=make_case, judged=lambda row: row) -> int:
    """The tail every damage file's ``main`` shares: ``--compare``'s two row files judged by ``judged``, else the sweep of
    ``a.kinds`` among ``kinds()`` (called only then: a kind may be made at run time) by ``make`` on ``a.src``."""
    if a.compare:
        compare(*([judged(r) for r in json.loads(Path(p).read_text())] for p in a.compare))
        return 0
    os.environ.setdefault("DAGPROF_CACHE_DIR", str(Path(a.out).parent / "cache"))
    sys.path.insert(0, a.src)
    import dagprof.cli.main  # noqa: F401  (imported once, before forking)
    names = a.kinds.split(",")
    chosen = [k for k in kinds() if k.name in names]
    return report_rows([judged(r) for r in sweep(chosen, a.damages.split(","), Path(a.out), a.timeout, a.json_out, make=make)], a.json_out)


def report_rows(rows: list[dict], json_out: str | None) -> int:
    """The judged rows written to ``--json`` (over the sweep's unjudged ones) and counted by class."""
    if json_out:
        Path(json_out).write_text(json.dumps(rows, indent=1))
    counts = {c: sum(r["class"] == c for r in rows) for c in sorted({r["class"] for r in rows})}
    print(f"{len(rows)} runs, bad {sum(r['verdict'] == 'bad' for r in rows)}: {counts}")
    return 0


def main() -> int:
    a = sweep_parser(__doc__, "/tmp/badinput63/cases", [k.name for k in KINDS], [*GENERIC, *NEW, *FLAGS]).parse_args()
    return sweep_main(a, lambda: KINDS)


if __name__ == "__main__":
    sys.exit(main())
