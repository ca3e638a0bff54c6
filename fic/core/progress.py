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

Phases: a unit made of long parts of different kinds (a VASD step: rollouts, teacher, student,
update) says which part runs (`phase`), so the heartbeat names it with that part's own
progress: what `note` and `decoded` said inside it, or how many of its items are done
(`counting`: micro-batch 3 of 8). The time left is a finish time, not a rate that decays while
a unit runs: from the last finished unit, and inside a phase from the phase's own rate (its
items done), else from how long it and the phases after it took in the last unit.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

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


@contextmanager
def phase(name: str, what: str = "") -> Iterator[None]:
    """The innermost open bar's current unit is in phase `name` (`what`: a few words on it) until
    the block ends; what `note` and `decoded` said before it is forgotten."""
    with _lock:
        bar = _open[-1] if _open else None
        if bar is not None:
            bar.phase = {"name": name, "what": what, "began": time.monotonic(), "tokens": bar.tokens}
            bar.live = {}
            bar.unit_phases.append(name)
    try:
        yield
    finally:
        with _lock:
            if bar is not None and bar.phase is not None:
                bar.phase_s[name] = time.monotonic() - bar.phase["began"]
                bar.phase, bar.live = None, {}


def counting(items: Sequence, unit: str) -> Iterator:
    """`items` one by one, telling the current phase how many are done after each (3/8 micro-batches)."""
    _count(0, len(items), unit)
    for done, item in enumerate(items, 1):
        yield item
        _count(done, len(items), unit)


def _count(done: int, total: int, unit: str) -> None:
    with _lock:
        current = _open[-1].phase if _open else None
        if current is not None:
            current.update(done=done, total=total, unit=unit, counted_at=time.monotonic())


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
        self.phase: dict | None = None  # the phase running now (`phase`), and its count (`counting`)
        self.phase_s: dict[str, float] = {}  # seconds each phase took when it last ran
        self.unit_phases: list[str] = []  # the phases begun in the current unit, in order
        self.last_unit_phases: list[str] = []  # and in the last unit that had any
        self.unit_at = self.began  # when the last unit finished (the bar opened: none yet)
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
        with _lock:
            self.unit_at = now
            self.last_unit_phases, self.unit_phases = self.unit_phases or self.last_unit_phases, []
        if self.plain and (now - self.last >= self.every_s or self.done >= self.total):
            self.last = now
            print(self.line(now), flush=True)

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        unit_s = self._unit_s()
        if unit_s is not None:
            left = f"about {self._left_s(now, unit_s) / 60:.1f} min left"
        else:  # nothing finished yet: no rate to say a time from, but the heartbeat says what runs
            left = f"{(now - self.began) / 60:.1f} min in, no {self.unit} done yet to tell the time left from"
        rate = 60 / unit_s if unit_s else 0.0
        extra = "".join(f", {k}={v}" for k, v in self.postfix.items())
        return f"{self.desc}: {self.done}/{self.total} {self.unit}, {rate:.1f} {self.unit}/min, {left}{extra}"

    def _left_s(self, now: float, unit_s: float) -> float:
        """Seconds left: the units after this one at `unit_s` each, and what this one has left: from
        its phases where they tell (the running one's time left, and the times the phases after it
        in the last unit took), else a unit's time less what it has run."""
        if self.done >= self.total:
            return 0.0
        with _lock:
            current = dict(self.phase) if self.phase else None
            order = list(self.last_unit_phases)
        in_phase = _phase_left(current, now, self.phase_s) if current else None
        if in_phase is not None and current["name"] in order:  # and the phases after it, as long as last time
            this_unit = in_phase + sum(self.phase_s[p] for p in order[order.index(current["name"]) + 1:])
        else:
            this_unit = max(0.0, unit_s - (now - self.unit_at))
        return this_unit + (self.total - self.done - 1) * unit_s

    def _unit_s(self) -> float | None:
        """Seconds per unit as of the last finished one (None: none finished since the bar opened)."""
        done = self.done - self.start_done
        return (self.unit_at - self.began) / done if done > 0 else None

    def heartbeat(self, now: float | None = None) -> str:
        """The plain line and what runs inside the current unit: its phase, with the phase's count
        and time left; the turn, conversations, rows writing, tokens decoded so far and their rate."""
        now = time.monotonic() if now is None else now
        with _lock:
            live = dict(self.live)
            current = dict(self.phase) if self.phase else None
            tokens = self.tokens - (current["tokens"] if current else 0)
        since = current["began"] if current else self.began
        inside = [f"{k} {v}" for k, v in live.items()]
        if tokens:
            inside.append(f"{tokens:,} tokens decoded ({tokens / max(now - since, 1e-9):.1f}/s)")
        if current:
            name = current["name"] + (f" ({current['what']})" if current["what"] else "")
            inside.insert(0, f"{name} {(now - since) / 60:.1f} min in")
            if "total" in current:
                inside.insert(1, f"{current['done']}/{current['total']} {current['unit']}")
            phase_left = _phase_left(current, now, self.phase_s)
            if phase_left is not None:
                inside.append(f"about {phase_left / 60:.1f} min left in it")
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
                    current = dict(self.phase) if self.phase else None
                if current:  # the phase first, with its count
                    live = {"phase": current["name"] + (f" {current['done']}/{current['total']}"
                                                        if "total" in current else ""), **live}
                self.bar.set_postfix({**self.postfix, **live, **({"tokens": tokens} if tokens else {})})

    def close(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()
        with _lock:
            if self in _open:
                _open.remove(self)
        self.bar.close()


def _phase_left(current: dict, now: float, last_s: dict[str, float]) -> float | None:
    """Seconds the running phase has left: from its own rate where it counts items and some are
    done (the finish that rate gave at the last count), else from how long it took last time;
    None where neither is known."""
    if current.get("done"):
        per_item = (current["counted_at"] - current["began"]) / current["done"]
        return max(0.0, current["began"] + per_item * current["total"] - now)
    if current["name"] in last_s:
        return max(0.0, current["began"] + last_s[current["name"]] - now)
    return None
