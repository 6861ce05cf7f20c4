"""Every vendored multi-rank run's warnings as ``analyze`` shows them, from one source tree: a change to how warnings are
gathered or said (warnmerge59: a warning several ranks give alike said once) checked for lines lost or merged wrongly.

    python bench/warnings_sweep.py --src /tmp/base/src --json before.json   # a checkout's src from before
    python bench/warnings_sweep.py --json after.json                        # this tree
    python bench/warnings_sweep.py --compare before.json after.json

Runs are the folders under tests/data (copied to a temporary folder first: nothing is written there) that dagprof reads
as one run, a rank's own folder left out, and the folders of two or more Kineto files; each opened in a child
process of this interpreter with the tree's ``src`` first on PYTHONPATH, in chunks (``--chunk``) to keep each short.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

DATA = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data"
SRC = pathlib.Path(__file__).resolve().parents[1] / "src"

CHILD = r"""
import json, os, re, sys
from dagprof.errors import DagprofError
from dagprof.pipeline import open_run
from dagprof.traces import formats

root, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = []
for folder, dirs, files in os.walk(root):
    dirs.sort()
    fmt = formats.sniff(folder) if folder != root else None
    kineto = [f for f in files if f.endswith((".pt.trace.json", ".pt.trace.json.gz"))]
    if (fmt is not None and fmt.reader) or len(kineto) >= 2:
        runs.append(folder)
    dirs[:] = [d for d in dirs if not re.fullmatch(r"(rank|worker|task|server|scheduler)[-_]?\d*|plugins|profile|\d{4}_.*", d)]
out = {}
for p in runs[lo:hi]:
    try:
        said = open_run(p).warnings
    except DagprofError as e:
        said = ["refused: " + str(e)]
    out[os.path.relpath(p, root)] = [w.replace(root, "<data>") for w in said]  # the same lines from any copy
print(json.dumps({"count": len(runs), "warnings": out}))
"""


def sweep(src: pathlib.Path, chunk: int) -> dict[str, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        data = pathlib.Path(tmp) / "data"
        shutil.copytree(DATA, data)
        env = {"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}
        out: dict[str, list[str]] = {}
        lo, count = 0, 1
        while lo < count:
            got = json.loads(subprocess.run([sys.executable, "-c", CHILD, str(data), str(lo), str(lo + chunk)], env=env,
                                            capture_output=True, text=True, check=True).stdout)
            count, lo = got["count"], lo + chunk
            out.update(got["warnings"])
            print(f"{min(lo, count)} of {count} runs", file=sys.stderr)
        return out


def compare(before: dict[str, list[str]], after: dict[str, list[str]]) -> int:
    """Per run whose lines changed: the lines added and gone; then the counts."""
    changed = 0
    for run in sorted(set(before) | set(after)):
        b, a = before.get(run, []), after.get(run, [])
        if a == b:
            continue
        changed += 1
        print(f"{run}: {len(b)} -> {len(a)} lines")
        print("".join(f"  + {w}\n" for w in a if w not in b) + "".join(f"  - {w}\n" for w in b if w not in a), end="")
    print(f"{changed} of {len(set(before) | set(after))} runs changed; {sum(1 for v in before.values() if v)} with a warning "
          f"before; lines {sum(map(len, before.values()))} -> {sum(map(len, after.values()))}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=pathlib.Path, default=SRC, help="the tree's src folder (default: this checkout's)")
    ap.add_argument("--json", type=pathlib.Path, help="write {run: [warning, ...]} here")
    ap.add_argument("--chunk", type=int, default=60, help="runs per child process")
    ap.add_argument("--compare", nargs=2, type=pathlib.Path, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        return compare(*(json.loads(p.read_text()) for p in args.compare))
    out = sweep(args.src.resolve(), args.chunk)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    else:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
