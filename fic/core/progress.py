"""Progress on long work, whether or not anyone watches a terminal.

On a terminal: a tqdm bar. Elsewhere (output going to a log file, CI, a batch job) a bar
prints nothing useful, so a plain line goes out every `every_s` seconds and at the end:
what is running, done/total, the rate and the time left.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, total: int, desc: str, unit: str = "it", *, initial: int = 0, enabled: bool = True,
                 every_s: float = 60.0):
        from tqdm import tqdm

        self.total, self.desc, self.unit, self.done = total, desc, unit, initial
        self.start_done, self.every_s = initial, every_s
        interactive = sys.stderr.isatty()
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True,
                        disable=not (enabled and interactive) or None)
        self.plain = enabled and not interactive
        self.began = self.last = time.monotonic()
        self.postfix: dict[str, Any] = {}

    def update(self, n: int = 1, **postfix: Any) -> None:
        self.done += n
        self.postfix.update(postfix)
        self.bar.update(n)
        if postfix:
            self.bar.set_postfix(self.postfix, refresh=False)
        now = time.monotonic()
        if self.plain and (now - self.last >= self.every_s or self.done >= self.total):
            self.last = now
            print(self.line(now), flush=True)

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        rate = (self.done - self.start_done) / max(now - self.began, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else float("nan")
        extra = "".join(f", {k}={v}" for k, v in self.postfix.items())
        return (f"{self.desc}: {self.done}/{self.total} {self.unit}, {60 * rate:.1f} {self.unit}/min, "
                f"about {left / 60:.1f} min left{extra}")

    def close(self) -> None:
        self.bar.close()
