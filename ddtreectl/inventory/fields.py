"""Typed field converters over YAML nodes: each reports its own problem with the node's line.

A converter takes (node, key path, problems) and returns the Python value, or INVALID after
reporting why. The loader's schema is a table of these, so every key is checked the same way.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from yaml.nodes import Node, ScalarNode, SequenceNode

from ddtreectl.inventory.models import did_you_mean
from ddtreectl.inventory.yamltree import Problems, construct, describe, join, kind, mapping

INVALID: Any = object()

Check = Callable[[str], "str | None"]
Converter = Callable[[Node, str, Problems], Any]

# Scalars whose plain text is used as a string: YAML may resolve `1000` or `2.0` to numbers,
# but a user name or an environment value is what was written.
_TEXTUAL = ("str", "int", "float")


def _scalar_text(node: Node, path: str, problems: Problems, what: str) -> str | None:
    if isinstance(node, ScalarNode) and kind(node) in _TEXTUAL:
        return str(node.value)
    got = describe(node)
    hint = "quote the value" if isinstance(node, ScalarNode) and kind(node) == "bool" else None
    problems.add(node, path, f"expected {what}, got {got}", hint)
    return None


def text(check: Check | None = None, *, what: str = "a string", hint: str | None = None) -> Converter:
    def convert(node: Node, path: str, problems: Problems) -> Any:
        value = _scalar_text(node, path, problems, what)
        if value is None:
            return INVALID
        if value == "":
            problems.add(node, path, "must not be empty", hint)
            return INVALID
        problem = check(value) if check else None
        if problem:
            problems.add(node, path, f"{value!r} {problem}", hint)
            return INVALID
        return value

    return convert


def integer(low: int, high: int | None = None, *, hint: str | None = None) -> Converter:
    if hint is None:
        hint = f"use a whole number from {low} to {high}" if high is not None else f"use a whole number >= {low}"

    def convert(node: Node, path: str, problems: Problems) -> Any:
        if not isinstance(node, ScalarNode) or kind(node) != "int":
            shown = f" ({node.value!r})" if isinstance(node, ScalarNode) and node.value else ""
            problems.add(node, path, f"expected an integer, got {describe(node)}{shown}", hint)
            return INVALID
        value = int(construct(node))
        if value < low or (high is not None and value > high):
            bounds = f"out of range {low}..{high}" if high is not None else f"less than {low}"
            problems.add(node, path, f"{value} is {bounds}", hint)
            return INVALID
        return value

    return convert


_SECONDS_HINT = "use a positive number of seconds, e.g. 30 or 2.5"


def seconds() -> Converter:
    """A positive duration in seconds (integer or decimal)."""

    def convert(node: Node, path: str, problems: Problems) -> Any:
        if not isinstance(node, ScalarNode) or kind(node) not in ("int", "float"):
            problems.add(node, path, f"expected a number of seconds, got {describe(node)}", _SECONDS_HINT)
            return INVALID
        value = float(construct(node))
        if not value > 0 or value == float("inf"):
            problems.add(node, path, f"{node.value} must be a positive number of seconds", _SECONDS_HINT)
            return INVALID
        return value

    return convert


def flag() -> Converter:
    """true or false (YAML booleans only: a quoted "false" is a string, and refused)."""

    def convert(node: Node, path: str, problems: Problems) -> Any:
        if not isinstance(node, ScalarNode) or kind(node) != "bool":
            problems.add(node, path, f"expected true or false, got {describe(node)}", "use true or false")
            return INVALID
        return bool(construct(node))

    return convert


def choice(options: Iterable[str]) -> Converter:
    allowed = tuple(options)
    hint = "use one of: " + ", ".join(allowed)

    def convert(node: Node, path: str, problems: Problems) -> Any:
        value = _scalar_text(node, path, problems, "one of " + ", ".join(allowed))
        if value is None:
            return INVALID
        if value not in allowed:
            problems.add(node, path, f"{value!r} is not one of: {', '.join(allowed)}{did_you_mean(value, allowed)}",
                         hint)
            return INVALID
        return value

    return convert


def nullable(inner: Converter) -> Converter:
    """`key: null` (or `key:`) means "none"; used for identity facts not yet recorded."""

    def convert(node: Node, path: str, problems: Problems) -> Any:
        if isinstance(node, ScalarNode) and kind(node) == "null":
            return None
        return inner(node, path, problems)

    return convert


def text_list(check: Check | None = None, *, what: str = "a string", unique: bool = True) -> Converter:
    item = text(check, what=what)

    def convert(node: Node, path: str, problems: Problems) -> Any:
        if isinstance(node, ScalarNode) and kind(node) == "null":
            return ()
        if not isinstance(node, SequenceNode):
            problems.add(node, path, f"expected a list, got {describe(node)}")
            return INVALID
        values: list[str] = []
        ok = True
        for index, child in enumerate(node.value):
            value = item(child, f"{path}[{index}]", problems)
            if value is INVALID:
                ok = False
            elif unique and value in values:
                problems.add(child, f"{path}[{index}]", f"{value!r} is listed twice")
                ok = False
            else:
                values.append(value)
        return tuple(values) if ok else INVALID

    return convert


def text_map(key_check: Check, value_check: Check, *, typed: bool = False) -> Converter:
    """A mapping of names to scalar values, kept as the text written (`NCCL_DEBUG: WARN`).

    With `typed`, ints, floats and booleans keep their YAML type (`num_draft_tokens: 16` is 16),
    for values rendered into a typed config file rather than an environment.
    """

    def convert(node: Node, path: str, problems: Problems) -> Any:
        if isinstance(node, ScalarNode) and kind(node) == "null":
            return {}
        entries = mapping(node, path, problems)
        if entries is None:
            return INVALID
        result: dict[str, Any] = {}
        ok = True
        for name, (key, value_node) in entries.items():
            where = join(path, name)
            problem = key_check(name)
            if problem:
                problems.add(key, where, f"{name!r} {problem}")
                ok = False
                continue
            if isinstance(value_node, ScalarNode) and kind(value_node) == "bool":
                # Kept as written: `yes` stays "yes" rather than becoming "True".
                value: str | None = value_node.value
            else:
                value = _scalar_text(value_node, where, problems, "a single value")
            if value is None:
                ok = False
                continue
            problem = value_check(value)
            if problem:
                problems.add(value_node, where, f"{value!r} {problem}")
                ok = False
                continue
            if typed and isinstance(value_node, ScalarNode) and kind(value_node) in ("int", "float", "bool"):
                result[name] = construct(value_node)
            else:
                result[name] = value
        return result if ok else INVALID

    return convert
