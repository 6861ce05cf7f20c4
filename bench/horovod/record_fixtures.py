"""Re-record the Horovod test fixtures (tests/data/horovod/) from real 2-rank horovodrun jobs.

    HVD_VENV=/opt/hvd python bench/horovod/record_fixtures.py [--out tests/data/horovod]

Each fixture is a dagprof run folder of a tiny CNN (``train_hvd.py``) trained by two gloo
ranks on this CPU, profiled for three steps with ``dagprof.collect.horovod.profile`` and
Horovod's timeline (rank 0):
- ``fused``: Horovod's defaults (128 MiB fusion threshold, 1 ms cycle);
- ``unfused``: ``HOROVOD_FUSION_THRESHOLD=0`` (every gradient its own all-reduce), 5 ms cycle.
Needs Horovod (``build_horovod.sh``). tests/test_horovod_integration.py runs this (opt-in).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MODEL = ["--width", "8", "--blocks", "1,1", "--image-size", "12", "--batch-size", "4"]
FIXTURES = {
    "fused": {"HOROVOD_CYCLE_TIME": "1"},
    "unfused": {"HOROVOD_CYCLE_TIME": "5", "HOROVOD_FUSION_THRESHOLD": "0"},
}
KEEP = ("manifest.json", "horovod_timeline.json")  # plus rank*.json


def record(venv: str, name: str, out: str, steps: str = "4:7") -> str:
    """Profile one fixture into ``out/name`` (replaced); returns the folder."""
    env = {**os.environ, **FIXTURES[name], "HOROVOD_TIMELINE": "DYNAMIC", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "src")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryDirectory(prefix=f"dagprof-hvd-{name}-") as tmp:
        stop = int(steps.partition(":")[2])
        cmd = [os.path.join(venv, "bin", "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
               os.path.join(venv, "bin", "python"), os.path.relpath(os.path.join(HERE, "train_hvd.py"), REPO),  # argv as recorded: no machine path
               "--steps", str(stop + 1), "--profile", steps, "--out", tmp, *MODEL]
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"horovodrun failed ({proc.returncode}): {proc.stderr[-2000:]}")
        dest = os.path.join(out, name)
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        for f in sorted(os.listdir(tmp)):
            if f in KEEP or (f.startswith("rank") and f.endswith(".json")):
                shutil.copy(os.path.join(tmp, f), dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", default=os.environ.get("HVD_VENV") or os.environ.get("DAGPROF_HOROVOD_VENV"),
                   help="venv with Horovod (bench/horovod/build_horovod.sh VENV); default $HVD_VENV or $DAGPROF_HOROVOD_VENV")
    p.add_argument("--out", default=os.path.join(REPO, "tests", "data", "horovod"))
    p.add_argument("names", nargs="*", default=list(FIXTURES))
    args = p.parse_args(argv)
    if not args.venv:
        p.error("no Horovod venv: pass --venv or set HVD_VENV (build one with bench/horovod/build_horovod.sh VENV)")
    for name in args.names:
        print(record(args.venv, name, args.out), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
