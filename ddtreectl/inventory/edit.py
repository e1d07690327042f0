"""Surgical round-trip edits of `hosts.yaml`: change one host's values, keep every other byte.

A YAML dump would lose comments, quoting, ordering, anchors and CRLF line endings. Instead the
file is composed with PyYAML's pure-Python loader (its marks are character offsets into the text)
and the new value is spliced over the old scalar's span, or a missing key line is inserted into
the host's own mapping with that mapping's indentation and line ending.

`edit_host` then re-parses both versions and checks that the ONLY difference in the resulting
inventory is the requested values of the requested host; anything else (an anchored mapping
merged into another host, an aliased value) refuses the edit instead of silently changing more.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tempfile
from pathlib import Path
from typing import Mapping, Union

import yaml
from yaml.nodes import CollectionNode, MappingNode, Node, ScalarNode, SequenceNode

from ddtreectl.errors import DdtreeError, InventoryError
from ddtreectl.inventory.models import Inventory

EditValue = Union[str, int, None, tuple[str, ...]]

_PREFIX = re.compile(r"^(?:[&!]\S*\s+)*")  # an anchor and/or tag written before a scalar
_MERGE = "tag:yaml.org,2002:merge"


def read_text(path: Path) -> str:
    """The file's text exactly (no newline translation), so CRLF survives the round trip."""
    return path.read_bytes().decode("utf-8")


def edit_host(text: str, path: Path, host: str, values: Mapping[str, EditValue]) -> str:
    """`text` with `values` set on `host`, after proving nothing else in the inventory changed.

    Raises InventoryError when the file or the result is invalid, the value is an alias, or
    the edit would change another host or profile through an anchor.
    """
    from ddtreectl.inventory.loader import parse

    before = parse(text, path)
    before.host(host)
    new_text = text
    for key, value in values.items():
        new_text = set_host_value(new_text, host, key, value, filename=str(path))
    after = parse(new_text, path)
    _check_only_host_changed(before, after, host, values)
    return new_text


def set_host_value(text: str, host: str, key: str, value: EditValue, *, filename: str = "hosts.yaml") -> str:
    """Replace `hosts.<host>.<key>`'s value in place, or insert `key: value` into the host.

    Refusals raise InventoryError naming `filename`:line; `edit_host` is the checked entry point.
    """
    root = _compose(text, filename)
    host_key, host_node = _host_entry(root, host, filename)
    path = f"hosts.{host}.{key}"
    if isinstance(host_node, ScalarNode) and host_node.tag.endswith(":null"):
        return _insert_into_empty(text, host_key, key, value)
    if not isinstance(host_node, MappingNode) or _is_alias(host_key, host_node):
        raise InventoryError(
            f"{filename}:{_line(host_key)}: hosts.{host}: the host's entry is not written out in place",
            hint="write the host as its own mapping (not an alias) and run the command again",
        )
    for k, v in host_node.value:
        if isinstance(k, ScalarNode) and k.value == key and k.tag != _MERGE:
            return _replace(text, k, v, value, f"{filename}:{_line(k)}: {path}", flow=host_node.flow_style)
    return _insert(text, host_node, key, value)


def key_line(text: str, host: str, key: str, *, filename: str = "hosts.yaml") -> int | None:
    """The line `hosts.<host>.<key>` is written on (None: not in the host's own mapping; raises
    InventoryError as set_host_value does for a file it cannot read)."""
    _, node = _host_entry(_compose(text, filename), host, filename)
    if isinstance(node, MappingNode):
        for k, _ in node.value:
            if isinstance(k, ScalarNode) and k.value == key and k.tag != _MERGE:
                return _line(k)
    return None


