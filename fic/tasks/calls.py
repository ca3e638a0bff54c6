"""Function calls in model replies: finding them, reading them with `ast`, and BFCL's AST match.

A reply answers a function-calling task with one or more calls written as Python,
`[get_weather(city="Paris", unit="celsius"), get_time(zone="CET")]` (the Berkeley Function
Calling Leaderboard's "Python" format, which Lost in Conversation uses).

Reading never executes anything: the call text is parsed with `ast.parse(..., mode="eval")`
and only the syntax tree is walked. Literals (strings, numbers, booleans, None, lists, tuples,
dicts, negative numbers) become Python values; a bare name becomes its text (BFCL reads
`data=my_table` as the string "my_table"); a nested call without keywords becomes its source
text, one with keywords a `{name: {arg: value}}` dict (as BFCL does); any other expression
(`2*3`, `x[0]`, `lambda: 1`) becomes its source text, so it can never equal a number.
The reply, each call text and its syntax tree are size-capped so a huge literal is refused
at once instead of stalling an evaluation.

`check_calls(calls, functions, reference)` is BFCL's AST checker (`bfcl_eval`'s
`ast_checker`, Python rules), reimplemented because the `bfcl-eval` package pins numpy 1.26
and pulls dozens of API clients. For each call: the function name matches; every required
parameter is present; no parameter outside the schema or the reference; each value is of the
schema's type (an int is accepted for a float; bool is not an int) and among the accepted
values; strings compare after BFCL's normalisation (case, spaces and `,./-_*^` ignored);
lists and dicts element-wise; a reference parameter whose accepted values include `""` may be
left out, any other must be given. Several calls are matched order-insensitively. Two
deliberate differences: positional arguments are refused (BFCL drops them silently), and the
calls are paired by a full matching rather than BFCL's first-fit, which can only turn a false
0 into a 1 when accepted values overlap.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

MAX_REPLY_CHARS = 20_000  # a longer reply is not read for calls at all
MAX_CALL_CHARS = 4_000    # the text of one call list
MAX_NODES = 2_000         # syntax-tree nodes of one call list
MAX_CANDIDATES = 64       # call-looking spans tried per reply (bounds the work on any text)

FENCE = re.compile(r"```[A-Za-z0-9_+-]*")
# Where a call list may start: "[name(" or a bare "name(" (dotted names allowed: "math.sqrt(").
CALL_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(|(?<![\w.])[A-Za-z_][\w.]*\s*\(")
SEPARATOR = re.compile(r"[\s,;]*")
DEFINITION = re.compile(r"\b(?:def|class)\s+$")
OPENERS, CLOSERS = "([{", ")]}"


@dataclass
class Call:
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    positional: int = 0  # positional arguments given (refused by the checker)


# ---------------------------------------------------------------------------- reading calls

def parse_calls(text: str) -> list[Call] | None:
    """The calls of a call-list text (`[f(a=1), g(b="x")]`, or one bare `f(a=1)`), or None."""
    if len(text) > MAX_CALL_CHARS:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for nodes, _ in enumerate(ast.walk(tree), start=1):
        if nodes > MAX_NODES:
            return None
    body = tree.body
    elements = body.elts if isinstance(body, (ast.List, ast.Tuple)) else [body]
    if not elements or not all(isinstance(e, ast.Call) for e in elements):
        return None
    try:
        calls = [_call(e) for e in elements]
    except (ValueError, RecursionError, MemoryError):
        return None
    return calls if all(call.name for call in calls) else None


def _call(node: ast.Call) -> Call:
    if any(k.arg is None for k in node.keywords):
        raise ValueError("**kwargs in a call")
    return Call(_dotted(node.func), {k.arg: _value(k.value) for k in node.keywords}, len(node.args))


def _dotted(node: ast.expr) -> str:
    """"a.b.c" for a name or attribute chain; "" for anything else (`f()(x)`, `x[0](y)`)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([node.id, *reversed(parts)])


