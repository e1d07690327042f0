"""The host's mode lease (`<remote_root>/state/mode.json`): production, or development held by one
operator until an expiry. Pure: parsing, expiry and words; operations/mode.py reads and writes it.

An expired development lease stays a development lease: it is shown as expired and never silently
taken over (another operator needs --force, which the audit log records).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping

LEASE_PATH = "state/mode.json"  # under the remote root; the status probe returns it raw
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_S = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """`8h`, `30m`, `90s`, `1d`, `3600` -> seconds. Raises ValueError naming the text."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 30m, 8h, 1d)")
    seconds = int(float(match.group(1)) * _UNIT_S[(match.group(2) or "").lower()])
    if seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be positive")
    return seconds


def utc(epoch: int | None) -> str:
    return "?" if not epoch else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


@dataclass(frozen=True)
class ModeLease:
    """What mode.json says. `mode` is "unknown" when the file is not a lease we can read."""

    mode: str  # "prod" | "dev" | "unknown"
    holder: str = ""
    reason: str = ""
    since: int = 0
    expires: int | None = None
    unit: str | None = None
    forced: bool = False
    raw: str = ""

    def expired(self, now: int) -> bool:
        return self.mode == "dev" and self.expires is not None and now >= self.expires

    def describe(self, now: int) -> str:
        """`dev, held by alice@box since ... until ... (3 h 10 min left): reason`."""
        if self.mode == "prod":
            return f"prod (since {utc(self.since)}, by {self.holder or '?'})"
        if self.mode != "dev":
            return f"unknown (unreadable {LEASE_PATH}: {self.raw[:80]!r})"
        if self.expires is None:
            left = "no expiry"
        elif self.expired(now):
            left = f"EXPIRED {_span(now - self.expires)} ago"
        else:
            left = f"{_span(self.expires - now)} left"
        return (f"dev, held by {self.holder or '?'} since {utc(self.since)} until {utc(self.expires)} "
                f"({left}): {self.reason or 'no reason given'}")

    def to_json(self, now: int) -> dict[str, Any]:
        return {"mode": self.mode, "holder": self.holder or None, "reason": self.reason or None,
                "since": self.since or None, "expires": self.expires, "expired": self.expired(now),
                "unit": self.unit, "forced": self.forced}


def _span(seconds: int) -> str:
    s = max(0, seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600:02d} h"


def _int(value: object) -> int | None:
    try:
        return int(value) if value is not None else None  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def parse_lease(text: str | None) -> ModeLease | None:
    """The lease in mode.json; None when there is no file (never switched: production)."""
    if text is None or not text.strip():
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("mode") not in ("prod", "dev"):
        return ModeLease(mode="unknown", raw=text.strip())
    return ModeLease(mode=str(data["mode"]), holder=str(data.get("holder") or ""),
                     reason=str(data.get("reason") or ""), since=_int(data.get("since")) or 0,
                     expires=_int(data.get("expires")), unit=data.get("unit") or None,
                     forced=bool(data.get("forced")), raw=text.strip())


def lease_from_state_files(files: Mapping[str, str]) -> ModeLease | None:
    """The lease among the raw state files the status probe returns (path under the root -> text)."""
    return parse_lease(files.get(LEASE_PATH))


def mode_words(lease: ModeLease | None, now: int) -> str:
    """Short words for the status table: `prod`, `dev: alice@box until 20:50:00 UTC`, `dev: EXPIRED …`."""
    if lease is None or lease.mode == "prod":
        return "mode prod"
    if lease.mode != "dev":
        return f"mode unknown (unreadable {LEASE_PATH})"
    state = "EXPIRED " if lease.expired(now) else ""
    return f"mode dev: {state}{lease.holder or '?'} until {utc(lease.expires)}: {lease.reason or 'no reason'}"
