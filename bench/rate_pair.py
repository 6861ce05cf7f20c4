"""One script's bandwidth what-if checked on the namespace testbed (root): the job profiled on the shaped loopback at FAST
bit/s and at SLOW bit/s, each in a fresh namespace, and SLOW predicted from the FAST profile as ``bench_frameworks.py
--testbed`` predicts it (``shaped_loopback.predict_rate``); prints both as JSON. Run it under the measuring lock:

    flock /tmp/dagprof-measure.lock python bench/rate_pair.py 500e6 200e6 OUT -- torchrun --standalone --nproc-per-node 2 SCRIPT ARGS
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from shaped_loopback import measured, namespace, predict_rate, shape_loopback  # noqa: E402


def main() -> None:
    fast, slow, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    cmd = sys.argv[sys.argv.index("--") + 1:]
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               PYTHONPATH=os.path.join(os.path.dirname(HERE), "src"))
    for rate in (fast, slow):
        with namespace("pair", None) as (ns, _):
            shape_loopback(ns, rate)
            subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "dagprof.cli.main", "profile", "-o",
                            os.path.join(out, f"{rate / 1e6:g}"), "--", *cmd], env=env, check=True, capture_output=True)
    scalar = lambda d: {k: v for k, v in d.items() if not isinstance(v, list)}  # noqa: E731
    print(json.dumps({"predicted_from_fast": scalar(predict_rate(os.path.join(out, f"{fast / 1e6:g}"), fast, slow)),
                      "measured_slow": scalar(measured(os.path.join(out, f"{slow / 1e6:g}")))}, indent=1, default=str))


if __name__ == "__main__":
    main()