def _value(node: ast.expr) -> Any:
    """A literal's value, walking the tree only: nothing is evaluated."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) \
            and isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("**mapping in a dict")
        items = [(_value(k), _value(v)) for k, v in zip(node.keys, node.values)]
        try:
            return dict(items)
        except TypeError:  # an unhashable key such as a list
            raise ValueError("unhashable dict key") from None
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call) and node.keywords and _dotted(node.func):
        call = _call(node)
        return {call.name: call.args}
    return ast.unparse(node)


def find_calls(text: str) -> list[Call] | None:
    """The calls a reply commits to, or None when it holds no readable call.

    Code fences are dropped; the reply is scanned for call lists and bare calls, outermost
    first. The last one found wins (a reply that explains and then answers ends with the
    answer); bare calls just before it, separated only by commas, semicolons or line breaks,
    are taken with it (`f(a=1)\\ng(b=2)` is two calls)."""
    if not text or len(text) > MAX_REPLY_CHARS or "(" not in text:
        return None
    text = FENCE.sub("", text)
    found: list[tuple[int, int, list[Call], bool]] = []  # (start, end, calls, bracketed)
    resume, tried = 0, 0
    for match in CALL_START.finditer(text):
        start = match.start()
        if start < resume:
            continue  # inside a span already read
        if DEFINITION.search(text, max(0, start - 12), start):
            continue  # `def f(a=1):` defines a function, it calls nothing
        if tried == MAX_CANDIDATES:
            break
        tried += 1
        end = _closing(text, start)
        if end is None:
            continue
        calls = parse_calls(text[start:end])
        if calls is not None:
            found.append((start, end, calls, text[start] == "["))
            resume = end
    if not found:
        return None
    start, _, calls, bracketed = found[-1]
    if bracketed:
        return calls
    group = list(calls)
    for earlier_start, earlier_end, earlier, earlier_bracketed in reversed(found[:-1]):
        if earlier_bracketed or SEPARATOR.fullmatch(text[earlier_end:start]) is None:
            break
        group[:0] = earlier
        start = earlier_start
    return group


def _closing(text: str, start: int) -> int | None:
    """The index just after the bracket that closes the first opening bracket at or after
    `start`, skipping string literals; None if it is not closed within MAX_CALL_CHARS."""
    depth, i, limit = 0, start, min(len(text), start + MAX_CALL_CHARS)
    while i < limit:
        ch = text[i]
        if ch in OPENERS:
            depth += 1
        elif ch in CLOSERS:
            depth -= 1
            if depth == 0:
                return i + 1
            if depth < 0:
                return None
        elif ch in "'\"" and depth:
            i = _string_end(text, i, limit)
            if i is None:
                return None
            continue
        i += 1
    return None


def _string_end(text: str, i: int, limit: int) -> int | None:
    """The index after the string literal opening at `i` (one line, backslash escapes)."""
    quote, j = text[i], i + 1
    while j < limit:
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == quote:
            return j + 1
        if ch == "\n":
            return None
        j += 1
    return None


# ---------------------------------------------------------------------------- writing calls

def literal(value: Any) -> str:
    """A value as Python source: strings in double quotes, lists, dicts, True/False/None."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid Python string literal
    if isinstance(value, (list, tuple)):
        inner = ", ".join(literal(v) for v in value)
        return f"({inner}{',' if len(value) == 1 else ''})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def format_calls(calls: list[Call]) -> str:
    """`[f(a=1, b="x"), g()]`: the form replies are asked to use."""
    return "[" + ", ".join(f"{c.name}(" + ", ".join(f"{k}={literal(v)}" for k, v in c.args.items()) + ")"
                           for c in calls) + "]"


def reference_calls(reference: list[dict]) -> list[Call]:
    """One correct call per reference entry: each parameter with its first accepted value;
    parameters whose only accepted value is "" (leave it out) are left out."""
    calls = []
    for entry in reference:
        (name, params), = entry.items()
        args = {}
        for param, accepted in params.items():
            given = [v for v in accepted if v != ""]
            if given:
                args[param] = given[0]
        calls.append(Call(name, args))
    return calls


# ---------------------------------------------------------------------------- BFCL's AST match

PYTHON_TYPES = {"string": str, "integer": int, "float": float, "number": float, "boolean": bool,
                "array": list, "tuple": list, "dict": dict, "object": dict, "any": str}
STANDARDIZE = re.compile(r"[ ,./\-_*^]")


def standardize(text: str) -> str:
    """BFCL's string normalisation: no spaces or `,./-_*^`, lower case, ' read as \"."""
    return STANDARDIZE.sub("", text).lower().replace("'", '"')


def check_calls(calls: list[Call], functions: list[dict], reference: list[dict]) -> str | None:
    """None when `calls` match the reference (BFCL's AST match), else the reason they do not."""
    if len(calls) != len(reference):
        return f"expected {len(reference)} call(s), got {len(calls)}"
    schemas = {f.get("name"): f for f in functions}
    fits: list[list[int]] = []
    reasons: list[str] = []
    for entry in reference:
        (name, accepted), = entry.items()
        schema = schemas.get(name)
        if schema is None:
            return f"the reference calls {name!r}, which no function describes"
        checked = [check_call(call, schema, accepted) for call in calls]
        fits.append([k for k, reason in enumerate(checked) if reason is None])
        if not fits[-1]:
            reasons.append(next((r for r in checked if not r.startswith("wrong function")), checked[0]))
    if reasons:
        return reasons[0]
    if not _perfect_matching(fits, len(calls)):
        return "the calls do not match the reference calls one to one"
    return None


