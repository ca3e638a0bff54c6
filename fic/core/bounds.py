"""The bounds of a setting: the ranges its name implies (seconds, tokens, seeds) and the upper
bounds declared with `setting(..., max=MAX_*)`, checked as a config loads (`check_bounds`, the one
place) and shown by `--keys`. A number with no upper bound says why with `setting(..., unbounded=
"...")`: it sizes nothing (a rate, a weight, a temperature), so no value of it holds memory or time."""

from __future__ import annotations

from typing import Any

from fic.core.errors import FicError

# Bounds a field's name implies, whatever its declaration: a setting past them is accepted by no
# library FiC hands it to (the OpenAI client overflows on a timeout of 1e12 s, numpy refuses a
# seed of -1 or 2**32, nucleus sampling keeps no token at top_p 0). (suffix, low, high, low excluded)
WEEK_S = 7 * 24 * 3600
MAX_TOKENS = 1 << 24  # more tokens than any model's context
MAX_SEED = 2**32 - 1
PHYSICAL_BOUNDS = (("_s", 0, WEEK_S, False), ("tokens", 0, MAX_TOKENS, False), ("seq_len", 1, MAX_TOKENS, False),
                   ("seed", 0, MAX_SEED, False), ("top_p", 0, 1, True))


# Upper bounds of the settings that size an allocation, a loop or a retry count, declared with
# `setting(..., max=...)` and checked as the config loads (`--dry-run` included), before any model
# loads: past them a run would hold more memory or take longer than any machine allows, so the
# value is a slip (`lora.r=10**6` was accepted, then failed after a 200 s model load). `--keys`
# shows each setting's bounds.
MAX_BATCH = 4096            # prompts, conversations or sequences handled at once
MAX_STEPS = 10_000_000      # optimizer steps, and steps between checkpoints, scores or logs
MAX_ACCUMULATION = 65_536   # micro-batches per optimizer step; a padding multiple; a bucket window
MAX_REPEATS = 1000          # runs, samples, conversations per instance, patience, turns, checkpoints kept
MAX_RETRIES = 100           # retries of a request or of a judge's answer
MAX_INSTANCES = 10_000_000  # instances read or generated
MAX_RANK = 4096             # a LoRA rank
MAX_EPOCHS = 10_000
MAX_PARALLEL = 1024         # requests in flight; GPUs a model is sharded over
MAX_RESAMPLES = 1_000_000   # bootstrap resamples
MAX_MIB = 1 << 20           # a memory budget in MiB (1 TiB)
MAX_VOCAB = 1 << 20         # tokens of a vocabulary (the largest are about 256k)


def bounds_text(name: str, meta: dict) -> str:
    """A setting's range in words (`1 to 4,096`, `at least 0`, `0 to a week`), from its declared
    `min`/`max` and the bounds its name implies, and, for a number declared `unbounded`, why it has
    no upper bound; empty when it has none of these."""
    text = _range_text(name, meta)
    if meta.get("unbounded"):
        why = f"no upper bound ({meta['unbounded']})"
        return f"{text}, {why}" if text else why
    return text


def _range_text(name: str, meta: dict) -> str:
    low, high, above = meta.get("min"), meta.get("max"), False
    for suffix, floor, ceiling, excluded in PHYSICAL_BOUNDS:
        if name.endswith(suffix):
            if low is None or floor >= low:
                low, above = floor, excluded
            high = ceiling if high is None else min(high, ceiling)

    def shown(value: float) -> str:
        if value == WEEK_S and name.endswith("_s"):
            return "a week"
        return f"{value:,}" if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1000 else f"{value:g}"

    if low is not None and high is not None:
        return f"{'above ' if above else ''}{shown(low)} to {shown(high)}"
    if low is not None:
        return f"{'above' if above else 'at least'} {shown(low)}"
    return f"at most {shown(high)}" if high is not None else ""


def has_upper_bound(name: str, meta: dict) -> bool:
    """Whether a setting's values are held below a bound (declared, or implied by its name)."""
    return meta.get("max") is not None or any(name.endswith(suffix) for suffix, *_ in PHYSICAL_BOUNDS)


def check_bounds(value: Any, name: str, meta: dict, key: str, source: str) -> None:
    """Every bound of the setting `name` (its `setting()` metadata `meta`) on its checked value: its
    choices, declared range and the bounds its name implies, on each item of a list too."""
    items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
    for index, item in items:
        where = key if index is None else f"{key}[{index}]"
        check_range(item, meta, where, source)
        check_physical(item, name, where, source)


def check_flags(args: Any, bounds: dict[str, tuple[int, int]]) -> None:
    """A verb's integer flags held to bounds as a setting's `min`/`max` are (`--retries`: (0,
    MAX_RETRIES)): a value past them is one `FicError` naming the flag, before any model loads."""
    for flag, (low, high) in bounds.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            check_range(value, {"min": low, "max": high}, flag, None)


def check_physical(value: Any, name: str, key: str, source: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    for suffix, low, high, excluded in PHYSICAL_BOUNDS:
        if name.endswith(suffix) and (value <= low if excluded else value < low):
            raise FicError(f"expected a value {'>' if excluded else '>='} {low}, got {value!r}", path=source, field=key)
        if name.endswith(suffix) and value > high:
            unit = {"_s": " seconds (a week)", "seed": " (a seed is 32 bits)"}.get(suffix, "")
            raise FicError(f"expected a value <= {high:,}{unit}, got {value!r}", path=source, field=key)


def check_range(value: Any, meta: dict, key: str, source: str | None) -> None:
    choices, low, high = meta.get("choices"), meta.get("min"), meta.get("max")
    if choices is not None and value is not None and value not in choices:
        raise FicError(f"expected one of {', '.join(map(repr, choices))}, got {value!r}",
                       path=source, field=key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if low is not None and value < low:
            raise FicError(f"expected a value >= {low}, got {value!r}", path=source, field=key)
        if high is not None and value > high:
            raise FicError(f"expected a value <= {high}, got {value!r}", path=source, field=key)
