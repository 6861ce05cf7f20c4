"""Damages of the inputs and features added at stop 66 that no sweep fed yet (``damage_63``/``damage_64``/``damage_66`` are
the machinery; this file adds kinds, damages and flags to them): the GAT profiled at 1 Gbit/s with its logged metric
(``ddp-fresh/gat-log-1g``, its rank files and their Kineto traces), the DQN profiled on a loaded machine
(``ddp-fresh/dqn-loaded``, the shared-cores load note), the JAX CLIP whose batch copy ran late (``tf-jax/clip-h2d-late``),
the HSDP causal transformer (``fsdp/hsdp-tf``) and a Glow flow recorded on a 1x2 mesh (``--glow DIR``: ``dagprof profile
--no-kineto -o DIR -- torchrun ... bench/fsdp_fresh/hsdp_glow.py --shard 2``; skipped without it), an ``optimize
--allow-lossy`` run's kept ``codec-costs.json``, the ``--profiled-bandwidth`` note paths, ``whatif --cores``, and flag
mistakes on every subcommand (wrong types, conflicting flags, a missing file, a folder for a file, an empty folder, a
symbolic-link loop, a 0-byte file, gzip'd or cut JSON). Unreadable permissions are not swept: as root every file reads.

Damages of each rank file kind: a rank missing, duplicated under the next rank's name, replaced by rank 0's copy or by
another run's rank of the same world size (``other-run``), its steps moved off the others' (``other-window``), cut, empty;
the DQN's thread records (a negative or NaN wait, rows cut short, another host, no cores); the kept codec costs cut,
emptied, gzip'd, of another machine or other shapes, of a newer layout, NaN/negative/infinite, a folder, a link loop::

    python bench/damage_67.py [--kinds gat-log,codec] [--damages other-run,cc-nan] [--glow DIR] [--json FILE] [--src DIR]
                              [--json-only | --text-only]
    python bench/damage_67.py --compare BEFORE.json AFTER.json
"""
from __future__ import annotations

import copy
import gzip
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import damage_63 as d63  # noqa: E402  (the sweep, judge and damages)
import damage_64 as d64  # noqa: E402  (case_maker, problem_named)
import damage_66 as d66  # noqa: E402  (its tables, registered before this file's; its judge)
import damage_inputs as di  # noqa: E402

DATA = di.DATA
K = di.Kind
GAT, DQN, CLIP, HSDPTF = (DATA / p for p in ("ddp-fresh/gat-log-1g", "ddp-fresh/dqn-loaded", "tf-jax/clip-h2d-late", "fsdp/hsdp-tf"))
XPLANE = "rank{r}/plugins/profile/2026_12_07_12_13_26/vm.xplane.pb.gz"
RANK = ["trunc50", "empty", "missing", "dup", "dupover", "other-run", "other-window"]
THREAD = ["sched-neg", "sched-nan", "sched-short", "host-other", "cpus0"]


def kinds(glow: str | None) -> list[di.Kind]:
    """This file's kinds; the Glow recording where ``glow`` names one."""
    made = [
        K("gat-log", GAT, "rank1.json", "rank0.json", "rank2.json", ddp=True),
        K("gat-kin", GAT, "rank1.kineto.json.gz", "rank0.kineto.json.gz", "rank2.kineto.json.gz",
          only=("clean", "trunc50", "missing", "dupover", "other-run")),
        K("dqn-loaded", DQN, "rank1.json", "rank0.json", "rank2.json", ddp=True),
        K("clip-late", CLIP, "rank1.json", "rank0.json", "rank2.json"),
        K("clip-xplane", CLIP, XPLANE.format(r=1), XPLANE.format(r=0), only=("clean", "trunc50", "missing", "dupover", "other-run")),
        K("hsdp-tf", HSDPTF, "rank1.json", "rank0.json", "rank4.json"),
        K("codec", GAT, "rank1.json", "rank0.json", only=("clean",)),  # its damages are the kept file's (``CODEC``)
        K("cli", GAT, "rank1.json", "rank0.json", only=("clean",)),  # flag mistakes on every subcommand (``CLI``)
    ]
    if glow and Path(glow, "manifest.json").is_file():
        made.append(K("glow", Path(glow), "rank1.json", "rank0.json", "rank2.json"))
    return made


