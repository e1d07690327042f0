"""`journalctl -o json` output as entries for `logs --json` (a pure parser).

journalctl prints one JSON object per line. MESSAGE is a string, or an array of byte values when
the message is not valid UTF-8 (decoded here with replacement characters), or absent/null for binary
blobs over journalctl's size limit (then ""). Timestamps are microseconds since the epoch, as strings.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JournalEntry:
    unix_us: int | None
    priority: int | None  # syslog priority: 0 emerg ... 3 err, 4 warning ... 7 debug
    identifier: str | None  # SYSLOG_IDENTIFIER, e.g. "systemd" or the server's process name
    pid: int | None
    message: str

    @property
    def time(self) -> str | None:
        """UTC, ISO 8601 with microseconds and a Z."""
        if self.unix_us is None:
            return None
        seconds, micro = divmod(self.unix_us, 1_000_000)
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micro:06d}Z"

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "unix_us": self.unix_us, "priority": self.priority,
                "identifier": self.identifier, "pid": self.pid, "message": self.message}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value).decode("utf-8", "replace")
    return ""


def parse_journal_json(text: str) -> list[JournalEntry]:
    """Entries of `journalctl -o json` output, in order. A line that is not a JSON object (journalctl's
    own "-- No entries --" never comes in this mode, but a truncated last line can) is skipped."""
    entries = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        identifier = record.get("SYSLOG_IDENTIFIER")
        entries.append(JournalEntry(
            unix_us=_int(record.get("__REALTIME_TIMESTAMP")), priority=_int(record.get("PRIORITY")),
            identifier=identifier if isinstance(identifier, str) else None, pid=_int(record.get("_PID")),
            message=_text(record.get("MESSAGE"))))
    return entries
