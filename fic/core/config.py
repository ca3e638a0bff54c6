"""Typed configuration: dataclasses loaded from YAML and overridden on the command line.

Every verb and recipe describes its settings as a dataclass whose fields are declared with
`setting(default, help, ...)`. `load_config` reads a YAML file, applies `key=value`
overrides (nested as `a.b=c`), and checks every value: unknown keys, wrong types and
out-of-range values are `FicError`s that name the file, the key and what was expected.

Every YAML FiC reads (config files, launch configs, eval recipes named as sources, command-line
values) goes through one bounded reader (`parse_yaml`): at most `MAX_YAML_BYTES`, nested at most
`MAX_YAML_DEPTH` levels, at most `MAX_YAML_VALUES` values once every alias is expanded (an alias
bomb is refused before it is built), no alias to a node that contains it; each is a one-line
`FicError`, and no `RecursionError` escapes a config's reading or checking.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Sequence

import yaml

from fic.core.bounds import bounds_text, check_bounds
from fic.core.errors import FicError
from fic.core.records import read_data_text

_MISSING = dataclasses.MISSING
MAX_YAML_BYTES = 256 << 10  # a recipe is a few kilobytes; PyYAML reads about 0.5 MB a second
MAX_YAML_DEPTH = 64         # nested mappings and lists
MAX_YAML_VALUES = 100_000   # values (scalars, mappings, lists) with every alias expanded


def setting(default: Any = _MISSING, help: str = "", *, choices: Sequence[Any] | None = None,
            min: float | None = None, max: float | None = None, unbounded: str | None = None,
            factory: Any = _MISSING) -> Any:
    """Declare a config field with its help text and optional allowed values or range. Fields
    are also held to the physical bounds their name implies (`fic.core.bounds.PHYSICAL_BOUNDS`).
    A number that sizes an allocation, a loop or a retry count declares its `max`; one that sizes
    nothing says so in `unbounded` ("a learning rate"), shown by `--keys`, instead."""
    if unbounded and max is not None:
        raise ValueError("a setting is bounded (max) or declared unbounded, not both")
    metadata = {"help": help, "choices": tuple(choices) if choices else None, "min": min, "max": max,
                "unbounded": unbounded}
    if factory is not _MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=metadata)
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        value = default
        return dataclasses.field(default_factory=lambda: dataclasses.replace(value), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(tp))
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return f"a list of {_type_name(args[0])}" if args else "a list"
    if origin is dict:
        args = typing.get_args(tp)
        return f"a mapping of {_type_name(args[1])}" if args and args[1] is not Any else "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping (or the path of a YAML file holding it)"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


class _CliValue:
    """A command-line value: kept raw for string fields (`name=007` stays "007"), YAML-parsed otherwise."""

    def __init__(self, raw: str, parsed: Any):
        self.raw, self.parsed = raw, parsed

    def __repr__(self) -> str:
        return repr(self.raw)


def _accepts_str(tp: Any) -> bool:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(_accepts_str(arg) for arg in typing.get_args(tp))
    return tp is str


def _accepts_list(tp: Any) -> bool:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(_accepts_list(arg) for arg in typing.get_args(tp))
    return typing.get_origin(tp) in (list, tuple)


def _convert(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check `value` against the annotation `tp`; return the converted value or raise FicError."""
    if isinstance(value, _CliValue):
        # `key=[a, b]` is a list wherever a list is allowed (`data.task=[math, code]`); other text
        # stays raw for string fields (`name=007` is "007", not 7).
        if isinstance(value.parsed, list) and _accepts_list(tp):
            value = value.parsed
        else:
            value = value.raw if _accepts_str(tp) and value.parsed is not None else value.parsed
    def bad() -> FicError:  # reprlib: a value of megabytes, or nested deeply, is shown cut short
        return FicError(f"expected {_type_name(tp)}, got {reprlib.repr(value)}", path=source, field=key)

    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise bad()
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, key, source)
            except FicError as err:
                errors.append(err)
        # A number that is no finite number says so, not "expected a number or null".
        raise next((err for err in errors if err.message.startswith("expected a finite")), None) or bad()
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad()
        return _build(tp, value, source, prefix=key + ".")
    if origin in (list, tuple):
        (item_type,) = typing.get_args(tp)[:1] or (Any,)
        if isinstance(value, str) and item_type is str:
            value = [value]  # one item needs no brackets: `data.source=jsonl:x`, `source: gsm8k`
        if not isinstance(value, (list, tuple)):
            raise bad()
        return [_convert(item, item_type, f"{key}[{i}]", source) for i, item in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise bad()
        value_type = (typing.get_args(tp) or (Any, Any))[1]
        if value_type is Any:
            return dict(value)
        # `data.fields.question=problem` arrives as a mapping of command-line values: check each. A
        # dotted key (`data.fields.metadata.func_name=x`) arrives nested: it stays one dotted key.
        if typing.get_origin(value_type) is not dict and value_type is not dict:
            value = flatten(value)
        return {str(k): _convert(v, value_type, f"{key}.{k}", source) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad()
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer too large for a float
                raise FicError(f"expected a finite number, got an integer of {len(str(value))} digits",
                               path=source, field=key) from None
        elif isinstance(value, str):  # YAML 1.1 reads `1e-4` (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise bad()
        # NaN passes every range check (every comparison is false) and inf trains to NaN weights:
        # no setting means either.
        if not math.isfinite(number):
            raise FicError(f"expected a finite number, got {value!r}", path=source, field=key)
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad()
    raise bad()


def _declared(section: Any) -> dict:
    """The keys whose value in `section` differs from its class's own defaults, nested."""
    plain = type(section)()
    found = {}
    for f in dataclasses.fields(section):
        mine, theirs = getattr(section, f.name), getattr(plain, f.name)
        if dataclasses.is_dataclass(mine):
            nested = _declared(mine)
            if nested:
                found[f.name] = nested
        elif mine != theirs:
            found[f.name] = mine
    return found


def _merge(base: dict, given: dict) -> dict:
    merged = dict(base)
    for key, value in given.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


class _SectionFile(dict):
    """A config section read from a YAML file of its own (`data: data/my-bench.yaml`): its keys are
    checked against that file, and keys it does not give take the section class's own defaults,
    not those the parent config declares (a file names the whole section)."""

    def __init__(self, data: dict, path: str):
        super().__init__(data)
        self.path = path


def _is_section_file(value: Any) -> bool:
    text = value.raw if isinstance(value, _CliValue) else value
    return isinstance(text, str) and text.strip().endswith((".yaml", ".yml"))


def _inline_section_files(cls: type, data: dict, where: dict[str, str], prefix: str = "") -> None:
    """Replace, in place, every section of `data` given as the path of a YAML file by the file's
    mapping (a `_SectionFile`), recording in `where` that its keys were set in that file."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in data or not dataclasses.is_dataclass(hints[f.name]):
            continue
        value = data[f.name]
        if _is_section_file(value):
            path = (value.raw if isinstance(value, _CliValue) else value).strip()
            value = data[f.name] = _SectionFile(read_yaml(path), path)
            where.pop(f"{prefix}{f.name}", None)  # what the file leaves out keeps its default
            for key in flatten(dict(value)):
                where[f"{prefix}{f.name}.{key}"] = path
        if isinstance(value, dict):
            _inline_section_files(hints[f.name], value, where, f"{prefix}{f.name}.")


def _build(cls: type, data: dict, source: str, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:  # a class may say where an old key went (`moved`: (old key, message) or None)
        moved = getattr(cls, "moved", lambda data, unknown: None)(data, unknown)
        raise FicError(moved[1] if moved else f"unknown key; expected one of: {', '.join(sorted(fields))}",
                       path=source, field=prefix + (moved[0] if moved else unknown[0]))
    kwargs = {}
    for name, value in data.items():
        key = prefix + name
        f = fields[name]
        where = source
        if isinstance(value, _SectionFile):  # checked as that file's settings
            where = value.path if not getattr(value, "overridden", False) else \
                f"{value.path} (with command-line overrides)"
        elif isinstance(value, dict) and dataclasses.is_dataclass(hints[name]) and f.default_factory is not _MISSING:
            # A section's unnamed keys keep the default its parent declares (VASD's `data` source),
            # not the section class's own: `data.limit=5` must not reset `data.source`.
            value = _merge(_declared(f.default_factory()), value)
        converted = _convert(value, hints[name], key, where)
        check_bounds(converted, name, dict(fields[name].metadata), key, where)
        kwargs[name] = converted
    for name, f in fields.items():
        if name not in kwargs and f.default is _MISSING and f.default_factory is _MISSING:
            raise FicError("missing required key", path=source, field=prefix + name)
    config = cls(**kwargs)
    check = getattr(config, "check", None)
    if callable(check):
        try:
            check(source)
        except FicError as err:  # a nested section's check names its field from its own root
            if prefix and err.field is not None and not err.field.startswith(prefix):
                err.field = prefix + err.field
            raise
    return config


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise FicError(f"expected key=value, got {text!r}", path="command line")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise FicError(f"expected key=value with a dotted key, got {text!r}", path="command line")
    return key.split("."), _CliValue(raw, yaml_value(raw, key))


def yaml_value(raw: str, field: str) -> Any:
    """A command-line value read as YAML (`[a, b]`, `3`, `null`), or the text itself where it is
    no YAML; bounded as every YAML FiC reads (`parse_yaml`)."""
    if not raw.strip():
        return ""
    try:
        return parse_yaml(raw, "command line", field=field)
    except yaml.YAMLError:
        return raw


def parse_yaml(text: str, source: str, *, field: str | None = None) -> Any:
    """YAML `text` read with the strict loader (a key given twice is an error), after checking
    its size, depth and expanded size (see the module's note); a bound crossed is a `FicError`
    naming `source` (and `field`). Invalid YAML raises PyYAML's error for the caller to word."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise FicError(f"is {size >> 10} KiB of YAML, more than the {MAX_YAML_BYTES >> 10} KiB FiC reads",
                       path=source, field=field)
    _check_yaml_shape(text, source, field)
    try:
        value = yaml.load(text, Loader=_StrictLoader)
    except RecursionError:  # not reached within MAX_YAML_DEPTH; a last guard all the same
        raise FicError("YAML nested too deeply to read", path=source, field=field) from None
    check_string_keys(value, source, field)
    return value


def check_string_keys(value: Any, source: str, field: str | None = None) -> None:
    """A `FicError` naming the path of the first key, at any depth, that is not a string: YAML reads
    `1:` as an integer and `yes:` as true, and no setting or record field is named so."""
    stack = [(value, field or "")]
    while stack:  # no recursion: the depth is bounded by MAX_YAML_DEPTH, the size by MAX_YAML_VALUES
        node, where = stack.pop()
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    what = (f"{str(key).lower()} (YAML reads yes, no, on and off as true or false)"
                            if isinstance(key, bool) else "null" if key is None else
                            f"{_type_name(type(key))} ({reprlib.repr(key)})")
                    name = "null" if key is None else str(key).lower() if isinstance(key, bool) else str(key)
                    raise FicError(f"keys must be strings; got {what}: quote the key", path=source,
                                   field=f"{where}.{name}" if where else name)
                stack.append((child, f"{where}.{key}" if where else key))
        elif isinstance(node, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(node))


def _check_yaml_shape(text: str, source: str, field: str | None) -> None:
    """Walk PyYAML's events (a flat stream, no recursion): refuse nesting past MAX_YAML_DEPTH,
    more than MAX_YAML_VALUES values with aliases expanded, and an alias inside its own anchor."""
    sizes: dict[str, int] = {}  # anchor -> values it expands to
    stack: list[list] = [[None, 0]]  # open collections: [anchor, values so far]

    def refuse(what: str, event: Any) -> FicError:
        return FicError(f"{what} (line {event.start_mark.line + 1})", path=source, field=field)

    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(stack) > MAX_YAML_DEPTH:
                    raise refuse(f"YAML nested more than {MAX_YAML_DEPTH} levels deep", event)
                stack.append([event.anchor, 1])
                continue
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                anchor, count = stack.pop()
                if anchor is not None:
                    sizes[anchor] = count
            elif isinstance(event, yaml.ScalarEvent):
                count = 1
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor not in sizes:
                    raise refuse(f"the alias *{event.anchor} refers to a value that contains it", event)
                count = sizes[event.anchor]
            else:
                continue
            stack[-1][1] += count
            if stack[-1][1] > MAX_YAML_VALUES:
                raise refuse(f"YAML that expands to more than {MAX_YAML_VALUES:,} values (aliases)", event)
    except yaml.YAMLError:
        return  # invalid YAML: the loader reports it, with its line


def _set_nested(data: dict, keys: list[str], value: Any) -> None:
    node = data
    for part in keys[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise FicError("cannot set a sub-key of a value that is not a mapping",
                           path="command line", field=".".join(keys))
        node = child
    node[keys[-1]] = value


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first_line: int, line: int):
        super().__init__(f"key {key!r} is given twice (lines {first_line} and {line}); keep one")


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: PyYAML
    keeps the last silently, so a recipe edited by appending a line would not do what it says."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults` may be overridden key by key: that is what merges are for
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(key, seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict:
    """A YAML file of settings (a mapping), read through the guards of `read_data_text` and
    `parse_yaml`: every way it can be wrong is one `FicError` naming it."""
    path = Path(path)
    if not path.exists():
        raise FicError("config file not found", path=str(path))
    text = read_data_text(path, "a YAML file", limit=MAX_YAML_BYTES)
    try:
        data = parse_yaml(text, str(path))
    except _DuplicateKey as err:
        raise FicError(str(err), path=str(path)) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise FicError(f"not valid YAML{where}", path=str(path)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FicError(f"expected a mapping of settings at the top level, got {type(data).__name__}",
                       path=str(path))
    return data


def from_mapping(cls: type, data: dict, source: str, prefix: str = "") -> Any:
    """Build `cls` from a mapping already read (a section of another config file), checked as
    `load_config` checks; errors name `prefix` + the key."""
    return _checked_build(cls, data, source, prefix)


def _checked_build(cls: type, data: dict, source: str, prefix: str = "") -> Any:
    """`_build`, where a value nested too deeply for Python (a mapping read from JSON) is one line."""
    try:
        return _build(cls, data, source, prefix)
    except RecursionError:
        raise FicError("a value is nested too deeply to check", path=source) from None


def load_config(cls: type, path: str | Path | None = None, overrides: Sequence[str] = ()) -> Any:
    """Build `cls` from an optional YAML file and `key=value` overrides, checking every value.

    A section may be given as the path of a YAML file that holds it (`data: data/my-bench.yaml`,
    or `data=data/my-bench.yaml` on the command line): one dataset and its mapping named once,
    read by every verb. The config returned remembers where each key was set (`set_in`)."""
    data = read_yaml(path) if path is not None else {}
    source = str(path) if path is not None else "command line"
    where = {key: source for key in flatten(data)} if path is not None else {}
    _inline_section_files(cls, data, where)
    for text in overrides:
        keys, value = _parse_override(text)
        _set_nested(data, keys, value)
        node = data
        for part in keys[:-1]:  # a section file changed on the command line says so in its errors
            node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, _SectionFile):
                node.overridden = True
        dotted = ".".join(keys)
        for key in [k for k in where if k == dotted or k.startswith(dotted + ".")]:
            del where[key]
        where[dotted] = "command line"
        _inline_section_files(cls, data, where)
    if overrides:
        source = f"{source} (with command-line overrides)" if path is not None else source
    config = _checked_build(cls, data, source)
    object.__setattr__(config, "_fic_set_in", where)
    return config


def set_where(where: str) -> str:
    """`set_in`'s answer in words: "set in FILE" or "set on the command line"."""
    return "set on the command line" if where == "command line" else f"set in {where}"


def set_in(config: Any, key: str) -> str | None:
    """Where the dotted `key` of a config built by `load_config` was set: its YAML file's path,
    a section file's, "command line", or None where it keeps its default."""
    where = getattr(config, "_fic_set_in", {})
    if key in where:
        return where[key]
    # a whole mapping given at once (`data.fields.question=problem` sets one key of `data.fields`)
    return next((where[k] for k in where if key.startswith(k + ".")), None)


KEYS_HELP = ("list every config key with its default and help and exit; with --config (and key=value), also the "
             "value this run would use and where it was set")
DRY_RUN_HELP = "print the resolved config and the start line (what the run would read, do and write), then exit " \
    "without loading a model"


def add_config_arguments(parser: Any, *, example: str, overrides_help: str) -> None:
    """A config verb's arguments: `--config FILE`, `key=value` overrides, `--keys` and `--dry-run`."""
    parser.add_argument("--config", default=None, help=f"recipe YAML, e.g. {example}")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=overrides_help)
    parser.add_argument("--keys", action="store_true", help=KEYS_HELP)
    parser.add_argument("--dry-run", action="store_true", help=DRY_RUN_HELP)


def print_keys(args: Any, cls: type, run: Any = None) -> bool:
    """With `--keys`, print every key of `cls` with its default and help, and, given a config
    (`run`, or `--config`/key=value in `args`), the value the run would use (the verb stops there)."""
    if not getattr(args, "keys", False):
        return False
    if run is None and (getattr(args, "config", None) or getattr(args, "overrides", None)):
        run = load_config(cls, args.config, args.overrides)
    print(describe(cls, run=run))
    return True


def resolved_yaml(config: Any) -> str:
    """The config as YAML, every key with the value the run uses (`--dry-run`, config.yaml)."""
    return yaml.safe_dump(config_to_dict(config), sort_keys=False)


def with_overrides(config: Any, overrides: Sequence[str], source: str) -> Any:
    """A copy of `config` with `key=value` overrides applied and every value checked again."""
    data = config_to_dict(config)
    for text in overrides:
        keys, value = _parse_override(text)
        _set_nested(data, keys, value)
    return _checked_build(type(config), data, source)


def load_cli_config(cls: type, config: str | None, overrides: Sequence[str]) -> Any:
    """`load_config` for a verb that has no usable defaults: it needs a file or some settings."""
    if config is None and not overrides:
        raise FicError("give --config FILE (and/or key=value settings); --keys lists the settings",
                       field="--config")
    return load_config(cls, config, overrides)


def config_to_dict(config: Any) -> dict:
    """The plain-dict form of a config, for saving next to outputs (model cards, runs)."""
    return dataclasses.asdict(config)


def flatten(tree: Any, prefix: str = "") -> dict:
    """A nested dict as one level of dotted keys (`{"a": {"b": 1}}` -> `{"a.b": 1}`), for
    comparing two configs key by key."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    flat: dict = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}{key}."))
    return flat


def differences(old: dict, new: dict, limit: int = 4) -> str:
    """What differs between two (nested) settings, key by key: `a.b: 1 -> 2; c: 'x' -> None`
    (the first `limit` keys), for an error that refuses to mix two runs' outputs."""
    before, after = flatten(old), flatten(new)
    keys = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return "; ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in keys[:limit])


def describe(cls: type, prefix: str = "", *, run: Any = None, defaults: Any = None, root: Any = None) -> str:
    """A help listing of every key of a config class: name, type, default and help text. A nested
    section's defaults are those its parent declares (sft-data's `data.limit` is 1000, not the
    section class's null). With `run` (a config built by `load_config`), each key also shows the
    value that run will use and where it was set (`root`: the config `run` is a section of)."""
    lines = []
    hints = typing.get_type_hints(cls)
    root = run if root is None else root
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        tp = hints[f.name]
        if defaults is not None:
            default: Any = getattr(defaults, f.name)
        elif f.default is not _MISSING:
            default = f.default
        elif f.default_factory is not _MISSING:
            default = f.default_factory()
        else:
            default = _MISSING
        if dataclasses.is_dataclass(tp):
            lines.append(f"{key}:  {f.metadata.get('help', '')}")
            lines.append(describe(tp, key + ".", run=None if run is None else getattr(run, f.name),
                                  defaults=None if default is _MISSING else default, root=root))
            continue
        shown = "(required)" if default is _MISSING else repr(default)
        bounds = bounds_text(f.name, dict(f.metadata)) if tp is not bool else ""
        if bounds:
            shown += f", {bounds}"
        extra = ""
        if f.metadata.get("choices"):
            extra = f" one of {', '.join(map(str, f.metadata['choices']))}."
        this_run = ""
        if run is not None:
            where = set_in(root, key)
            this_run = f"; this run: {getattr(run, f.name)!r}" + (f", {set_where(where)}" if where else "")
        lines.append(f"{key} ({_type_name(tp)}, default {shown}{this_run}): {f.metadata.get('help', '')}{extra}")
    return "\n".join(line for line in lines if line)