# another run of the same world size and format: the files that replace rank 1's (relative to DATA)
OTHER_RUN = {"gat-log": ("ddp-fresh/dqn-loaded", ("rank1.json", "rank1.kineto.json.gz")),
             "gat-kin": ("ddp-fresh/dqn-loaded", ("rank1.kineto.json.gz",)),
             "dqn-loaded": ("ddp-fresh/gat-log-1g", ("rank1.json", "rank1.kineto.json.gz")),
             "clip-late": ("tf-jax/mlp", ("rank1.json", "rank1")),
             "clip-xplane": ("tf-jax/mlp", ("rank1",)),
             "hsdp-tf": ("fsdp/hsdp", ("rank1.json",)),
             "glow": ("fsdp-fresh/dual-1x2-1gbit", ("rank1.json",))}

W2 = d63.W2
NO = ["--no-trace", "-o", "OUT"]
FEATURE = {
    "gat-log": [["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--bandwidth", "200Mbit", *NO]],
    "dqn-loaded": [["whatif", "RUN", "--workers", "4", "--cores", "2", *NO]],
    "clip-late": [["whatif", "RUN", "--bandwidth", "200Mbit", "--allow-model-error", *NO]],  # its model +2.8 %
    "hsdp-tf": [["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--mesh", "1x4", *NO]],
    "glow": [["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--bandwidth", "200Mbit", *NO]],
}

# the kept codec costs (``optimize -o``'s codec-costs.json, read by the next --allow-lossy run there): damage -> whether an
# answer is right (measured again, or read as it is)
CODEC = {"cc-trunc": False, "cc-empty": False, "cc-gz": True, "cc-foreign": True, "cc-shapes": True, "cc-newer": False,
         "cc-nan": False, "cc-neg": False, "cc-inf": False, "cc-ref-neg": False, "cc-psgd-list": False, "cc-dir": False,
         "cc-loop": False}
OPT_KEPT = ["optimize", "RUN", "--allow-lossy", "--budget", "1", "-o", "OUT/kept"]

