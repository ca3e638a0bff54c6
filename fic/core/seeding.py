"""Seeds and random generators fixed by what they are for, never by call order.

Every random draw in FiC (a sampling call, a conversation's phrasing, a shuffle order) is
seeded from the parts that identify it, e.g. `(seed, "assistant", step, chunk)` or
`(seed, task_id, slot)`, so results do not depend on what else ran before and a resumed job
draws what an uninterrupted one would. Python's `hash()` changes between processes, so the
parts are hashed with sha256.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any


def _digest(parts: tuple) -> bytes:
    return hashlib.sha256(":".join(map(str, parts)).encode()).digest()


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any parts."""
    return int.from_bytes(_digest(parts)[:4], "big") & 0x7FFFFFFF


def reply_seed(seed: int, who: str, conversation: Any) -> int:
    """The seed of the next reply of `who` ("assistant", "user") in a conversation: a function of
    the conversation (`key`: task id, view, run) and its turn, never of the batch it is played in."""
    return derive_seed(seed, who, *conversation.key, len(conversation.turns))


def seeded_rng(*parts: Any) -> random.Random:
    """A `random.Random` fixed by its parts."""
    return random.Random(int.from_bytes(_digest(parts)[:8], "big"))


def pick(options: tuple | list, *parts: Any) -> Any:
    """One of `options`, chosen by the parts (the same parts always choose the same one)."""
    return options[int.from_bytes(_digest(parts)[:4], "big") % len(options)]
