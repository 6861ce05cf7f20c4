"""Run every command a user runs on the user-style framework scripts' kept runs (``bench_frameworks.py --keep DIR``).
On NAME-0 of each script: replay, replay --template, analyze, whatif (200 Mbit/s, 4 workers; an MXNet script's also 2
servers, ``--scheme ps:2``), optimize, report, then
diff of NAME-0 and NAME-1, each also with ``--json``. A line per command says ok, "refused: <the one line>" (exit 2) or
FAILED (a traceback, or ``--json`` that is not one JSON object); replay lines carry the replay error.
    python bench/bench_frameworks.py --runs 5 --only jax_vit_optax,mx_wlm_clip --keep /tmp/fw
    python bench/frameworks/review.py /tmp/fw jax_vit_optax,mx_wlm_clip [--run 2]
"""
from __future__ import annotations

import argparse
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("fsdp_chain", os.path.join(HERE, "..", "fsdp_fresh", "chain.py"))
chain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chain)

COMMANDS = (("replay", []), ("replay --template", ["--template"]), ("analyze", []),
            ("whatif --bandwidth 200Mbit", ["--bandwidth", "200Mbit"]), ("whatif --workers 4", ["--workers", "4"]),
            ("optimize", ["--budget", "10"]), ("report", []))
MXNET_COMMANDS = (("whatif --scheme ps:2", ["--scheme", "ps:2"]),)  # a parameter-server job's own axis: more servers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("keep", help="the folder bench_frameworks.py --keep wrote")
    p.add_argument("scripts", help="comma-separated script names")
    p.add_argument("--run", type=int, default=0, help="which kept run to review (diffed against the next one)")
    args = p.parse_args()
    for name in args.scripts.split(","):
        a, b = (os.path.join(args.keep, f"{name}-{args.run + k}") for k in (0, 1))
        print(f"== {name}", flush=True)
        for label, extra in COMMANDS + (MXNET_COMMANDS if name.startswith("mx_") else ()):
            chain.check(f"{name} {label}", [label.split()[0], a, *extra])
        chain.check(f"{name} diff", ["diff", a, b])


if __name__ == "__main__":
    main()
