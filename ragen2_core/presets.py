"""Named whole-section presets: `filter: paper` in a config file, `--set filter=nofilter` on the command
line, `arms: {nofilter: nofilter}` in a sweep spec. Every reader of a preset goes through this module.

    from ragen2_core import presets

    presets.expand({"filter": "paper", "algo": {...}})   # in place -> [] or the problems found
    presets.problem("papr")                               # -> "unknown preset 'papr'; use one of ... (did you mean 'paper'?)"
    presets.sections_first([("filter", "paper"), ("filter.value", 0.5)])   # presets before the keys refining them

A preset stands for the whole section, so later files and dotted overrides refine it field by field.
"""
from __future__ import annotations

import difflib

FILTER = {
    # The release's reward-variance filter: the top 90 % of groups by spread, softmax-weighted.
    "paper": {"strategy": "top_p", "value": 0.9, "mode": "softmax", "include_zero": True},
    # top_p 1.0 keeps every group: no filtering, with the filter's metrics still logged.
    "nofilter": {"strategy": "top_p", "value": 1.0, "include_zero": True},
}
SECTIONS = {"filter": FILTER}
NAMES = "|".join(FILTER)


def problem(name, section: str = "filter") -> str | None:
    """Why `name` is not a preset of `section` (None when it is one), with the closest name as a hint."""
    table = SECTIONS[section]
    if name in table:
        return None
    hint = difflib.get_close_matches(str(name), list(table), n=1)
    return f"unknown preset {name!r}; use one of {'|'.join(table)}" + (f" (did you mean {hint[0]!r}?)" if hint else "")


def expand(data: dict) -> list[str]:
    """Replace each section given as a preset name by a copy of the preset's fields, in place."""
    errors = []
    for section, table in SECTIONS.items():
        name = data.get(section)
        if not isinstance(name, str):
            continue
        if name in table:
            data[section] = dict(table[name])
        else:
            errors.append(f"{section}: {problem(name, section)} or a mapping of {section} fields")
    return errors


def sections_first(pairs: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """Whole-section values (presets) before dotted keys, each in its own order: a dotted key refines
    the section whatever order a spec lists them in."""
    return [kv for kv in pairs if "." not in kv[0]] + [kv for kv in pairs if "." in kv[0]]


def uses(params: dict, section: str, name: str, parse=lambda v: v) -> bool:
    """Whether flat `section.field -> value` params (e.g. an MLflow run's) match preset `name` on every field."""
    fields = SECTIONS[section][name]
    return all(f"{section}.{k}" in params and parse(params[f"{section}.{k}"]) == v for k, v in fields.items())
