"""Named locks on a host: an atomic `mkdir` under `<remote_root>/state/locks/`, with an owner record.

Used by deploy (the deploy lock) and by mode switches. The owner record says who, why, since when
and whether the lock is automatic (taken by a command for its duration: it expires after `ttl_s`,
so a crashed ddtreectl never wedges a host) or manual (taken by a person: never expires, released
only explicitly). A held lock is reported with its holder (exit 8), never silently taken over;
an expired automatic lock is taken over and the takeover is reported.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass
from typing import Callable

from ddtreectl.errors import LockHeldError, RemoteCommandError, UsageError
from ddtreectl.operations.audit import operator, remote_path
from ddtreectl.transport.base import Transport

_ACQUIRE = r"""
set -u
locks=$1; name=$2; record=$3
mkdir -p "$locks" || exit 3
dir="$locks/$name.lock"
if mkdir "$dir" 2>/dev/null; then
  printf '%s\n' "$record" > "$dir/owner.json.tmp" && mv -f "$dir/owner.json.tmp" "$dir/owner.json"
  echo "ACQUIRED $(date +%s)"
else
  # The winner writes its record just after its mkdir: give it up to a second before reading, or a
  # racing operator is told the lock is held by "unknown" since 1970 (seen in CI with two at once).
  i=0
  while [ ! -f "$dir/owner.json" ] && [ -d "$dir" ] && [ "$i" -lt 20 ]; do sleep 0.05; i=$((i + 1)); done
  echo "HELD $(date +%s)"
  cat "$dir/owner.json" 2>/dev/null || echo '{}'
fi
"""

# Move an expired lock aside atomically (rename), so two racing takeovers cannot both win: only one
# rename of the same directory succeeds, and the loser then finds the winner's fresh lock.
_EXPIRE = r"""
set -u
dir="$1/$2.lock"; expected=$3
current=$(cat "$dir/owner.json" 2>/dev/null || echo '{}')
[ "$current" = "$expected" ] || { echo CHANGED; exit 0; }
mv "$dir" "$dir.expired.$$" 2>/dev/null && rm -rf "$dir.expired.$$" && echo EXPIRED || echo CHANGED
"""


@dataclass(frozen=True)
class LockInfo:
    """The owner record of a lock."""

    name: str
    owner: str
    reason: str
    since: int  # Unix seconds, host clock
    kind: str  # "auto" | "manual"
    ttl_s: int
    raw: str = ""

    def expired(self, now: int) -> bool:
        return self.kind == "auto" and self.ttl_s > 0 and now > self.since + self.ttl_s

    def describe(self, now: int | None = None) -> str:
        age = f", {max(0, (now or int(time.time())) - self.since)} s ago" if self.since else ""
        expiry = " (automatic, expired)" if now is not None and self.expired(now) else (
            " (manual: never expires)" if self.kind == "manual" else "")
        return f"held by {self.owner} since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(self.since))} UTC" \
               f"{age}{expiry}: {self.reason or 'no reason given'}"


def _parse_record(name: str, text: str) -> LockInfo:
    try:
        data = json.loads(text or "{}")
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    return LockInfo(name=name, owner=str(data.get("owner", "unknown (unreadable owner record)")),
                    reason=str(data.get("reason", "")), since=int(data.get("since", 0) or 0),
                    kind=str(data.get("kind", "manual")), ttl_s=int(data.get("ttl_s", 0) or 0), raw=text.strip())


# A lock name becomes a directory under state/locks/ that `release` removes with rm -rf: no '/',
# no '..', nothing a shell or rm could read as an option.
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")


def check_name(name: str) -> str:
    """`name` if it is a valid lock name, else UsageError (exit 2)."""
    if not _NAME.fullmatch(name):
        raise UsageError(f"{name!r} is not a lock name (lower-case letters, digits, '-', '_')",
                         hint="the locks ddtreectl takes are `deploy` and `mode`")
    return name


def _locks_dir(root: str) -> str:
    return remote_path(root, "state", "locks")


@dataclass(frozen=True)
class Acquired:
    info: LockInfo
    took_over: LockInfo | None = None  # the expired automatic lock that was replaced


def acquire(
    transport: Transport,
    root: str,
    name: str,
    *,
    reason: str,
    kind: str = "auto",
    ttl_s: int = 3600,
    wait_s: float = 0.0,
    owner: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Acquired:
    """Take the lock or raise LockHeldError (exit 8) naming the holder. Waits up to `wait_s`."""
    check_name(name)
    who = owner or operator()
    deadline = time.monotonic() + wait_s
    took_over: LockInfo | None = None
    while True:
        record = json.dumps({"owner": who, "reason": reason, "since": int(time.time()), "kind": kind,
                             "ttl_s": ttl_s if kind == "auto" else 0})
        script = f"sh -c {shlex.quote(_ACQUIRE)} lock {_locks_dir(root)} {shlex.quote(name)} {shlex.quote(record)}"
        result = transport.run(script, timeout=30)
        first, _, rest = result.stdout.partition("\n")
        status, _, now_text = first.partition(" ")
        if status == "ACQUIRED":
            return Acquired(_parse_record(name, record), took_over)
        if status != "HELD":
            raise RemoteCommandError(f"could not take the {name} lock (exit {result.exit_code}): "
                                     f"{result.stderr.strip()[-300:]}", host=transport.host_name)
        holder = _parse_record(name, rest)
        now = int(now_text or time.time())
        if holder.expired(now):
            expire = f"sh -c {shlex.quote(_EXPIRE)} expire {_locks_dir(root)} {shlex.quote(name)} " \
                     f"{shlex.quote(holder.raw)}"
            if transport.run(expire, timeout=30).stdout.strip() == "EXPIRED":
                took_over = holder
            continue
        if time.monotonic() >= deadline:
            # After a wait, "wait with --lock-wait" is what the operator just did: say so.
            waited = f" (still held after waiting {wait_s:g} s)" if wait_s > 0 else ""
            raise LockHeldError(
                f"{name} lock {holder.describe(now)}{waited}",
                hint=f"{'wait longer' if wait_s > 0 else 'wait'} with --lock-wait SECONDS, or if that holder is "
                     f"gone: ddtreectl lock release {transport.host_name} --force",
                host=transport.host_name,
            )
        sleep(min(2.0, max(0.1, deadline - time.monotonic())))


def status(transport: Transport, root: str, name: str) -> LockInfo | None:
    """The lock's owner record, or None when it is free."""
    check_name(name)
    path = remote_path(root, "state", "locks", f"{name}.lock", "owner.json")
    result = transport.run(f"cat {path} 2>/dev/null || echo FREE", timeout=30)
    text = result.stdout.strip()
    return None if text == "FREE" else _parse_record(name, text)


def release(transport: Transport, root: str, name: str, *, owner: str | None = None, force: bool = False) -> bool:
    """Release the lock; only its owner may, unless `force`. Returns whether a lock was removed."""
    held = status(transport, root, name)
    if held is None:
        return False
    who = owner or operator()
    if held.owner != who and not force:
        raise LockHeldError(f"{name} lock {held.describe()}; it is not yours",
                            hint="--force releases someone else's lock (recorded in the audit log)",
                            host=transport.host_name)
    path = remote_path(root, "state", "locks", f"{name}.lock")
    transport.run(f"rm -rf {path}", timeout=30)
    return True
