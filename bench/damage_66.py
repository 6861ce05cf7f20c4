"""Damages of the inputs added at stop 65 that no sweep fed yet (``damage_65``/``damage_64``/``damage_63`` are the machinery;
this file adds kinds, damages and flags to them): the CTR ranker's profile under ``replicate()`` (``powersgd-ctr/defaults``;
its codec costs are not swept: ``optimize`` stages its outputs in a new folder and measures them afresh, never reading
``-o``'s), the HSDP dual encoder profiled at 1 Gbit/s
(``fsdp-fresh/dual-1x2-1gbit``: each unit's shard all-reduced over a replicate group of one rank), the TF translator whose
dense gradients TF packs into one all-reduce sized by ``collective_row_bytes`` (``tf/translator-pack``), and the Kineto
traces of a DCP save before the next forward (``ddp-fresh/dcp-kineto-early``, given its own fields here).

Damages: ``damage_64``'s generic rank damages and clocks shifted (an hour, 3 s); each format's own fields (the run
manifest's world size, steps, format, backend, Kineto flag; a DDP rank's bucket cap, group, comm hook on one rank; the
HSDP replicate group, mesh, all-gather dtype on one rank; TF's packed all-reduce's row bytes, lookups, grad bytes, an
XPlane gone, cut, swapped; a Kineto collective's ``Input Dims`` or its process group on one rank, one rank's clock moved);
wrong flags on every command whose behaviour changed at stop 65 (``--profiled-bandwidth`` off the fitted link or on
non-FSDP jobs, ``optimize`` with PowerSGD and no calibration, ``--cores`` on DDP profiles without gloo's thread record,
...), with and without ``--json``::

    python bench/damage_66.py [--kinds psgd-ctr,dual-1g] [--damages swap,man-world4] [--json FILE] [--src DIR]
    python bench/damage_66.py --compare BEFORE.json AFTER.json
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import damage_58 as d58  # noqa: E402  (clock shifts)
import damage_63 as d63  # noqa: E402  (the sweep, judge and damages)
import damage_64 as d64  # noqa: E402  (its tables and judge)
import damage_65 as d65  # noqa: E402  (its tables, registered before this file's)
import damage_inputs as di  # noqa: E402

DATA = di.DATA
K = di.Kind
PSGD, DUAL, TF, EARLY = (DATA / p for p in ("powersgd-ctr", "fsdp-fresh/dual-1x2-1gbit", "tf/translator-pack",
                                            "ddp-fresh/dcp-kineto-early"))
MAN_ONLY = ("clean", "trunc50", "empty", "nan")  # a manifest's generic damages (the rank files' are swept on their kinds)
KINDS = [
    K("psgd-ctr", PSGD / "defaults", "rank1.json", "rank0.json", "rank2.json", ddp=True),
    K("psgd-man", PSGD / "defaults", "manifest.json"),
    K("dual-1g", DUAL, "rank1.json", "rank0.json", "rank2.json"),
    K("dual-man", DUAL, "manifest.json"),
    K("tf-pack", TF, "rank1.json", "rank0.json", "rank2.json"),
    K("tf-man", TF, "manifest.json"),
    K("dcp-early66", EARLY, "rank1.1796633393720752705.pt.trace.json.gz", "rank0.1796633393749898287.pt.trace.json.gz",
      "rank2.1796633393720752706.pt.trace.json.gz", named_by_content=True),
]
CLOCK = ["skew", "skew-sec"]  # every epoch time an hour / 3 s later (dagprof and TF rank files)
MAN = ["man-world4", "man-world1", "man-steps-rev", "man-format", "man-backend", "man-kineto", "man-gone"]
DDP = ["ddp-cap", "ddp-group", "ddp-hook"]
HSDP = ["hsdp-repl-group", "hsdp-mesh", "hsdp-dtype", "hsdp-repl-size"]
TFX = ["tf-row-bytes", "tf-rows-gone", "tf-lookups", "tf-grad-bytes", "xplane-gone", "xplane-trunc", "xplane-swap", "xplane-dupover"]
KIN = ["kin-dims", "kin-pg-size", "kin-world", "kin-clock-hour", "kin-clock-sec"]
NEW = [*CLOCK, *MAN, *DDP, *HSDP, *TFX, *KIN]
GENERIC = d64.GENERIC

W2 = d63.W2
FEATURE = {
    "psgd-ctr": [["whatif", "RUN", "--profiled-bandwidth", "200Mbit", "--bandwidth", "1Gbit", "--no-trace", "-o", "OUT"]],
    "psgd-man": [["whatif", "RUN", "--bandwidth", "1Gbit", "--no-trace", "-o", "OUT"]],
    "dual-1g": [["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"]],
    "dual-man": [["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"]],
    "tf-pack": [["whatif", "RUN", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"]],
    "tf-man": [["whatif", "RUN", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"]],
    "dcp-early66": [["whatif", "RUN", "--bandwidth", "200Mbit", "--allow-model-error", "--no-trace", "-o", "OUT"]],  # model +2.0 %
}
# name -> (argv with RUN/OUT, the kinds it is given to, whether an answer is right there)
FLAGS: dict[str, tuple[list[str], tuple[str, ...], bool]] = {
    "f66-pbw-ddp": (["whatif", "RUN", "--profiled-bandwidth", "200Mbit", "--bandwidth", "1Gbit", "--no-trace", "-o", "OUT"],
                    ("tf-pack", "dcp-early66"), False),  # not their wire: their collectives moved faster
    "f66-pbw-word": (["whatif", "RUN", "--profiled-bandwidth", "fast", "--bandwidth", "1Gbit", "--no-trace", "-o", "OUT"],
                     ("dual-1g", "psgd-ctr"), False),
    "f66-pbw-zero": (["whatif", "RUN", "--profiled-bandwidth", "0Mbit", "--no-trace", "-o", "OUT"], ("dual-1g",), False),
    "f66-pbw-neg": (["whatif", "RUN", "--profiled-bandwidth", "-1Gbit", "--no-trace", "-o", "OUT"], ("psgd-ctr",), False),
    "f66-pbw-slow": (["whatif", "RUN", "--profiled-bandwidth", "20Mbit", "--bandwidth", "200Mbit", "--no-trace", "-o", "OUT"],
                     ("dual-1g", "psgd-ctr"), False),  # a wire slower than its collectives ran: not the wire it ran on
    "f66-pbw-workers": (["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--workers", "4", "--no-trace", "-o", "OUT"],
                        ("dual-1g",), True),
    "f66-pbw-mesh": (["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--mesh", "2x2", "--no-trace", "-o", "OUT"],
                     ("dual-1g",), True),
    "f66-pbw-alone": (["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--no-trace", "-o", "OUT"], ("dual-1g",), True),
    "f66-pbw-link-model": (["whatif", "RUN", "--profiled-bandwidth", "1Gbit", "--link-model", str(W2), "--no-trace", "-o", "OUT"],
                           ("dual-1g",), False),  # the link is the file's: nothing to split
    "f66-pbw-mx": (["whatif", "RUN", "--profiled-bandwidth", "500Mbit", "--bandwidth", "100Mbit", "--no-trace", "-o", "OUT"],
                   ("mx-bow65",), True),
    "f66-opt-psgd-nocal": (["optimize", "RUN", "--allow-lossy", "--powersgd-ranks", "2", "--budget", "2", "-o", "OUT"],
                           ("psgd-ctr",), True),  # answered, with the chained all-reduces' warning where PowerSGD wins
    "f66-opt-psgd-ranks0": (["optimize", "RUN", "--allow-lossy", "--powersgd-ranks", "0", "--budget", "2", "-o", "OUT"],
                            ("psgd-ctr",), False),
    "f66-opt-psgd-ranks-word": (["optimize", "RUN", "--allow-lossy", "--powersgd-ranks", "two", "--budget", "2", "-o", "OUT"],
                                ("psgd-ctr",), False),
    "f66-opt-psgd-lossless": (["optimize", "RUN", "--powersgd-ranks", "2", "--budget", "2", "-o", "OUT"], ("psgd-ctr",), False),
    "f66-opt-pbw": (["optimize", "RUN", "--profiled-bandwidth", "200Mbit", "--budget", "2", "-o", "OUT"], ("psgd-ctr",), True),
    "f66-opt-pbw-word": (["optimize", "RUN", "--profiled-bandwidth", "slow", "--budget", "2", "-o", "OUT"], ("psgd-ctr",), False),
    "f66-opt-link-nooverlap": (["optimize", "RUN", "--allow-lossy", "--link-model", str(W2), "--budget", "2", "-o", "OUT"],
                               ("psgd-ctr",), True),  # a link file without --overlap: the chain still unmeasured
    "f66-opt-dual": (["optimize", "RUN", "--budget", "2", "-o", "OUT"], ("dual-1g",), True),
    "f66-opt-tf": (["optimize", "RUN", "--budget", "2", "-o", "OUT"], ("tf-pack",), False),
    "f66-cores-ddp": (["whatif", "RUN", "--workers", "4", "--cores", "2", "--no-trace", "-o", "OUT"],
                      ("psgd-ctr", "dcp-early66", "tf-pack"), True),
    "f66-cores-neg": (["whatif", "RUN", "--workers", "4", "--cores", "-2", "--no-trace", "-o", "OUT"], ("psgd-ctr",), False),
    "f66-cores-dual": (["whatif", "RUN", "--workers", "4", "--cores", "2", "--no-trace", "-o", "OUT"], ("dual-1g",), True),
    "f66-steps-out": (["analyze", "RUN", "--steps", "20:30"], ("psgd-ctr", "dual-1g", "tf-pack"), False),
    "f66-template-tf": (["replay", "RUN", "--template", "-o", "OUT"], ("tf-pack", "psgd-ctr"), True),
    "f66-reduce-dtype-tf": (["whatif", "RUN", "--reduce-dtype", "bfloat16", "--no-trace", "-o", "OUT"], ("tf-pack",), False),
    "f66-bucket-tf": (["whatif", "RUN", "--bucket-mb", "4", "--no-trace", "-o", "OUT"], ("tf-pack",), False),
    "f66-ddp-dual": (["whatif", "RUN", "--data-parallel", "ddp", "--no-trace", "-o", "OUT"], ("dual-1g",), False),  # HSDP
    "f66-sgd": (["sgd", "RUN"], ("dual-1g", "tf-pack", "psgd-ctr"), False),
    "f66-diff-dual-neg": (["diff", str(DATA / "fsdp-fresh/dual-negatives"), "RUN", "--no-report", "-o", "OUT"], ("dual-1g",), False),
    "f66-diff-self": (["diff", "RUN", "RUN", "--no-report", "-o", "OUT"], ("psgd-ctr", "dual-1g", "tf-pack"), True),
}


def _set(key: str, value):
    """The field ``key`` set to ``value`` where the document has it."""
    def edit(o) -> bool:
        if not isinstance(o, dict) or key not in o:
            return False
        o[key] = value(o[key]) if callable(value) else value
        return True
    return edit


MAN_EDITS = {"man-world4": _set("world_size", 4), "man-world1": _set("world_size", 1),
             "man-steps-rev": _set("steps_requested", [12, 4]),
             "man-format": _set("format", lambda f: "dagprof-run" if f == "dagprof-xplane-run" else "dagprof-xplane-run"),
             "man-backend": _set("backend", "nccl"), "man-kineto": _set("kineto", True)}


def _ddp_edit(damage: str):
    """Rank 1's DDP record: its bucket cap another size, its DDP group another, a PowerSGD comm hook named."""
    key, value = {"ddp-cap": ("bucket_cap_mb", 25.0), "ddp-group": ("ddp_group_ranks", [0]),
                  "ddp-hook": ("comm_hook", "powerSGD_hook")}[damage]
    return lambda o: isinstance(o, dict) and o.get("ddp") is True and _set(key, value)(o)


