"""SIGTERM and SIGINT while a window records: note what stops the process, then do what the previous handler did.

torchrun sends SIGTERM to the other ranks when one fails. A rank's completed steps are on disk already
(``collector_files``), so the handler adds one note (which signal, during which step) and changes nothing else: the
program's own handler still runs, and the default still kills the process by the same signal, as without dagprof.

A launcher waiting for its job (``collect.jobs.launch``, ``mxnet_ps.launch_command``) takes SIGTERM as SIGINT instead
(``terminate_raises``), so it stops the job and tidies up rather than dying at once. Standard library only.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, Callable, Iterator


class StopSignals:
    """Watches SIGTERM and SIGINT between ``catch`` and ``release``; ``note(how)`` records what stops the process
    ("" when the program's handler let it carry on); ``step()`` says which step was running."""

    def __init__(self, note: Callable[[str], None], step: Callable[[], int]):
        self._note = note
        self._step = step
        self._prev: dict[int, Any] = {}  # signal -> the handler ours replaced

    def catch(self, warnings: list[str]) -> None:
        """From now on, for both signals; one that cannot be watched adds a line to ``warnings``."""
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._prev[sig] = signal.getsignal(sig)
                signal.signal(sig, self._on_signal)
            except (ValueError, OSError) as err:
                warnings.append(f"dagprof: cannot watch {sig.name} ({err}): a rank stopped by it says less")

    def release(self) -> None:
        """Put the previous handlers back, unless the program replaced ours meanwhile (theirs stays)."""
        if threading.current_thread() is not threading.main_thread():
            return
        while self._prev:
            sig, prev = self._prev.popitem()
            try:
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                pass

    def _on_signal(self, signum: int, frame: Any) -> None:
        prev = self._prev.get(signum, signal.SIG_DFL)
        if prev == signal.SIG_IGN:
            return
        self._note(f"stopped by {signal.Signals(signum).name} during step {self._step()}")
        if callable(prev):
            prev(signum, frame)  # SIGINT's default raises KeyboardInterrupt: training unwinds and close() writes
            self._note("")  # the program's own handler let it carry on: nothing was stopped
            return
        signal.signal(signum, signal.SIG_DFL)  # the default action: die of this signal, as without dagprof
        os.kill(os.getpid(), signum)


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """SIGTERM (``kill``, a batch system's time limit) raised as SIGINT is while the block runs, so the job is stopped and
    the caller tidies up rather than this process dying at once; the previous handler restored after (main thread only:
    signals go there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
