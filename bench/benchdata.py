"""Where the benchmarks find the reference data: ``--data DIR``, by default ``../shared/data`` next to the repository.

That folder (public traces and logs, see its README) is not part of the repository and is absent
on a fresh clone or in CI; a benchmark that needs it says so and exits. The test suite uses its
own small excerpts in tests/data instead.
"""
from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def add_data_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--data", type=Path, default=DEFAULT,
                    help=f"reference data folder (default: ../shared/data beside the repository, here {DEFAULT})")


def require(folder: Path) -> Path:
    """``folder`` if it exists, else exit with a one-line message naming it and the flag."""
    if not folder.is_dir():
        raise SystemExit(f"reference data not found: {folder} (pass --data DIR, the folder holding kineto-public/ etc.)")
    return folder
