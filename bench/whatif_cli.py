"""``dagprof whatif RUN ARGS --json`` as a user runs it, by the dagprof of a given tree: one way for every bench that
judges a what-if against a measured job (each says for itself what a refusal means to it)."""
from __future__ import annotations

import json
import os
import subprocess
import sys


class Refused(Exception):
    """The what-if refused (or failed): its last stderr line."""


def whatif_json(run: str, *args: str, src: str | None = None) -> dict:
    """The ``--json`` answer of ``dagprof whatif RUN ARGS --no-trace --allow-model-error`` by the tree whose ``src`` is
    given (None: the dagprof this Python imports); ``Refused`` with its last stderr line where it exits non-zero."""
    env = dict(os.environ, **({"PYTHONPATH": str(src)} if src else {}))
    done = subprocess.run([sys.executable, "-m", "dagprof.cli.main", "whatif", str(run), *args, "--no-trace", "--allow-model-error",
                           "--json"], capture_output=True, text=True, env=env)
    if done.returncode:
        raise Refused((done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1])
    return json.loads(done.stdout)