def _hsdp_edit(damage: str):
    """Rank 1's HSDP units: each shard's all-reduce over both ranks (or a 2-rank replicate group), the mesh turned, the
    all-gathers in another dtype."""
    def edit(o) -> bool:
        f = o.get("fsdp") if isinstance(o, dict) else None
        if not f or f["units"][0].get("mesh_dims") != ["replicate", "shard"]:
            return False
        for u in f["units"]:
            if damage == "hsdp-mesh":
                u["mesh"] = u["mesh"][::-1]
            elif damage == "hsdp-repl-size":
                u["mesh"] = [2, 2]
        for c in f["collectives"]:
            if damage == "hsdp-repl-group" and c["kind"] == "all_reduce":
                c["group"] = "0,1"
            elif damage == "hsdp-dtype" and c["kind"] == "all_gather":
                c["dtype"] = "float32"
        return True
    return edit


def _tf_edit(damage: str):
    """Rank 1's record of TF's packed all-reduce: its row bytes another width or gone, its lookups renamed, its grad bytes
    changed."""
    def edit(o) -> bool:
        if not isinstance(o, dict) or o.get("framework") != "tensorflow" or not o.get("collective_row_bytes"):
            return False
        if damage == "tf-row-bytes":
            o["collective_row_bytes"] = {k: v * 2 for k, v in o["collective_row_bytes"].items()}
        elif damage == "tf-rows-gone":
            o.pop("collective_row_bytes")
        elif damage == "tf-lookups":
            o["collective_lookups"] = {k: [f"{x}_1" for x in v] for k, v in o["collective_lookups"].items()}
        else:
            o["grad_bytes"] = o["grad_bytes"] * 3
        return True
    return edit


