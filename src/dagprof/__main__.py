"""``python -m dagprof ...``: the same commands as the ``dagprof`` script, for an environment whose scripts are not on PATH."""
import sys

from .cli.main import main

sys.exit(main())
