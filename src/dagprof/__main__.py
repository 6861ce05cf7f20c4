"""``python -m dagprof``: the ``dagprof`` command, for an environment whose scripts folder is not on PATH (or a checkout
on PYTHONPATH), where users try it first; it answered "'dagprof' is a package and cannot be directly executed"."""
import sys

from .cli.main import main

sys.exit(main())
