"""`--json`: every command prints ONE JSON object on stdout, also when it fails (README, "JSON output").

Common to every document: `schema` ("ddtreectl.<command>/1"), `exit_code` (the process's exit
status), `ok` (exit_code is 0) and `error` (null, or {"message", "hint", "exit_code"} when the command as a whole failed).
A command over several hosts lists EVERY targeted host under `hosts`, the failed ones too, each
entry with `host`, `ok` and `error`, a failed one with the same keys as an answered one (null where
only the host could answer; inventory facts and what was already done on the host keep their values);
a command on one host puts that host's fields at the top level, with `host` and `ok`.

A command that was asked for JSON calls `expect` first; the CLI's error boundary then calls
`emit_failure` for an error that ended the command before it printed its document (an invalid
inventory, an unknown target, an unreachable host, a refusal), so stdout is never left empty.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any


@dataclass
class _Expected:
    schema: str | None = None
    fan_out: bool = False
    host: str | None = None
    emitted: bool = False


_EXPECTED = _Expected()


def expect(schema: str, *, fan_out: bool, host: str | None = None) -> None:
    """This invocation prints a `schema` document (fan_out: with a `hosts` list; else for `host`)."""
    _EXPECTED.schema, _EXPECTED.fan_out, _EXPECTED.host, _EXPECTED.emitted = schema, fan_out, host, False


def reset() -> None:
    """No document expected (each run of the CLI in one process starts from here)."""
    _EXPECTED.schema, _EXPECTED.fan_out, _EXPECTED.host, _EXPECTED.emitted = None, False, None, False


def error_json(err: BaseException | None, exit_code: int | None = None) -> dict[str, Any] | None:
    """{"message", "hint", "exit_code"} of an error (the message without the host prefix)."""
    if err is None:
        return None
    if isinstance(err, KeyboardInterrupt):
        message = "interrupted"
    else:
        message = getattr(err, "message", None) or str(err) or type(err).__name__
    code = exit_code if exit_code is not None else int(getattr(err, "exit_code", 1))
    return {"message": str(message), "hint": getattr(err, "hint", None) or None, "exit_code": code}


def emit(doc: dict[str, Any]) -> None:
    """Print the command's document (plain JSON: no colour or wrapping, whatever stdout is)."""
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stdout.flush()
    _EXPECTED.emitted = True


def emit_failure(err: BaseException, exit_code: int) -> None:
    """The document of a command that failed before printing its own (nothing when no JSON was asked
    for, or the command's document is already out)."""
    if _EXPECTED.schema is None or _EXPECTED.emitted:
        return
    doc: dict[str, Any] = {"schema": _EXPECTED.schema, "exit_code": exit_code, "ok": False,
                           "error": error_json(err, exit_code)}
    if _EXPECTED.fan_out:
        doc["hosts"] = []
    else:
        doc["host"] = getattr(err, "host", None) or _EXPECTED.host
    emit(doc)
