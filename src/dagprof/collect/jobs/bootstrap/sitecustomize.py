"""Loaded by every Python process of a job that ``collect.jobs.launch`` starts (this folder is first on PYTHONPATH)."""
import importlib
import os
import sys


def _dagprof_install() -> None:
    try:
        from dagprof.collect.deploy import autoapply
        from dagprof.collect.hooks import autoprofile

        autoprofile.install()
        autoapply.install()
    except Exception as err:  # noqa: BLE001  (never break the user's job)
        print(f"dagprof: zero-code profiling unavailable in this process: {err}", file=sys.stderr)


def _chain_to_next_sitecustomize() -> None:
    """Keep a sitecustomize that ours shadows working."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    ours = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours


_dagprof_install()
_chain_to_next_sitecustomize()
