"""The averaged replay (``replay --template``) of every vendored TensorFlow, JAX and MXNet run, by two source trees.

A check for a change to how the averaged iteration or its default window is made: each run under ``tests/data`` that
``formats.sniff`` reads and whose framework is one of those is opened once per tree (``pipeline.open_run``, the default
window, ``template=True``; the per-step replay's window beside), in a child process with that tree's ``src`` first on
PYTHONPATH, and one line per run prints both trees' steps and errors, marked where they differ.

    python bench/template_window.py --before ../main --after . [--data tests/data] [--frameworks tensorflow,jax,mxnet|all]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

DATA = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data"

_CHILD = r"""
import json, os, sys, tempfile
os.environ["DAGPROF_CACHE_DIR"] = tempfile.mkdtemp()
from dagprof.errors import DagprofError
from dagprof.pipeline import open_run
from dagprof.traces import formats
from dagprof.traces.load import load

root, wanted = sys.argv[1], set(sys.argv[2].split(","))
out = {}
def judge(p):
    try:
        run = load(p)
        framework = run.meta.framework or run.ranks[0].meta.framework
        if "all" not in wanted and framework not in wanted:
            return None
        plain, avg = open_run(p), open_run(p, template=True)
        return {"framework": framework, "steps": plain.graph.meta.steps, "error_pct": plain.analysis.error_pct,
                "template_steps": avg.graph.meta.steps, "template_pct": avg.analysis.error_pct}
    except DagprofError as e:
        return {"refused": str(e)[:120]}

runs = []  # folders read as runs: their rank folders and files are theirs (a run folder may hold runs: mxnet/user_mlp)
for folder, dirs, files in os.walk(root):
    dirs.sort()
    fmt = formats.sniff(folder)
    if fmt is not None and fmt.reader and fmt.name != "xplane-logdirs":  # logdirs: a folder of profiles, no run of its own
        runs.append(folder)
        paths = [folder]
    elif any(folder.startswith(r + os.sep) for r in runs):
        continue
    else:
        paths = [os.path.join(folder, f) for f in sorted(files)]
    for p in paths:
        f = formats.sniff(p)
        if f is None or not f.reader:
            continue
        r = judge(p)
        if r is not None:
            out[os.path.relpath(p, root)] = r
print(json.dumps(out))
"""


def answers(tree: pathlib.Path, data: pathlib.Path, frameworks: str) -> dict:
    """Per vendored run of ``frameworks`` under ``data``: ``tree``'s steps and errors (plain and averaged), or its refusal."""
    tree, data = tree.resolve(), data.resolve()  # the child runs elsewhere: a relative ``--after .`` had found the installed dagprof
    if not (tree / "src" / "dagprof").is_dir():
        raise SystemExit(f"{tree}: no src/dagprof in it")
    path = os.pathsep.join([str(tree / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory() as work:  # dagprof writes nothing into the repository from here
        p = subprocess.run([sys.executable, "-c", _CHILD, str(data), frameworks], env={**os.environ, "PYTHONPATH": path},
                           capture_output=True, text=True, timeout=3600, cwd=work)
    if p.returncode:
        raise SystemExit(f"{tree}: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout)


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    if "refused" in r:
        return "refused"
    s = r["template_steps"]
    pct = r["template_pct"]
    return f"{s[0]}..{s[-1]} {'n/a' if pct is None else format(pct, '+.2f')} %"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=pathlib.Path, help="a checkout (its src/ is read)")
    ap.add_argument("--after", required=True, type=pathlib.Path)
    ap.add_argument("--data", type=pathlib.Path, default=DATA)
    ap.add_argument("--frameworks", default="tensorflow,jax,mxnet", help="comma-separated, or all (PyTorch, Horovod and traces too)")
    args = ap.parse_args()
    a, b = answers(args.before, args.data, args.frameworks), answers(args.after, args.data, args.frameworks)
    same = 0
    for name in sorted(a.keys() | b.keys()):
        x, y = a.get(name), b.get(name)
        mark = "   " if x == y else "!! "
        same += x == y
        fw = (x or y or {}).get("framework") or ""
        print(f"{mark}{name:<40} {fw:<11} --template: {_cell(x):>20} -> {_cell(y):<20}")
    print(f"{same} of {len(a.keys() | b.keys())} runs answered the same by both trees (steps and errors, plain and averaged)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
