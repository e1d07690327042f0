"""Reading the inventory as a YAML *node tree*: every value keeps its line.

PyYAML's `safe_load` forgets where values came from and silently keeps the last of two duplicate
keys. Composing instead gives nodes with marks, so errors can say `file:line: key.path` and
duplicates can be caught. Merge keys (`<<: *anchor`) are flattened here by hand because
composition leaves them to the constructor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ddtreectl.errors import InventoryError

try:  # libyaml is several times faster; the loader runs on every command.
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]

TAG = "tag:yaml.org,2002:"
MERGE_TAG = TAG + "merge"


@dataclass(frozen=True)
class Problem:
    line: int
    path: str
    message: str
    hint: str | None


@dataclass
class Problems:
    """Collects every validation problem so the operator fixes the file in one pass."""

    filename: str
    items: list[Problem] = field(default_factory=list)

    def add(self, node: Node | None, path: str, message: str, hint: str | None = None) -> None:
        self.items.append(Problem(line_of(node), path, message, hint))

    def raise_if_any(self) -> None:
        if not self.items:
            return
        ordered = sorted(self.items, key=lambda p: p.line)
        first, rest = ordered[0], ordered[1:]
        message = self.format(first)
        if rest:
            more = "\n".join("  " + self.format(p) for p in rest)
            message += f"\n{len(rest)} more problem{'s' if len(rest) > 1 else ''}:\n{more}"
        hint = first.hint or f"fix {first.path or 'the file'} at {self.filename}:{first.line}, then run the command again"
        raise InventoryError(message, hint=hint)

    def format(self, problem: Problem) -> str:
        where = f"{self.filename}:{problem.line}"
        return f"{where}: {problem.path}: {problem.message}" if problem.path else f"{where}: {problem.message}"


def line_of(node: Node | None) -> int:
    """1-based line of a node (1 for a missing node: the problem is about the whole file)."""
    return node.start_mark.line + 1 if node is not None else 1


def compose(text: str, filename: str) -> Node | None:
    """The node tree of `text`; malformed YAML raises InventoryError with line and column."""
    try:
        return yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        what = " ".join(str(part) for part in (err.context, err.problem) if part)
        lines = text.splitlines()
        line_no = mark.line + 1 if mark else 0
        line = lines[line_no - 1] if 0 < line_no <= len(lines) else ""
        if "\t" in line[:len(line) - len(line.lstrip(" \t"))]:
            # A tab is invisible in the message PyYAML gives for most of its places ("found character
            # that cannot start any token"), and an editor shows it as spaces.
            raise InventoryError(
                f"{where}: malformed YAML: a tab in the indentation ({what})",
                hint=f"YAML indents with spaces only: replace the tab(s) at the start of line {line_no} with spaces, "
                "aligned with the lines around it",
            ) from None
        raise InventoryError(
            f"{where}: malformed YAML: {what}",
            hint="fix the YAML syntax near that position (indentation, a missing ':', an unclosed quote)",
        ) from None
    except yaml.YAMLError as err:  # reader errors: NUL bytes, invalid characters
        raise InventoryError(
            f"{filename}: malformed YAML: {err}",
            hint="the inventory must be UTF-8 text without control characters",
        ) from None


def describe(node: Node) -> str:
    """What a node is, for "expected X, got Y" messages."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    names = {"null": "null", "bool": "a boolean", "int": "an integer", "float": "a number", "str": "a string"}
    if node.tag.startswith(TAG) and node.tag[len(TAG):] in names:
        return names[node.tag[len(TAG):]]
    return f"a value tagged {node.tag}"


def kind(node: Node) -> str:
    """The resolved scalar type: null, bool, int, float, str, or the full tag for anything else."""
    return node.tag[len(TAG):] if node.tag.startswith(TAG) else node.tag


def construct(node: ScalarNode) -> Any:
    """The Python value of a plain scalar (ints in every YAML spelling, floats, bools, null)."""
    return _constructor().construct_object(node, deep=True)


_CONSTRUCTOR: list[yaml.constructor.SafeConstructor] = []


def _constructor() -> yaml.constructor.SafeConstructor:
    if not _CONSTRUCTOR:
        _CONSTRUCTOR.append(yaml.constructor.SafeConstructor())
    return _CONSTRUCTOR[0]


Entry = tuple[ScalarNode, Node]


def mapping(node: Node, path: str, problems: Problems, what: str = "a mapping") -> dict[str, Entry] | None:
    """The entries of a mapping node by key text, merges flattened, duplicates and bad keys reported.

    Explicit keys win over merged ones, and earlier merge sources win over later ones (YAML merge
    key spec). Returns None (after reporting) when `node` is not a mapping.
    """
    if not isinstance(node, MappingNode):
        problems.add(node, path, f"expected {what}, got {describe(node)}")
        return None
    explicit: dict[str, Entry] = {}
    merged: dict[str, Entry] = {}
    for key, value in node.value:
        if key.tag == MERGE_TAG:
            _merge_into(merged, value, path, problems, set())
            continue
        if not isinstance(key, ScalarNode) or kind(key) == "null":
            problems.add(key, path, f"keys must be plain names, got {describe(key)}")
            continue
        name = key.value
        if name in explicit:
            first = line_of(explicit[name][0])
            problems.add(
                key,
                join(path, name),
                f"duplicate key {name!r} (first defined at line {first})",
                hint="YAML would silently keep only the last one: remove or rename one of them",
            )
            continue
        explicit[name] = (key, value)
    return {**merged, **explicit}


def _merge_into(into: dict[str, Entry], value: Node, path: str, problems: Problems, seen: set[int]) -> None:
    sources = value.value if isinstance(value, SequenceNode) else [value]
    for source in sources:
        if not isinstance(source, MappingNode):
            problems.add(source, path, f"'<<' merges mappings only, got {describe(source)}")
            continue
        if id(source) in seen:
            continue
        seen.add(id(source))
        inner: dict[str, Entry] = {}
        for key, val in source.value:
            if key.tag == MERGE_TAG:
                _merge_into(inner, val, path, problems, seen)
            elif isinstance(key, ScalarNode):
                inner[key.value] = (key, val)
        for name, entry in inner.items():
            into.setdefault(name, entry)


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
