"""A YAML schema from dataclasses: YAML is plain data, a dataclass per section is its schema, every
field carries a one-line help, optional choices and numeric bounds, and a load reports *all* problems
at once, each naming the field, the bad value and the fix. ragen2's run config (config.py) and sweep
specs (sweep/spec.py) are both built with it.

    @dataclasses.dataclass
    class Section:
        size: int = opt(8, "group size", ge=1)

    errors = []
    section = build_section(Section, {"size": 0}, "rollout", errors)   # errors: ["rollout.size: 0 is out of range; ..."]
    field_problem(Section, "sise")      # "unknown key 'sise' — did you mean 'size'?"
    describe(Section)                   # every key with type, default, help and bounds
"""
import copy
import dataclasses
import difflib
import json
import math
import operator
import re
import types
import typing
from typing import Any, Optional


class ConfigError(ValueError):
    """Every problem found in one load of a config or a sweep spec, one per line."""

    kind = "config"

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__(f"{len(self.errors)} {self.kind} error(s):\n" + "\n".join(f"  - {e}" for e in self.errors))

    def __reduce__(self):  # survive pickling (e.g. raised inside a Ray worker) with the list intact
        return type(self), (self.errors,)


def opt(default, help, *, choices=None, ge=None, gt=None, le=None, lt=None):
    """A dataclass field with help text and validation metadata.

    `default` may be a dataclass type (a nested section) or a list/dict; both become a
    `default_factory` so instances never share mutable state.
    """
    meta = {"help": help, "choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt}
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=meta)
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