# files the flags point at (``bad_files`` makes them under ``--out``'s ``files``; BAD is replaced by that folder)
BAD = "BAD"
FLAGS: dict[str, tuple[list[str], tuple[str, ...], bool]] = {
    **{d: (OPT_KEPT, ("codec",), ok) for d, ok in CODEC.items()},
    # --profiled-bandwidth's notes and refusals
    "f67-pbw-workers": (["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--workers", "4", *NO], ("gat-log",), True),
    "f67-pbw-link": (["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--link-model", str(W2), *NO], ("gat-log",), False),
    "f67-pbw-jax": (["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--bandwidth", "200Mbit", "--allow-model-error", *NO],
                    ("clip-late",), False),  # loopback: its collectives did not run at 1 Gbit/s
    "f67-pbw-slow": (["whatif", "RUN", "--profiled-bandwidth", "10Mbit", "--bandwidth", "1Gbit", *NO], ("hsdp-tf", "gat-log"), False),
    "f67-pbw-list": (["whatif", "RUN", "--profiled-bandwidth", "1Gbit,2Gbit", *NO], ("gat-log",), False),
    "f67-pbw-cores": (["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--mesh", "1x4", "--cores", "2", *NO], ("hsdp-tf",), True),
    "f67-pbw-half": (["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--half-duplex", "--bandwidth", "200Mbit", *NO],
                     ("gat-log",), True),
    "f67-pbw-latency": (["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--latency", "5", *NO], ("gat-log",), True),
    # whatif --cores
    "f67-cores-alone": (["whatif", "RUN", "--cores", "2", *NO], ("dqn-loaded",), True),
    "f67-cores-many": (["whatif", "RUN", "--workers", "4", "--cores", "64", *NO], ("dqn-loaded",), True),
    "f67-cores-word": (["whatif", "RUN", "--workers", "4", "--cores", "two", *NO], ("dqn-loaded",), False),
    "f67-cores-rph": (["whatif", "RUN", "--workers", "4", "--cores", "2", "--ranks-per-host", "8", *NO],
                      ("dqn-loaded",), True),  # room for 8 on a host: the 4 share it, as without the flag
    "f67-cores-jax": (["whatif", "RUN", "--workers", "4", "--cores", "2", "--allow-model-error", *NO], ("clip-late",), True),
    "f67-cores-mesh": (["whatif", "RUN", "--mesh", "2x2", "--cores", "1", *NO], ("hsdp-tf",), True),
    "f67-cores-list": (["whatif", "RUN", "--workers", "4,8", "--cores", "2", *NO], ("dqn-loaded",), True),
    "f67-cores-template": (["whatif", "RUN", "--workers", "4", "--cores", "2", "--template", *NO], ("dqn-loaded",), True),
    # a path that is not the file meant, as the run
    **{f"f67-run-{b}": ([c, BAD + "/" + b, *tail], ("cli",), False) for b in ("emptydir", "loop", "empty.json", "trunc.json", "nope")
       for c, tail in (("analyze", []),)},
    "f67-replay-loop": (["replay", BAD + "/loop", "-o", "OUT"], ("cli",), False),
    "f67-report-emptydir": (["report", BAD + "/emptydir", "-o", "OUT"], ("cli",), False),
    "f67-whatif-zero": (["whatif", BAD + "/empty.json", "--bandwidth", "1Gbit", *NO], ("cli",), False),
    "f67-optimize-gz": (["optimize", BAD + "/rank0.json", "--budget", "1", "-o", "OUT"], ("cli",), False),  # one rank's file, gzip'd
    "f67-diff-emptydir": (["diff", "RUN", BAD + "/emptydir", "--no-report", "-o", "OUT"], ("cli",), False),
    "f67-diff-loop": (["diff", BAD + "/loop", "RUN", "--no-report", "-o", "OUT"], ("cli",), False),
    "f67-sgd-dir": (["sgd", BAD + "/folder"], ("cli",), False),
    "f67-sgd-empty": (["sgd", BAD + "/empty.json"], ("cli",), False),
    "f67-sgd-osu-dir": (["sgd", str(d63.BCAFFE), "--workers", "1,4", "--osu", BAD + "/folder"], ("cli",), False),
    "f67-sgd-comm-loop": (["sgd", str(d63.BCAFFE), "--workers", "1,4", "--comm-log", BAD + "/loop"], ("cli",), False),
    "f67-sgd-workers-word": (["sgd", str(d63.BCAFFE), "--workers", "1,x"], ("cli",), False),
    "f67-sgd-iter-nan": (["sgd", str(d63.BCAFFE), "--workers", "1,4", "--iter-time-1", "nan"], ("cli",), False),
    "f67-sgd-svg-dir": (["sgd", str(d63.BCAFFE), "--workers", "1,4", "--svg", BAD + "/folder"], ("cli",), False),
    # file flags given the wrong thing
    "f67-link-model-dir": (["whatif", "RUN", "--link-model", BAD + "/emptydir", *NO], ("cli",), False),
    "f67-link-model-loop": (["whatif", "RUN", "--link-model", BAD + "/loop", *NO], ("cli",), False),
    "f67-link-model-empty": (["whatif", "RUN", "--link-model", BAD + "/empty.json", *NO], ("cli",), False),
    "f67-link-model-trunc": (["whatif", "RUN", "--link-model", BAD + "/trunc.json", *NO], ("cli",), False),
    "f67-link-model-gz": (["whatif", "RUN", "--link-model", BAD + "/w2.json.gz", "--allow-model-error", *NO], ("cli",), True),
    "f67-topology-dir": (["whatif", "RUN", "--topology", BAD + "/folder", *NO], ("cli",), False),
    "f67-topology-empty": (["whatif", "RUN", "--topology", BAD + "/empty.json", *NO], ("cli",), False),
    "f67-link-from-dir": (["whatif", "RUN", "--link-from", BAD + "/folder", "--link-to", str(W2), *NO], ("cli",), False),
    "f67-opt-link-loop": (["optimize", "RUN", "--link-model", BAD + "/loop", "--budget", "1", "-o", "OUT"], ("cli",), False),
    "f67-opt-out-file": (["optimize", "RUN", "--budget", "1", "-o", BAD + "/empty.json"], ("cli",), False),
    "f67-cal-nccl-emptydir": (["calibrate", "--nccl-tests", BAD + "/emptydir", "-o", "OUT/cal.json"], ("cli",), False),
    "f67-cal-nccl-loop": (["calibrate", "--nccl-tests", BAD + "/loop", "-o", "OUT/cal.json"], ("cli",), False),
    "f67-cal-nccl-empty": (["calibrate", "--nccl-tests", BAD + "/empty.json", "-o", "OUT/cal.json"], ("cli",), False),
    "f67-cal-out-dir": (["calibrate", "--nccl-tests", str(DATA / "nccl-tests-lut/a100"), "-o", BAD + "/folder"], ("cli",), False),
    # wrong types and conflicting flags
    "f67-steps-word": (["analyze", "RUN", "--steps", "a:b"], ("cli",), False),
    "f67-maxbytes-word": (["analyze", "RUN", "--max-trace-bytes", "1e3"], ("cli",), False),
    "f67-marker-empty": (["analyze", "RUN", "--step-marker", ""], ("cli",), False),
    "f67-explain-word": (["replay", "RUN", "--explain", "--explain-threshold", "abc", "-o", "OUT"], ("cli",), False),
    "f67-report-out-loop": (["report", "RUN", "-o", BAD + "/loop"], ("cli",), False),
    "f67-speed0": (["whatif", "RUN", "--compute-speed", "0", *NO], ("cli",), False),
    "f67-bucket-inf": (["whatif", "RUN", "--bucket-mb", "inf", *NO], ("cli",), False),
    "f67-scheme-ps0": (["whatif", "RUN", "--scheme", "ps:0", *NO], ("cli",), False),
    "f67-partition-neg": (["whatif", "RUN", "--partition", "-1", *NO], ("cli",), False),
    "f67-first-bucket0": (["whatif", "RUN", "--first-bucket-mb", "0", *NO], ("cli",), False),
    "f67-dp-word": (["whatif", "RUN", "--data-parallel", "zero3", *NO], ("cli",), False),
    "f67-link-to-and-bw": (["whatif", "RUN", "--link-from", str(W2), "--link-to", str(W2), "--bandwidth", "1Gbit", *NO], ("cli",), False),
    "f67-fine-cores": (["whatif", "RUN", "--fine", "--cores", "2", "--workers", "4", *NO], ("cli",), True),
    "f67-opt-budget-word": (["optimize", "RUN", "--budget", "x", "-o", "OUT"], ("cli",), False),
    "f67-opt-accum0": (["optimize", "RUN", "--accumulate", "0", "--budget", "1", "-o", "OUT"], ("cli",), False),
    "f67-opt-slow-nan": (["optimize", "RUN", "--overlap-slowdown", "nan", "--budget", "1", "-o", "OUT"], ("cli",), False),
    "f67-opt-rounds0": (["optimize", "RUN", "--verify", "--rounds", "0", "--budget", "1", "-o", "OUT", "--", "python", "-c", "pass"],
                        ("cli",), False),
    "f67-opt-emulate-word": (["optimize", "RUN", "--emulate", "fast", "--budget", "1", "-o", "OUT"], ("cli",), False),
    "f67-opt-emulate-noverify": (["optimize", "RUN", "--emulate", "200Mbit", "--budget", "1", "-o", "OUT"], ("cli",), False),
    "f67-opt-ranks0": (["optimize", "RUN", "--verify", "--ranks", "0", "--budget", "1", "-o", "OUT", "--", "python", "-c", "pass"],
                       ("cli",), False),
    "f67-diff-top-word": (["diff", "RUN", "RUN", "--top", "x", "--no-report"], ("cli",), False),
    "f67-diff-steps-rev": (["diff", "RUN", "RUN", "--steps", "8:6", "--no-report"], ("cli",), False),
    "f67-cal-world-word": (["calibrate", "--world", "two", "-o", "OUT/cal.json"], ("cli",), False),
    "f67-cal-overlap-neg": (["calibrate", "--world", "2", "--overlap", "--overlap-mb", "-1", "-o", "OUT/cal.json"], ("cli",), False),
    "f67-prof-nocmd": (["profile", "-o", "OUT/p"], ("cli",), False),
    "f67-prof-steps-rev": (["profile", "-o", "OUT/p", "--steps", "5:2", "--", "python", "-c", "pass"], ("cli",), False),
    "f67-prof-mx-word": (["profile", "-o", "OUT/p", "--mxnet-ps", "servers=x,workers=2", "--", "python", "-c", "pass"], ("cli",), False),
    "f67-prof-out-file": (["profile", "-o", BAD + "/empty.json", "--", "python", "-c", "pass"], ("cli",), False),
    "f67-prof-cmd-missing": (["profile", "-o", "OUT/p", "--", "/nonexistent/python", "train.py"], ("cli",), False),
    "f67-demo-ranks0": (["demo", "--ranks", "0", "-o", "OUT"], ("cli",), False),
    "f67-demo-link-word": (["demo", "--link", "fast", "-o", "OUT"], ("cli",), False),
    "f67-demo-rounds0": (["demo", "--rounds", "0", "-o", "OUT"], ("cli",), False),
    "f67-demo-budget-neg": (["demo", "--budget", "-1", "-o", "OUT"], ("cli",), False),
}
FEATURE_FLAGS = [d for d in FLAGS if d.startswith(("f67-pbw", "f67-cores"))]
CLI = [d for d in FLAGS if d.startswith("f67-") and d not in FEATURE_FLAGS]


