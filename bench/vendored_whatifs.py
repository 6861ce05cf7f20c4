"""Every vendored run's what-ifs, by the dagprof tree on PYTHONPATH: a change's effect on predictions, all runs at once.

For each run or trace under ROOT that a reader takes (a run folder once, else each file): the averaged graph's model
error, ``--bandwidth 1Gbit`` and ``100Mbit`` predicted ms, ``--workers 1`` and ``4`` (or the refusal's first words).
One JSON object on stdout, run by run on stderr. Two trees compared: run it with each tree's ``src`` on PYTHONPATH and
diff the two files (``python -c`` with ``json.load``, or ``bench/compare_outputs.py``). No job, no root, no timing;
about 3-5 minutes on 2 cores for ``tests/data``. Evidence entries before 2026-12-06 17:00 name it ``/tmp/tidy/loop.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile


def judge(path: str) -> dict:
    from dagprof.errors import DagprofError
    from dagprof.pipeline import open_run
    from dagprof.search.scenario import Scenario
    from dagprof.search.whatif import evaluate

    try:
        g = open_run(path, template=True).graph
        rows = evaluate(g, [Scenario(bandwidth="1Gbit"), Scenario(bandwidth="100Mbit")], tolerance_pct=None)
        workers: list = []
        for n in (1, 4):
            try:
                workers += [round(r.predicted_iter_ms, 4) for r in evaluate(g, [Scenario(workers=n)], tolerance_pct=None)["scenarios"]]
            except DagprofError as e:
                workers.append(str(e)[:60])
        return {"model": rows.get("model_error_pct"), "ms": [round(r.predicted_iter_ms, 4) for r in rows["scenarios"]], "w4": workers}
    except DagprofError as e:
        return {"refused": str(e)[:100]}
    except Exception as e:  # noqa: BLE001 - a crash is a finding here, recorded for the diff, not raised
        return {"error": repr(e)[:100]}


def inputs(root: str) -> list[str]:
    """Each run folder under ``root`` once, and every other file a reader takes."""
    from dagprof.traces import formats

    runs: list[str] = []
    out = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        fmt = formats.sniff(folder)
        if fmt is not None and fmt.reader and fmt.name != "xplane-logdirs":
            runs.append(folder)
            paths = [folder]
        elif any(folder.startswith(r + os.sep) for r in runs):
            continue
        else:
            paths = [os.path.join(folder, f) for f in sorted(files)]
        out += [p for p in paths if (f := formats.sniff(p)) is not None and f.reader]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="a folder of runs and traces, e.g. tests/data")
    args = ap.parse_args()
    os.environ["DAGPROF_CACHE_DIR"] = tempfile.mkdtemp()  # no parse cache shared between the two trees compared
    out = {}
    for p in inputs(args.root):
        key = os.path.relpath(p, args.root)
        out[key] = judge(p)
        print(key, out[key], file=sys.stderr, flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
