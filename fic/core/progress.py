"""Progress on long work, whether or not anyone watches a terminal.

On a terminal: a tqdm bar. Elsewhere (output going to a log file, CI, a batch job) a bar
prints nothing useful, so a plain line goes out every `every_s` seconds and at the end:
what is running, done/total, the rate and the time left.

The heartbeat: one generation call can take most of an hour (the first turn of every
conversation of an evaluation is one lockstep call), and nothing finishes inside it. So while a
`Progress` is open, a background thread says every `every_s` seconds what is happening inside:
the turn and the conversations in it (`note`, from `fic.conversation.simulator.play`), the rows
still writing and the tokens decoded (`decoded`, from the hf backend's decoding loop). On a
terminal it refreshes the bar with them; elsewhere it prints the plain line when no other line
went out for `every_s` seconds. The innermost open `Progress` gets the news (VASD's rollouts
report to the training run's bar). `FIC_PROGRESS_S` sets the default interval (60 s).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

PROGRESS_ENV = "FIC_PROGRESS_S"
_open: list[Progress] = []  # the open bars, innermost last
_lock = threading.Lock()


def default_every_s() -> float:
    """Seconds between plain lines and heartbeats: `FIC_PROGRESS_S`, else 60."""
    try:
        return max(0.05, float(os.environ.get(PROGRESS_ENV, "60")))
    except ValueError:
        return 60.0


def note(**detail: Any) -> None:
    """Tell the innermost open bar what is going on inside its current unit (turn=2, conversations=64)."""
    with _lock:
        if _open:
            _open[-1].live.update(detail)


def decoded(tokens: int, rows: int) -> None:
    """A decoding step wrote `tokens` tokens; `rows` rows are still writing (the hf backend)."""
    with _lock:
        if _open:
            bar = _open[-1]
            bar.tokens += tokens
            bar.live["rows writing"] = rows


class Progress:
    def __init__(self, total: int, desc: str, unit: str = "it", *, initial: int = 0, enabled: bool = True,
                 every_s: float | None = None):
        from tqdm import tqdm

        every_s = default_every_s() if every_s is None else every_s
        self.total, self.desc, self.unit, self.done = total, desc, unit, initial
        self.start_done, self.every_s = initial, every_s
        interactive = sys.stderr.isatty()
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True,
                        disable=not (enabled and interactive) or None)
        self.plain = enabled and not interactive
        self.began = self.last = time.monotonic()
        self.postfix: dict[str, Any] = {}
        self.live: dict[str, Any] = {}  # what `note` and `decoded` said since the last unit finished
        self.tokens = 0  # decoded since the bar opened
        self.stopped = threading.Event()
        self.thread = None
        if enabled:  # a silent bar takes no news: the bar around it keeps its heartbeat
            with _lock:
                _open.append(self)
        if enabled and every_s > 0:
            self.thread = threading.Thread(target=self._beat, name=f"fic-progress-{desc}", daemon=True)
            self.thread.start()

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
        elapsed = max(now - self.began, 1e-9)
        rate = (self.done - self.start_done) / elapsed
        if rate > 0:
            left = f"about {(self.total - self.done) / rate / 60:.1f} min left"
        else:  # nothing finished yet: no rate to say a time from, but the heartbeat says what runs
            left = f"{elapsed / 60:.1f} min in, no {self.unit} done yet to tell the time left from"
        extra = "".join(f", {k}={v}" for k, v in self.postfix.items())
        return f"{self.desc}: {self.done}/{self.total} {self.unit}, {60 * rate:.1f} {self.unit}/min, {left}{extra}"

    def heartbeat(self, now: float | None = None) -> str:
        """The plain line and what runs inside the current unit: turn, conversations, rows writing,
        tokens decoded so far and their rate."""
        now = time.monotonic() if now is None else now
        with _lock:
            live = dict(self.live)
            tokens = self.tokens
        inside = [f"{k} {v}" for k, v in live.items()]
        if tokens:
            inside.append(f"{tokens:,} tokens decoded ({tokens / max(now - self.began, 1e-9):.1f}/s)")
        return self.line(now) + (f"; now: {', '.join(inside)}" if inside else "")

    def _beat(self) -> None:
        while not self.stopped.wait(self.every_s):
            now = time.monotonic()
            if self.plain and now - self.last >= self.every_s * 0.99:
                self.last = now
                print(self.heartbeat(now), flush=True)
            elif not self.plain:
                with _lock:
                    live = {k: v for k, v in self.live.items()}
                    tokens = self.tokens
                self.bar.set_postfix({**self.postfix, **live, **({"tokens": tokens} if tokens else {})})

    def close(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()
        with _lock:
            if self in _open:
                _open.remove(self)
        self.bar.close()
