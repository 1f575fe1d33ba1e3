"""Graceful stops: the first SIGINT/SIGTERM asks long work to stop at a safe point; a second
SIGINT aborts at once (KeyboardInterrupt). Used by training (stop after the step, with a
checkpoint) and by corpus preparation (stop after the document, committed)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class StopRequest:
    """Context manager installing the handlers (main thread only); ``signum`` is set by the first
    signal. ``first``/``second``: messages printed to stderr (None: silent)."""

    def __init__(self, first: str | None = None, second: str | None = None) -> None:
        self.signum: int | None = None
        self.first, self.second = first, second
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            if self.second:
                print(f"\nrltok: second SIGINT: {self.second}", file=sys.stderr, flush=True)
            raise KeyboardInterrupt
        self.signum = signum
        if self.first:
            print(f"\nrltok: {signal.Signals(signum).name} received: {self.first}", file=sys.stderr, flush=True)

    @property
    def exit_code(self) -> int:
        return EXIT_SIGTERM if self.signum == signal.SIGTERM else EXIT_SIGINT
