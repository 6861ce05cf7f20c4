"""What could tell a Kineto trace cut inside its last step from a whole one (issue 20, branch cpath58)? Per trace file
under the roots given, whole and cut half-way through its last ProfilerStep (as ``bench/damage_58.py``'s stop-mid cuts
it), one JSON line: launches (cudaLaunchKernel, memcpy/memset calls, ...) whose GPU op is missing, those launched before
the trace's last GPU op began, those in the last step, ac2g flows with one end, and how far the last event ends past the
last step's end. A tell must hold on every whole trace and fail on every cut one. ``--dagprof`` adds what dagprof's
Kineto reader tells of each (``traces.steps.cut_step``: the step it finds cut, its ops, or the file's one-line refusal)
and how many steps it holds, and prints the counts last.

    PYTHONPATH=src python bench/cut_tells.py [--dagprof] ../shared/data/kineto-public ../shared/data/kineto-corpus > out.jsonl
"""
from __future__ import annotations

import copy
import gzip
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "hipLaunchKernel", "hipExtModuleLaunchKernel", "cudaMemcpyAsync",
          "cudaMemsetAsync", "hipMemcpyAsync", "hipModuleLaunchKernel", "cudaGraphLaunch")
GPU = ("kernel", "gpu_memcpy", "gpu_memset")


def load(p: Path):
    try:
        with (gzip.open if p.name.endswith(".gz") else open)(p, "rt") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def steps_of(ev: list) -> list:
    return sorted((e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#") and isinstance(e.get("dur"), (int, float))),
                  key=lambda e: float(e["ts"]))


def stats(obj) -> dict | None:
    ev = obj.get("traceEvents") if isinstance(obj, dict) else None
    if not isinstance(ev, list):
        return None
    ev = [e for e in ev if isinstance(e, dict)]
    gpu = {(e.get("args") or {}).get("correlation") for e in ev if e.get("cat") in GPU}
    launches = [e for e in ev if e.get("cat") == "cuda_runtime" and str(e.get("name", "")).startswith(LAUNCH)
                and (e.get("args") or {}).get("correlation") is not None]
    miss = [e for e in launches if e["args"]["correlation"] not in gpu]
    gts = [float(e["ts"]) for e in ev if e.get("cat") in GPU and isinstance(e.get("ts"), (int, float))]
    flows: dict = {}
    for e in ev:
        if e.get("cat") == "ac2g" and e.get("ph") in ("s", "f"):
            flows.setdefault(e.get("id"), set()).add(e["ph"])
    steps = steps_of(ev)
    ends = [float(e["ts"]) + float(e.get("dur") or 0) for e in ev if isinstance(e.get("ts"), (int, float)) and e.get("ph") == "X"]
    last_step_end = float(steps[-1]["ts"]) + steps[-1]["dur"] if steps else None
    return {"steps": len(steps), "launches": len(launches), "launch_without_gpu_op": len(miss),
            "of_them_before_last_gpu_op": sum(1 for e in miss if gts and float(e["ts"]) < max(gts)),
            "of_them_in_last_step": sum(1 for e in miss if steps and float(e["ts"]) >= float(steps[-1]["ts"])),
            "ac2g_one_ended": sum(1 for v in flows.values() if len(v) == 1),
            "last_event_past_step_ms": None if last_step_end is None or not ends else round((max(ends) - last_step_end) / 1e3, 3)}


def cut(obj):
    """The trace cut half-way through its last step, well formed (``damage_58._stop_mid``'s cut)."""
    steps = steps_of([e for e in obj["traceEvents"] if isinstance(e, dict)])
    if not steps:
        return None
    c = steps[-1]["ts"] + steps[-1]["dur"] / 2
    o = copy.deepcopy(obj)
    o["traceEvents"] = [e for e in o["traceEvents"] if not (isinstance(e, dict) and isinstance(e.get("ts"), (int, float)) and e["ts"] > c)]
    for e in o["traceEvents"]:
        if isinstance(e, dict) and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)) and e["ts"] + e["dur"] > c:
            e["dur"] = c - e["ts"]
    return o


def told(obj, name: str) -> dict:
    """dagprof's reading of the trace ``obj`` (written to a temporary file ``name``): steps, the cut step it tells."""
    from dagprof.errors import DagprofError  # noqa: PLC0415  (only with --dagprof)
    from dagprof.traces.kineto import read_kineto  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        with (gzip.open if name.endswith(".gz") else open)(p, "wt") as f:
            json.dump(obj, f)
        try:
            t = read_kineto(p)
        except DagprofError as e:
            return {"refused": str(e)}
        cut = t.meta.cut_step
        return {"steps": len(t.step_spans()), "cut_step": None if cut is None else [cut.step, cut.ops]}


def main() -> None:
    roots = [a for a in sys.argv[1:] if a != "--dagprof"]
    counts: Counter = Counter()
    for root in roots:
        for p in sorted(Path(root).rglob("*")):
            if not p.is_file() or not p.name.endswith((".json", ".json.gz")):
                continue
            obj = load(p)
            s = stats(obj) if obj is not None else None
            if s is None or not (s["launches"] or s["steps"]):
                continue
            c = cut(obj)
            row = {"file": str(p), "whole": s, "cut": stats(c) if c else None}
            if "--dagprof" in sys.argv:
                row["dagprof"] = {"whole": told(obj, p.name), "cut": told(c, p.name) if c else None}
                for which, d in row["dagprof"].items():
                    if d is not None:
                        counts[(which, "refused" if "refused" in d else "told cut" if d["cut_step"] else
                                "one step, warned" if d["steps"] == 1 else "not told")] += 1
            print(json.dumps(row), flush=True)
    for (which, what), n in sorted(counts.items()):
        print(f"# {which}: {what} {n}", file=sys.stderr)


if __name__ == "__main__":
    main()