def _compose(text: str, filename: str) -> Node | None:
    """The node tree with marks that are character offsets into `text` (the pure-Python loader;
    libyaml's marks are not). It is stricter than libyaml in rare corners (a BOM mid-file): then
    the file is refused, never half-edited."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark is not None else filename
        problem = getattr(err, "problem", None) or str(err)
        raise InventoryError(
            f"{where}: cannot edit the inventory: {problem}",
            hint="fix the YAML at that position (the loader may accept it; the editor needs plain YAML)",
        ) from None


def _host_entry(root: Node | None, host: str, filename: str) -> tuple[ScalarNode, Node]:
    hint = f"check it with any ddtreectl command (it validates {filename}) and fix what it reports"
    if not isinstance(root, MappingNode):
        raise InventoryError(f"{filename}: the inventory is not a mapping", hint=hint)
    hosts = [v for k, v in root.value if isinstance(k, ScalarNode) and k.value == "hosts"]
    if len(hosts) != 1 or not isinstance(hosts[0], MappingNode):
        raise InventoryError(f"{filename}: the inventory has no single hosts: mapping", hint=hint)
    found = [(k, v) for k, v in hosts[0].value if isinstance(k, ScalarNode) and k.value == host]
    if len(found) != 1:
        raise InventoryError(f"{filename}: host {host!r} is not written exactly once under hosts:", hint=hint)
    return found[0]


def _is_alias(key: Node, value: Node) -> bool:
    """A composed alias is the anchored node itself, whose marks lie where the anchor was written:
    before the key that refers to it."""
    return value.start_mark.index < key.end_mark.index


def _line(node: Node) -> int:
    return node.start_mark.line + 1


def _replace(text: str, key: ScalarNode, node: Node, value: EditValue, where: str, *, flow: bool) -> str:
    """Splice `value` over `node`'s text. `where` is `file:line: key.path` for messages."""
    path = where.rsplit(": ", 1)[-1]
    if _is_alias(key, node):
        raise InventoryError(
            f"{where}: the value is an alias of the one defined at line {_line(node)}; "
            "changing it would change every place that uses it",
            hint=f"replace the alias in {path} with a plain value, then run the command again",
        )
    start, end = node.start_mark.index, node.end_mark.index
    if isinstance(node, ScalarNode):
        if node.style in ("|", ">"):
            raise InventoryError(
                f"{where}: block scalars ('|', '>') are not edited automatically",
                hint=f"write {path} as a one-line value, then run the command again",
            )
        prefix = _PREFIX.match(text[start:end])
        start += len(prefix.group(0)) if prefix else 0
        return text[:start] + render(value, style=node.style, flow=flow) + text[end:]
    # A list (gpu_uuids): replace the whole node; a block list becomes a flow list on the key line.
    rendered = render(value, style=None, flow=flow)
    if isinstance(node, SequenceNode) and not node.flow_style:
        start = key.end_mark.index + 1  # just after the ':'
        end = _strip_breaks(text, start, _content_end(node, start))
        rendered = " " + rendered
    return text[:start] + rendered + text[end:]


def _insert(text: str, mapping: MappingNode, key: str, value: EditValue) -> str:
    if mapping.flow_style:
        if not mapping.value:
            at = text.rindex("}", 0, mapping.end_mark.index)
            return text[:at] + f"{key}: {render(value, style=None, flow=True)}" + text[at:]
        # After the last entry's value, not before the '}': `{ a: 1 }` becomes `{ a: 1, k: v }`.
        at = max(_content_end(node, mapping.start_mark.index) for entry in mapping.value for node in entry)
        return text[:at] + f", {key}: {render(value, style=None, flow=True)}" + text[at:]
    indent = " " * mapping.value[0][0].start_mark.column
    at = _line_end(text, _content_end(mapping, mapping.start_mark.index))
    eol = _eol(text, at)
    return text[:at] + f"{eol}{indent}{key}: {render(value, style=None, flow=False)}" + text[at:]


def _insert_into_empty(text: str, host_key: ScalarNode, key: str, value: EditValue) -> str:
    at = _line_end(text, host_key.end_mark.index)
    indent = " " * (host_key.start_mark.column + 2)
    return text[:at] + f"{_eol(text, at)}{indent}{key}: {render(value, style=None, flow=False)}" + text[at:]


