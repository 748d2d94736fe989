"""A dependency-free progress bar for the eval/ drivers and the bench/ sweep (stderr).

On a terminal it redraws one line ("label [#####.....] 12/30 0:07 elapsed, ~0:11 left"); when stderr
is not a terminal (CI logs, pipes) it prints a plain line at every tenth of the way instead, so logs
stay short. DEEPINFER_PROGRESS=0 silences it.
"""
import os
import sys
import time


def _clock(s):
    s = int(max(0, s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Bar:
    def __init__(self, total, label="", stream=None, width=30):
        self.total = max(0, int(total))
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.done = 0
        self.started = time.monotonic()
        self.enabled = os.environ.get("DEEPINFER_PROGRESS", "1") != "0"
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_tenth = -1
        self._draw()

    def update(self, n=1, note=""):
        self.done = min(self.total, self.done + n) if self.total else self.done + n
        self._draw(note)

    def _line(self, note):
        elapsed = time.monotonic() - self.started
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * self.width))
        eta = f", ~{_clock(elapsed / frac - elapsed)} left" if 0 < frac < 1 else ""
        return (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{_clock(elapsed)} elapsed{eta}{(' ' + note) if note else ''}")

    def _draw(self, note=""):
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r" + self._line(note) + "\x1b[K")
            self.stream.flush()
            return
        tenth = int(10 * self.done / self.total) if self.total else 10
        if tenth != self._last_tenth:
            self._last_tenth = tenth
            self.stream.write(self._line(note) + "\n")
            self.stream.flush()

    def close(self):
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