def bad_files(root: Path) -> Path:
    """The wrong things the flags point at: an empty folder, a folder holding a file, a link to itself, a 0-byte file, a cut
    link model, the 2-rank link model gzip'd, rank 0's file gzip'd under its own name."""
    files = root / "files"
    shutil.rmtree(files, ignore_errors=True)
    (files / "emptydir").mkdir(parents=True)
    (files / "folder").mkdir()
    shutil.copy(W2, files / "folder" / "link.json")
    (files / "loop").symlink_to("loop")
    (files / "empty.json").write_bytes(b"")
    text = W2.read_bytes()
    (files / "trunc.json").write_bytes(text[: len(text) // 2])
    (files / "w2.json.gz").write_bytes(gzip.compress(text, mtime=0))
    (files / "rank0.json").write_bytes(gzip.compress((GAT / "rank0.json").read_bytes(), mtime=0))
    return files


def _codec_edit(damage: str, doc: dict) -> dict:
    """The kept file's document damaged (``cc-foreign``: another machine's; ``cc-shapes``: one gradient's shape another;
    ``cc-newer``: a layout a later dagprof might write, each rate a record)."""
    doc = copy.deepcopy(doc)
    psgd = next(iter(next(iter(doc["powersgd"].values())).values()))
    if damage == "cc-foreign":
        doc["machine"] = "gpu-node-17 aarch64"
    elif damage == "cc-shapes":
        name = next(iter(doc["shapes"]))
        doc["shapes"][name] = [7, *doc["shapes"][name]]
    elif damage == "cc-newer":
        doc["version"] = 2
        doc["encode_us_per_byte"] = {k: {"median": v, "spread": 0.1} for k, v in doc["encode_us_per_byte"].items()}
    elif damage == "cc-nan":
        doc["encode_us_per_byte"]["fp16"] = float("nan")
    elif damage == "cc-neg":
        doc["decode_us_per_byte"]["bf16"] = -3.0
        psgd["middle_us"] = -50.0
    elif damage == "cc-inf":
        psgd["encode_us"] = float("inf")
    elif damage == "cc-ref-neg":
        doc["reference_op_us"] = -doc["reference_op_us"]
    elif damage == "cc-psgd-list":
        doc["powersgd"] = list(doc["powersgd"].values())
    return doc


def _codec_case(kind: di.Kind, damage: str, root: Path) -> tuple[Path, str] | None:
    """The undamaged run, and the kept codec costs damaged in the folder ``-o OUT/kept`` names; the clean file is an
    ``optimize --allow-lossy`` run's on this machine (made once under ``root/_codec``)."""
    made = di.make_case(kind, "clean", root)
    base = root / "_codec" / "codec-costs.json"
    if not base.is_file():
        di.run_cli(["optimize", str(GAT), "--allow-lossy", "--budget", "1", "-o", str(base.parent)], root / "_codec" / "log", 600)
        if not base.is_file():
            return None
    kept = root / "out" / kind.name / damage / "kept"
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    t = kept / "codec-costs.json"
    text = base.read_bytes()
    if damage == "cc-trunc":
        t.write_bytes(text[: len(text) // 2])
    elif damage == "cc-empty":
        t.write_bytes(b"")
    elif damage == "cc-gz":
        t.write_bytes(gzip.compress(text, mtime=0))
    elif damage == "cc-dir":
        t.mkdir()
    elif damage == "cc-loop":
        t.symlink_to(t.name)
    else:
        t.write_text(json.dumps(_codec_edit(damage, json.loads(text))))
    return made[0], str(t)


def _other_run(kind: di.Kind, damage: str, root: Path) -> tuple[Path, str] | None:
    copied = d63.d58.clean_copy(kind, damage, root)
    if copied is None or kind.name not in OTHER_RUN:
        return None
    case, arg = copied
    src, names = OTHER_RUN[kind.name]
    for name in names:
        s, d = DATA / src / name, case / name
        shutil.rmtree(d) if d.is_dir() else d.unlink(missing_ok=True)
        shutil.copytree(s, d) if s.is_dir() else shutil.copy(s, d)
    return arg, str(case / names[0])


def _thread_edit(damage: str):
    """Rank 1's thread records (what the shared-cores load note reads): a wait negative or NaN, rows cut to two fields,
    another host named, no cores."""
    def edit(o) -> bool:
        rows = o.get("thread_sched_ns") if isinstance(o, dict) else None
        if not rows:
            return False
        if damage == "sched-neg":
            for r in rows[::2]:
                r[2] = -abs(r[2]) - 1
        elif damage == "sched-nan":
            for r in rows[::3]:
                r[1] = float("nan")
        elif damage == "sched-short":
            o["thread_sched_ns"] = [r[:2] for r in rows]
        elif damage == "host-other":
            o["host"] = "other-host"
        else:
            o["cpus"] = 0
        return True
    return edit


EDITS = {d: _thread_edit(d) for d in THREAD}
APPLIES = dict.fromkeys(THREAD, ("dqn-loaded",))


def make_case(kind: di.Kind, damage: str, root: Path, files: Path) -> tuple[Path, str] | None:
    """A damaged copy of ``kind``'s input (``damage_66``'s maker beyond this file's damages); flag argv's ``BAD`` is ``files``."""
    if damage in CODEC:
        return _codec_case(kind, damage, root) if kind.name == "codec" else None
    if damage == "other-run":
        return _other_run(kind, damage, root)
    if damage in FLAGS and kind.name not in FLAGS[damage][1]:
        return None
    if damage in FLAGS and kind.name == "cli":
        made = di.make_case(kind, "clean", root)
        bad = next((w for w in FLAGS[damage][0] if w.startswith(BAD)), None)
        return made[0], str(files / bad[len(BAD) + 1:]) if bad else made[1]
    return d64.case_maker(EDITS, APPLIES, d66.make_case)(kind, damage, root)


# a rank on another host: the one-host load note is not computed, the answer stands; no cores beside an affinity set of 2:
# a host's cores are its ranks' affinity sets where every rank recorded one (``graph.build.host_cpus``), the count unread
UNREAD = ("host-other", "cpus0")


def judged(row: dict) -> dict:
    """``damage_66.judged``; an unchanged answer to a damage ``UNREAD`` names judged good (read through)."""
    row = d66.judged(row)
    same = row["number"] is None or row["clean"] is not None and abs(row["number"] - row["clean"]) <= 1e-3 * abs(row["clean"])
    if row["damage"] in UNREAD and row["class"] == "silent" and same:
        return row | {"class": "unread", "verdict": "good"}
    return row


def register(files: Path, form: str | None = None) -> None:
    """This file's features and flags added to ``damage_63``'s tables, after ``damage_66``'s; ``BAD`` made ``files``.
    ``form``: each command in that form only, ``json`` (with ``--json``) or ``text`` (without: the twin reads the same
    files and renders another way; half the runs); None: both."""
    d66.register()
    d63.FEATURE.update(FEATURE)
    d63.FLAGS.update({d: ([w.replace(BAD, str(files)) for w in argv], ks, ok) for d, (argv, ks, ok) in FLAGS.items()})
    if form is not None:
        both = d63.commands
        d63.commands = lambda *a: [argv for argv in both(*a) if ("--json" in argv) == (form == "json")]


def main() -> int:
    ap = d63.sweep_parser(__doc__, "/tmp/damage67/cases", ["gat-log", "gat-kin", "dqn-loaded", "clip-late", "clip-xplane", "hsdp-tf",
                                                           "glow", "codec", "cli"], [*RANK, *THREAD, *FLAGS])
    ap.add_argument("--glow", help="a dagprof profile of bench/fsdp_fresh/hsdp_glow.py --shard 2 (2 ranks)")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--json-only", action="store_const", const="json", dest="form", help="each command with --json only")
    only.add_argument("--text-only", action="store_const", const="text", dest="form", help="each command without --json only")
    a = ap.parse_args()
    files = Path(a.out) / "files"
    register(files, a.form)
    if not a.compare:
        bad_files(Path(a.out))
    return d63.sweep_main(a, lambda: kinds(a.glow), lambda k, d, r: make_case(k, d, r, files), judged)


if __name__ == "__main__":
    sys.exit(main())
