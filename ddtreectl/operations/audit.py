"""The audit log on each host: one JSON line per deploy, rollback, mode switch, set-ip, restore.

It lives at `<remote_root>/state/audit.log` so whoever logs into the host later can see who changed
what and when, without access to the operator's machine.
"""

from __future__ import annotations

import getpass
import json
import shlex
import socket
import time

from ddtreectl.transport.base import Transport


def remote_path(root: str, *parts: str) -> str:
    """A path under the remote root as a shell word; `~/` roots expand to $HOME on the host."""
    joined = "/".join([root.rstrip("/"), *parts]) if parts else root
    if joined.startswith("~/"):
        return '"$HOME"/' + shlex.quote(joined[2:])
    return shlex.quote(joined)


def operator() -> str:
    """`user@machine` of whoever runs ddtreectl (recorded in audit lines, locks and leases)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def audit_line(action: str, **fields: object) -> str:
    record: dict[str, object] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "by": operator(), "action": action}
    record.update(fields)
    return json.dumps(record, sort_keys=False)


def append_audit(transport: Transport, root: str, action: str, **fields: object) -> str | None:
    """Append one audit line on the host (creating state/ if needed).

    Returns None when written, else why not. It does not raise for a failed write: an audit line
    must not turn a finished change into an error, so the caller shows the reason as a warning.
    """
    state = remote_path(root, "state")
    log = remote_path(root, "state", "audit.log")
    line = shlex.quote(audit_line(action, **fields))
    result = transport.run(f"mkdir -p {state} && printf '%s\\n' {line} >> {log}", timeout=15)
    if result.ok:
        return None
    return f"audit line not written to {root}/state/audit.log: {result.stderr.strip()[-200:] or result.exit_code}"
