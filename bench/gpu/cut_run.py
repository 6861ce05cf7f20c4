"""Cut a dagprof run folder of a GPU job to one profiled step, small enough to vendor under tests/data.

The manifest names that step as the one requested, its argv's absolute paths made their file names. Each rank's file
keeps its records of that step (``STEP_BEGIN`` to ``STEP_END``) and names it the only step profiled; its Kineto trace
keeps that whole profiler step (``tests/data/make_excerpts.step_excerpt``: the CPU events in it, the GPU work and flows
they launched, all metadata). Every other field (FSDP's units and collectives, every step's time) is kept.
Usage: python bench/gpu/cut_run.py RUN STEP OUT
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "data"), str(ROOT / "src")]
from make_excerpts import _save, step_excerpt  # noqa: E402

from dagprof.traces.run_schema import Rec  # noqa: E402


def main(run: Path, step: int, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["steps_requested"] = [step, step + 1]
    manifest["argv"] = [Path(a).name if a.startswith("/") else a for a in manifest["argv"]]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for path in sorted(run.glob("rank*.json")):
        doc = json.loads(path.read_text())
        t0 = next(r[3] for r in doc["records"] if r[0] == Rec.STEP_BEGIN and r[1] == step)
        t1 = next(r[3] for r in doc["records"] if r[0] == Rec.STEP_END and r[1] == step)
        doc["records"] = [r for r in doc["records"] if t0 <= r[3] <= t1]
        doc["steps_requested"], doc["steps_profiled"] = [step, step + 1], [step]
        (out / path.name).write_text(json.dumps(doc, separators=(",", ":")))
        kineto = run / doc["kineto_file"]
        _save(step_excerpt(json.load(gzip.open(kineto)), step, 1), out / kineto.name)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
