"""Quoting for values that land in systemd unit files.

systemd splits ExecStart= on whitespace, honours double quotes with C-style escapes, expands `$VAR`
and treats `%x` as a specifier. A value from the inventory must reach the process exactly as written,
so every argument is escaped for all three before it is written into a unit.
"""

from __future__ import annotations

import re

_PLAIN = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def systemd_escape_specifiers(value: str) -> str:
    """Escape `%` (unit specifiers) and `$` (environment expansion) for use in a unit file."""
    return value.replace("%", "%%").replace("$", "$$")


def systemd_quote(value: str) -> str:
    """One argument of ExecStart= (or one Environment= assignment), quoted only when needed."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError(f"value {value!r} contains a line break or NUL; it cannot go into a unit file")
    escaped = systemd_escape_specifiers(value)
    if _PLAIN.match(value):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_line(argv: list[str] | tuple[str, ...]) -> str:
    """A complete ExecStart= value from an argument vector."""
    return " ".join(systemd_quote(arg) for arg in argv)
