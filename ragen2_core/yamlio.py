"""Reading the YAML files people write (training configs, sweep specs): safe_load rules plus a size
cap, a UTF-8 check, an alias-bomb guard and a rule for empty files; each failure is a YamlInputError
whose message names the file, what is wrong and the fix.

    from ragen2_core.yamlio import YamlInputError, read_yaml_file, parse_yaml
    data, text = read_yaml_file("sweeps/base/frozenlake_tiny.yaml", what="config")
    value = parse_yaml("[1, 2]", where="override rollout.group_size")
"""
from __future__ import annotations

from pathlib import Path

import yaml

MAX_BYTES = 1 << 20        # a config or spec is a few KiB; 1 MiB is far past any real one
MAX_NODES = 100_000        # scalars + collections after expanding aliases (an alias bomb is billions)


class YamlInputError(ValueError):
    """The file or text cannot be read as the YAML a person wrote; the message says why and the fix."""


def read_yaml_file(path: str | Path, what: str = "YAML file"):
    """(data, text) of a UTF-8 YAML file of at most MAX_BYTES. An empty file (nothing but blanks or
    comments) is an error: it is more often a wrong path than a wish for all defaults."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise YamlInputError(f"{path}: {size} bytes is over the {MAX_BYTES}-byte limit for a {what}; "
                             "is this the right file?")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise YamlInputError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                             f"save the {what} as UTF-8") from None
    data = parse_yaml(text, where=str(path))
    if data is None:
        raise YamlInputError(f"{path}: the {what} is empty (no settings); write the settings into it, or "
                             f"check the path")
    return data, text


def parse_yaml(text: str, where: str):
    """yaml.safe_load of ``text``, refusing documents whose aliases expand past MAX_NODES (checked on
    the node graph, before anything is expanded or printed)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            n = _expanded_size(node)
            if n > MAX_NODES:
                raise YamlInputError(f"{where}: its aliases (&anchor / *alias) expand to more than {MAX_NODES} "
                                     "values (an alias bomb?); write the values out or use fewer aliases")
        return loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        raise YamlInputError(f"{where}: invalid YAML: {e}") from None
    finally:
        loader.dispose()


def _expanded_size(root) -> int:
    """Node count with every alias expanded, computed over the shared graph (memoised, iterative)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # nodes whose children are still being sized: meeting one again is a cycle
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if done or not children:
            sizes[id(node)] = min(MAX_NODES + 1, 1 + sum(sizes.get(id(c), 0) for c in children))
            open_.discard(id(node))
            continue
        if id(node) in open_:
            return MAX_NODES + 1  # an alias to an enclosing node: an infinite value
        open_.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def key_lines(text: str) -> dict[tuple, int]:
    """(key, key, ...) -> 1-based line of that mapping key or list item, for error messages that
    point into the file; best effort (``yaml.compose`` builds nodes only, never objects)."""
    out: dict[tuple, int] = {}

    def walk(node, path):
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                p = path + (k.value,)
                out[p] = k.start_mark.line + 1
                walk(v, p)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                out[path + (i,)] = v.start_mark.line + 1
                walk(v, path + (i,))

    try:
        walk(yaml.compose(text), ())
    except yaml.YAMLError:
        pass
    return out
