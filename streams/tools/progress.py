"""A small progress bar for long-running commands (stderr; plain lines when not a terminal)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, what: str, every_s: float = 0.5) -> None:
        self.total, self.what, self.every_s = total, what, every_s
        self.done = 0
        self.started = self._last = time.monotonic()
        self.tty = sys.stderr.isatty()

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last >= self.every_s or self.done >= self.total:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = self.done / self.total if self.total else 1.0
        rate = self.done / max(now - self.started, 1e-9)
        bar = "#" * int(frac * 30)
        line = f"[{bar:<30}] {self.done}/{self.total} {self.what} ({rate:,.0f}/s)"
        if self.tty:
            sys.stderr.write("\r" + line)
            if self.done >= self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