def _kin_edit(damage: str):
    """Rank 1's Kineto trace: its all-reduces' ``Input Dims`` doubled, its group's size or world another, its clock moved."""
    def edit(o) -> bool:
        ev = di._events(o)
        info = o.get("distributedInfo") if isinstance(o, dict) else None
        if not ev or not isinstance(info, dict):
            return False
        if damage == "kin-dims":
            coll = [e for e in ev if isinstance(e, dict) and e.get("name") == "gloo:all_reduce" and (e.get("args") or {}).get("Input Dims")]
            for e in coll:
                e["args"]["Input Dims"] = [[d * 2 for d in dims] for dims in e["args"]["Input Dims"]]
            return bool(coll)
        if damage == "kin-pg-size":
            info["pg_config"][0]["pg_size"] = 4
            info["pg_config"][0]["ranks"] = [0, 1, 2, 3]
            return True
        if damage == "kin-world":
            info["world_size"] = 4
            return True
        shift = 3_600_000_000 if damage == "kin-clock-hour" else 3_000_000
        for e in ev:
            if isinstance(e, dict) and isinstance(e.get("ts"), (int, float)):
                e["ts"] += shift
        return True
    return edit


EDITS = {**MAN_EDITS, **{d: _ddp_edit(d) for d in DDP}, **{d: _hsdp_edit(d) for d in HSDP},
         **{d: _tf_edit(d) for d in TFX[:4]}, **{d: _kin_edit(d) for d in KIN}}