def _perfect_matching(fits: list[list[int]], n: int) -> bool:
    """Whether every reference call gets its own fitting call (Kuhn's augmenting paths)."""
    owner: list[int | None] = [None] * n

    def place(ref: int, seen: set[int]) -> bool:
        for k in fits[ref]:
            if k not in seen:
                seen.add(k)
                if owner[k] is None or place(owner[k], seen):
                    owner[k] = ref
                    return True
        return False

    return all(place(ref, set()) for ref in range(len(fits)))


def check_call(call: Call, schema: dict, accepted: dict[str, list]) -> str | None:
    """None when one call matches one reference call of function `schema`, else why not."""
    if call.name != schema["name"]:
        return f"wrong function {call.name!r}, expected {schema['name']!r}"
    if call.positional:
        return "positional arguments are not accepted; name every parameter"
    parameters = schema.get("parameters") or {}
    properties = parameters.get("properties") or {}
    for param in parameters.get("required") or ():
        if param not in call.args:
            return f"missing required parameter {param!r}"
    for param, value in call.args.items():
        if param not in properties or param not in accepted:
            return f"unexpected parameter {param!r}"
        reason = _check_value(param, value, properties[param], accepted[param])
        if reason:
            return reason
    for param, values in accepted.items():
        if param not in call.args and "" not in values:
            return f"parameter {param!r} must be given"
    return None


def _first_type(values: list) -> type | None:
    return next((type(v) for v in values if v != ""), None)


def _check_value(param: str, value: Any, prop: dict, accepted: list) -> str | None:
    kind = prop.get("type", "any")
    expected = PYTHON_TYPES.get(kind)
    if expected is None:  # a type BFCL's Python rules do not know: compare values only
        return None if value in accepted else f"{param}={value!r} is not among {accepted!r}"
    if kind == "tuple" and type(value) is tuple:
        value = list(value)
    if expected is float and type(value) is int:
        value = float(value)
    # A value of the reference's own type where the schema says otherwise is BFCL's "variable"
    # case (e.g. a name written where a dict is expected): compared as a plain value.
    as_variable = _first_type(accepted) not in (None, expected)
    if type(value) is not expected:
        if _first_type(accepted) is not None and type(value) is _first_type(accepted):
            return None if value in accepted else f"{param}={value!r} is not among {accepted!r}"
        return f"{param}: expected {kind}, got {type(value).__name__}"
    if expected is list and not _items_typed(value, prop, accepted):
        return f"{param}: an item is not of type {prop.get('items', {}).get('type')}"
    if as_variable:
        return None if value in accepted else f"{param}={value!r} is not among {accepted!r}"
    if expected is dict:
        ok = any(_dict_fits(value, option) for option in accepted if isinstance(option, dict))
    elif expected is list and (prop.get("items") or {}).get("type") in ("dict", "object"):
        ok = any(isinstance(option, list) and len(option) == len(value)
                 and all(isinstance(o, dict) and _dict_fits(v, o) for v, o in zip(value, option))
                 for option in accepted)
    elif expected is str:
        ok = standardize(value) in [standardize(o) for o in accepted if isinstance(o, str)]
    elif expected is list:
        ok = _standardized(value) in [_standardized(o) for o in accepted if isinstance(o, list)]
    else:
        ok = value in accepted
    return None if ok else f"{param}={value!r} is not among {accepted!r}"


def _items_typed(value: list, prop: dict, accepted: list) -> bool:
    """BFCL's one-level check that a list's items have the schema's item type (or the type of
    one accepted list's items)."""
    item_type = PYTHON_TYPES.get((prop.get("items") or {}).get("type", ""))
    if item_type is None:
        return True
    if not all(isinstance(o, list) for o in accepted):  # BFCL passes any non-list option ("")
        return True
    return any(all(type(v) is item_type or type(v) is _first_type(option) for v in value) for option in accepted)


def _standardized(items: list) -> list:
    return [standardize(v) if isinstance(v, str) else v for v in items]


def _dict_fits(value: dict, option: dict) -> bool:
    """BFCL's dict rule: every given key is expected with an accepted value; every expected key
    is given unless "" is among its accepted values."""
    for key, item in value.items():
        if key not in option:
            return False
        accepted = [standardize(o) if isinstance(o, str) else o for o in option[key]]
        if (standardize(item) if isinstance(item, str) else item) not in accepted:
            return False
    return all(key in value or "" in values for key, values in option.items())
