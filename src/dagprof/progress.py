"""Progress of long work on stderr, only when stderr is a terminal (never in pipes, logs or --json output).

Behind this one module is tqdm: a single small pure-Python package with no dependencies of its own,
maintained for a decade, that already writes to stderr, rate-limits its redraws (cheap inside a
training loop) and can wait before it shows anything. rich draws nicer bars but brings several
packages (pygments, markdown-it) to a library that needs one line of progress. tqdm is imported
only when a bar is really shown, so ``import dagprof`` stays free of it.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")
_DELAY_S = 0.5  # work that ends sooner shows nothing


def shown() -> bool:
    """Bars are drawn only on a terminal, and ``DAGPROF_PROGRESS=0`` turns them off."""
    return os.environ.get("DAGPROF_PROGRESS", "1") != "0" and sys.stderr.isatty()


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int | None, what: str, unit: str = "it", show: bool = True):
    """A bar with ``update(n)`` and ``close()``; a silent stand-in when nothing is shown (or not ``show``)."""
    if not (show and shown()):
        return _Silent()
    from tqdm import tqdm

    return tqdm(total=total, desc=f"dagprof: {what}", unit=unit, file=sys.stderr, leave=False, delay=_DELAY_S, dynamic_ncols=True)


def progress(items: Iterable[T], what: str, total: int | None = None, unit: str = "it") -> Iterator[T]:
    """``items``, with a bar while they are consumed."""
    if not shown():
        yield from items
        return
    b = bar(total if total is not None else (len(items) if hasattr(items, "__len__") else None), what, unit)
    try:
        for x in items:
            yield x
            b.update()
    finally:
        b.close()