MANS = ("psgd-man", "dual-man", "tf-man")
APPLIES = {**dict.fromkeys(MAN_EDITS, MANS), **dict.fromkeys(DDP, ("psgd-ctr",)), **dict.fromkeys(HSDP, ("dual-1g",)),
           **dict.fromkeys(TFX[:4], ("tf-pack",)), **dict.fromkeys(KIN, ("dcp-early66",))}


def _files(damage: str, kind: di.Kind, root: Path) -> tuple[Path, str] | None:
    """The damages that move or cut files rather than edit one: a manifest gone, an XPlane gone/cut/swapped/copied;
    clocks shifted (``damage_inputs``' hour, ``damage_58``'s 3 s) on the rank files."""
    if damage in CLOCK:
        return d58.make_case(kind, damage, root) if kind.name in ("psgd-ctr", "dual-1g", "tf-pack") else None
    copied = d58.clean_copy(kind, damage, root)
    if copied is None:
        return None
    case, arg = copied
    t = case / kind.target
    if damage == "man-gone" and kind.name in MANS:
        t.unlink()
    elif damage.startswith("xplane-") and kind.name == "tf-pack":
        x0, x1 = (next((case / f"rank{r}").rglob("*.xplane.pb.gz")) for r in (0, 1))
        if damage == "xplane-gone":
            x1.unlink()
        elif damage == "xplane-trunc":
            di._truncate(x1, 0.5)
        elif damage == "xplane-swap":
            tmp = x0.with_name("swap.tmp")
            x0.rename(tmp)
            shutil.copy(x1, x0)
            tmp.rename(x1)
        else:
            shutil.copy(x0, x1)
        t = x1
    else:
        return None
    return arg, str(t)


def make_case(kind: di.Kind, damage: str, root: Path) -> tuple[Path, str] | None:
    """``damage_64``'s edit maker for this file's JSON edits, ``_files`` for the others, ``damage_65``'s beyond; a manifest
    kind takes its own damages and ``MAN_ONLY``."""
    if kind.name in MANS and damage not in (*MAN, *MAN_ONLY) and damage not in FLAGS:
        return None
    if damage in CLOCK or damage == "man-gone" or damage.startswith("xplane-"):
        made = _files(damage, kind, root)
    else:
        made = d64.case_maker(EDITS, APPLIES, d65.make_case)(kind, damage, root)
    return made


ALIGNED = ("skew-sec", "kin-clock-sec")  # one rank's clock seconds off: alignment takes it (``damage_58.UNCHANGED``)
# manifest fields no reader takes (each rank file says its own window, backend and Kineto file): the answer stands
UNREAD = ("man-steps-rev", "man-backend", "man-kineto")


def judged(row: dict) -> dict:
    """``damage_64.problem_named``, and an unchanged answer to a rank's clock moved by seconds or to a manifest field no
    reader takes judged good (read through)."""
    row = d64.problem_named(row)
    same = row["number"] is None or row["clean"] is not None and abs(row["number"] - row["clean"]) <= 1e-3 * abs(row["clean"])
    if row["damage"] in (*ALIGNED, *UNREAD) and row["class"] == "silent" and same:
        return row | {"class": "unread", "verdict": "good"}
    return row


def register() -> None:
    """This file's features and flags added to ``damage_63``'s tables, after ``damage_65``'s."""
    d65.register()
    d63.FEATURE.update(FEATURE)
    d63.FLAGS.update(FLAGS)


def main() -> int:
    a = d63.sweep_parser(__doc__, "/tmp/damage66/cases", [k.name for k in KINDS], [*GENERIC, *NEW, *FLAGS]).parse_args()
    register()
    return d63.sweep_main(a, lambda: [*KINDS, *d65.KINDS, *d63.KINDS], make_case, judged)


if __name__ == "__main__":
    sys.exit(main())