def _content_end(node: Node, floor: int) -> int:
    """Where the last character written inside `node` is, ignoring aliases (written elsewhere)."""
    if node.start_mark.index < floor:
        return floor
    if isinstance(node, ScalarNode):
        return node.end_mark.index
    children: list[Node] = []
    if isinstance(node, MappingNode):
        for k, v in node.value:
            children += [k, v]
    elif isinstance(node, SequenceNode):
        children = list(node.value)
    ends = [_content_end(child, floor) for child in children if child.start_mark.index >= floor]
    flow = isinstance(node, CollectionNode) and node.flow_style
    if flow or not ends:
        return max([node.end_mark.index if flow else floor, *ends])
    return max(ends)


def _strip_breaks(text: str, start: int, end: int) -> int:
    while end > start and text[end - 1] in "\r\n":
        end -= 1
    return end


def _line_end(text: str, index: int) -> int:
    """The index of the line break ending the line that holds `index` (len(text) at EOF)."""
    while index > 0 and text[index - 1] in "\r\n":  # a block scalar's end mark is past its break
        index -= 1
    nl = text.find("\n", index)
    if nl < 0:
        return len(text)
    return nl - 1 if nl > 0 and text[nl - 1] == "\r" else nl


def _eol(text: str, at: int) -> str:
    if text.startswith("\r\n", at):
        return "\r\n"
    if text.startswith("\n", at):
        return "\n"
    return "\r\n" if "\r\n" in text else "\n"


def render(value: EditValue, *, style: str | None, flow: bool) -> str:
    """YAML text for `value` in the original scalar's quoting style where it is safe to."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        raise TypeError("booleans are not inventory values")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(render(item, style=None, flow=True) for item in value) + "]"
    if style == '"':
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if style == "'" or not _plain_safe(value, flow=flow):
        return "'" + value.replace("'", "''") + "'"
    return value


def _plain_safe(value: str, *, flow: bool) -> bool:
    """Whether `value` written unquoted reads back as the same string in that context."""
    doc = f"[{value}]" if flow else f"k: {value}"
    try:
        node = yaml.compose(doc, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return False
    if node is None:
        return False
    inner = node.value[0] if flow else node.value[0][1]
    if isinstance(inner, tuple) or not isinstance(inner, ScalarNode):
        return False
    return inner.value == value and inner.tag == "tag:yaml.org,2002:str"


def _check_only_host_changed(
    before: Inventory, after: Inventory, host: str, values: Mapping[str, EditValue]
) -> None:
    others = [
        name for name, old in before.hosts.items()
        if name != host and (name not in after.hosts or dataclasses.replace(after.hosts[name], line=old.line) != old)
    ]
    if others or before.services != after.services or before.groups != after.groups:
        what = ", ".join(others) if others else "service profiles or groups"
        raise InventoryError(
            f"changing hosts.{host} would also change {what} (they share the value through an anchor or merge)",
            hint=f"write the value out under hosts.{host} itself, then run the command again",
        )
    got = after.hosts[host]
    # Only the edited keys may differ (Host.line moves when a line is inserted above another host,
    # never for this one), and each must read back as written (`~` paths come back expanded).
    unchanged = dataclasses.replace(got, **{k: getattr(before.hosts[host], k) for k in values})
    read_back = all(
        getattr(got, k) == v or (isinstance(v, str) and getattr(got, k) == os.path.expanduser(v))
        for k, v in values.items()
    )
    if unchanged != before.hosts[host] or not read_back:
        raise DdtreeError(f"internal error: the edit of hosts.{host} did not read back as written")


def diff(old: str, new: str, filename: str) -> str:
    """A unified diff of an edit, for --dry-run."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{filename}", f"b/{filename}"
    )
    return "".join(lines)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path`'s content atomically: temp file beside it, fsync, rename over it.

    A symlinked inventory is written through to its target (the link stays), and the file's
    mode and owner are kept, so an edit never changes who may read the pinned keys.
    """
    target = Path(os.path.realpath(path))
    try:
        info = target.stat()
    except FileNotFoundError:
        info = None
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(text.encode("utf-8"))
            out.flush()
            if info is not None:
                os.fchmod(out.fileno(), info.st_mode & 0o7777)
                try:
                    os.fchown(out.fileno(), info.st_uid, info.st_gid)
                except PermissionError:
                    pass  # not ours to give away: the file keeps our ownership, as an editor's would
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
