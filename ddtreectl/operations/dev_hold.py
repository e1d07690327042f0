"""`current` does not move under a development lease held by someone else (deploy, rollback).

`mode HOST dev` hands the host to one operator: `run` executes their commands in the current release
directory, so a deploy or rollback by anyone else switched the code under them mid-session (and a
later `mode prod` then started production on a release nobody chose for it). Like restore-service,
which refuses a dev-held host (exit 8), these refuse it too; the lease changes hands only through
`mode` (audited there). The holder's own deploy/rollback goes through: building and trying their
engine on the idle GPUs is what the lease is for. An expired lease still counts (never taken over
silently, as everywhere else).
"""

from __future__ import annotations

import time

from ddtreectl.errors import LockHeldError
from ddtreectl.operations.audit import operator, remote_path
from ddtreectl.probes.mode_lease import LEASE_PATH, ModeLease, parse_lease
from ddtreectl.transport.base import Transport


def read_lease(transport: Transport, root: str) -> ModeLease | None:
    """mode.json as the host has it (None: never switched, production)."""
    path = remote_path(root, *LEASE_PATH.split("/"))
    result = transport.run(f"cat {path} 2>/dev/null || true", timeout=30)
    return parse_lease(result.stdout)


def refuse_if_held_for_dev(lease: ModeLease | None, host_name: str, verb: str) -> None:
    """LockHeldError (exit 8) naming the holder when another operator holds the host for development."""
    if lease is None or lease.mode != "dev" or lease.holder == operator():
        return
    holder = lease.holder or "its holder"
    raise LockHeldError(
        f"held for development: {lease.describe(int(time.time()))}; {verb} does not switch `current` under "
        "the lease holder (nothing was changed)",
        hint=f"ask {holder} (their own {verb} goes through), or end the lease with `ddtreectl mode {host_name} prod` "
             f"(restores production) or take it over with `ddtreectl mode {host_name} dev --reason ...`, then "
             f"{verb} again; another operator's lease needs --force there (recorded in the audit log)",
        host=host_name)
