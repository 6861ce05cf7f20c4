"""The critical path per iteration against the iteration, per run (issue 20/21, branch cpath58): every trace file and
run folder under the roots given (the public traces the corpus bench reads, the vendored recordings), one JSON line each:
the replayed iteration, the path per iteration over the whole makespan (as ``analyze`` read it before) and as it reads now,
and the note that says why they differ. A path longer than the iteration with no note is a silent contradiction.

    python bench/path_vs_iteration.py ../shared/data/kineto-public ../shared/data/kineto-corpus tests/data > out.jsonl
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

from dagprof.errors import DagprofError
from dagprof.pipeline import open_run
from dagprof.traces import formats


def judge(path: str) -> dict:
    try:
        a = open_run(path).analysis
    except DagprofError as e:
        return {"refused": str(e)[:100]}
    n = a.steps
    return {"iter_ms": round(a.predicted_us / 1e3, 4), "path_before_ms": round(float(a.result.end.max()) / n / 1e3, 4),
            "path_ms": round(a.path.total_us / n / 1e3, 4), "note": a.path.note, "steps": a.graph.meta.steps}


def runs(root: str):
    """Each run folder once (a sniffed format with a reader), else each readable file."""
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        fmt = formats.sniff(folder)
        if fmt is not None and fmt.reader and fmt.name != "xplane-logdirs":
            found.append(folder)
            yield folder
            continue
        if any(folder.startswith(r + os.sep) for r in found):
            continue
        for f in sorted(files):
            p = os.path.join(folder, f)
            sniffed = formats.sniff(p)
            if sniffed is not None and sniffed.reader:
                yield p


def main() -> None:
    os.environ.setdefault("DAGPROF_CACHE_DIR", tempfile.mkdtemp())
    for root in sys.argv[1:]:
        for p in runs(root):
            print(json.dumps({"run": p, **judge(p)}), flush=True)


if __name__ == "__main__":
    main()