_BAD = object()  # marks a value that failed validation (None is a legitimate value)
_OPS = {"ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<="), "lt": (operator.lt, "<")}
_FIX = {
    int: "write a whole number, e.g. 8",
    float: "write a number, e.g. 0.5",
    bool: "write true or false",
    str: "write a string; quote it if it looks like a number or bool, e.g. '1'",
    dict: "write a mapping, e.g. {doors: {min_path_len: 3}}",
}


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _optional_inner(tp):
    """X for Optional[X] (either spelling), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return None


def _type_name(tp) -> str:
    inner = _optional_inner(tp)
    if inner is not None:
        return f"Optional[{_type_name(inner)}]"
    if typing.get_origin(tp) is list:
        return f"list[{_type_name(typing.get_args(tp)[0])}]"
    return tp.__name__


def _unknown(dotted: str, names: list[str], prefix: str) -> str:
    match = difflib.get_close_matches(dotted.rsplit(".", 1)[-1], names, n=1)
    if match:
        return f"unknown key '{dotted}' — did you mean '{_join(prefix, match[0])}'?"
    where = f" under '{prefix}'" if prefix else " at top level"
    return f"unknown key '{dotted}' — valid keys{where}: {', '.join(names)}"


_YAML11_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _scalar(value, tp, meta, path, errors):
    # bool subclasses int in Python, but `group_size: true` is always a mistake in a config.
    ok = isinstance(value, tp) and not (isinstance(value, bool) and tp is not bool)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True  # canonical float keeps dumps and hashes stable
    if tp is float and isinstance(value, str) and _YAML11_FLOAT.match(value):
        value, ok = float(value), True  # PyYAML reads `1e-3` (no dot) as a string: YAML 1.1 rules
    if ok and tp is float and not math.isfinite(value):  # .inf, .nan, 1e999 pass every range check
        errors.append(f"{path}: {value!r} is not a finite number; give a finite value")
        return _BAD
    if not ok:
        errors.append(f"{path}: expected {tp.__name__}, got {value!r} ({type(value).__name__}); {_FIX[tp]}")
        return _BAD
    choices = meta.get("choices")
    if choices and value not in choices:
        alts = "|".join(map(str, choices))
        hint = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        errors.append(f"{path}: {value!r} is not a valid choice; use one of {alts}"
                      + (f" (did you mean {hint[0]!r}?)" if hint else ""))
        return _BAD
    bounds = [(op, meta[op]) for op in _OPS if meta.get(op) is not None]
    if any(not _OPS[op][0](value, bound) for op, bound in bounds):
        need = " and ".join(f"{_OPS[op][1]} {bound}" for op, bound in bounds)
        errors.append(f"{path}: {value!r} is out of range; it must be {need}")
        return _BAD
    return value


def _convert(value, tp, meta, path, errors):
    """The validated value for annotation `tp`, or _BAD after recording why."""
    if dataclasses.is_dataclass(tp):
        return build_section(tp, value, path, errors)
    inner = _optional_inner(tp)
    if inner is not None:
        return None if value is None else _convert(value, inner, meta, path, errors)
    if value is None:
        errors.append(f"{path}: null is not allowed here; set a {_type_name(tp)} value")
        return _BAD
    if typing.get_origin(tp) is list:
        if not isinstance(value, (list, tuple)):
            errors.append(f"{path}: expected a list, got {value!r} ({type(value).__name__}); write it as [a, b]")
            return _BAD
        items = [_convert(v, typing.get_args(tp)[0], meta, f"{path}[{i}]", errors) for i, v in enumerate(value)]
        return _BAD if any(v is _BAD for v in items) else items
    return _scalar(value, tp, meta, path, errors)


def build_section(cls, data, path, errors):
    """Instantiate section `cls` from a mapping, appending every problem to `errors`."""
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        data = to_dict(data)
    if not isinstance(data, dict):
        errors.append(f"{path or 'config'}: expected a mapping of {cls.__name__} fields, got {data!r} "
                      f"({type(data).__name__}); write it as `{path or 'section'}: {{field: value}}`")
        return _BAD
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    n_before = len(errors)
    errors.extend(_unknown(_join(path, str(k)), list(fields), path) for k in data if k not in fields)
    values = {name: _convert(data[name], hints[name], f.metadata, _join(path, name), errors)
              for name, f in fields.items() if name in data}
    if len(errors) > n_before:
        return _BAD  # cross-field rules on half-valid sections only produce noise
    obj = cls(**values)
    if hasattr(obj, "check"):
        errors.extend(_join(path, msg) for msg in obj.check())
    return obj


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def field_problem(root, key: str) -> Optional[str]:
    """Why dotted `key` names no field of the dataclass `root`, or None when it does."""
    cls, parts = root, key.split(".")
    for i, part in enumerate(parts):
        if cls is dict:  # a free mapping (warmstart.env): its section's check() validates the keys
            return None
        if not dataclasses.is_dataclass(cls):
            return f"'{'.'.join(parts[:i])}' is a value, not a section; drop '.{'.'.join(parts[i:])}'"
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            return _unknown(".".join(parts[:i + 1]), names, ".".join(parts[:i]))
        cls = typing.get_type_hints(cls)[part]
    return None


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def flatten(cfg) -> dict[str, Any]:
    """{'env.frozenlake.size': 4, ...}; lists stay whole values."""
    out: dict[str, Any] = {}

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, _join(prefix, k))
            else:
                out[_join(prefix, k)] = v

    walk(to_dict(cfg), "")
    return out


def describe(cls) -> str:
    """Every dotted key of dataclass `cls` with type, default, help and constraints."""
    rows = []

    def walk(c, prefix):
        hints = typing.get_type_hints(c)
        for f in dataclasses.fields(c):
            key, tp, meta = _join(prefix, f.name), hints[f.name], f.metadata
            if dataclasses.is_dataclass(tp):
                rows.append((key, "section", "", meta.get("help", "")))
                walk(tp, key)
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            rules = [f"one of {'|'.join(map(str, meta['choices']))}"] if meta.get("choices") else []
            rules += [f"{_OPS[op][1]} {meta[op]}" for op in _OPS if meta.get(op) is not None]
            extra = f" [{', '.join(rules)}]" if rules else ""
            rows.append((key, _type_name(tp), json.dumps(default), meta.get("help", "") + extra))

    walk(cls, "")
    kw, tw, dw = (max(len(r[i]) for r in rows) for i in range(3))
    return "\n".join(f"{k:<{kw}}  {t:<{tw}}  {d:<{dw}}  {h}".rstrip() for k, t, d, h in rows)
