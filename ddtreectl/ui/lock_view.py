"""`lock status --json`: the `ddtreectl.lock-status/1` document (README, "JSON output")."""

from __future__ import annotations

import time
from typing import Any

from ddtreectl.operations.remote_lock import LockInfo


def lock_status_json(host: str, name: str, holder: LockInfo | None, now: int) -> dict[str, Any]:
    """A free lock is exit 0; a held one exit 8 with `error` null (the answer, not a failure, as a busy
    host in `gpus`); `holder` carries the owner record with its time both as Unix seconds and UTC."""
    doc: dict[str, Any] = {"schema": "ddtreectl.lock-status/1", "exit_code": 0 if holder is None else 8,
                           "ok": holder is None, "error": None, "host": host, "lock": name,
                           "held": holder is not None, "holder": None}
    if holder is not None:
        doc["holder"] = {"owner": holder.owner, "reason": holder.reason, "kind": holder.kind, "since": holder.since,
                         "since_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(holder.since)),
                         "ttl_s": holder.ttl_s, "expired": holder.expired(now), "description": holder.describe(now)}
    return doc
