"""What `set-ip` shows: the diff, the identity proof, the stale references, one summary line; or JSON."""

from __future__ import annotations

import json
from typing import Any

from ddtreectl.operations.set_ip import SetIpResult

SCHEMA = "ddtreectl.set-ip/1"


def summary(result: SetIpResult) -> str:
    """One line: what changed and what to do next."""
    r = result
    if not r.changed:
        return f"{r.host}: already at {r.new}; nothing to change"
    verb = "would move" if r.dry_run else "moved"
    if r.verify_skipped:
        proof = "identity NOT verified: --no-verify"
    elif r.matched:
        proof = "identity verified: " + ", ".join(r.matched)
    else:
        proof = "identity not checked: nothing is recorded for it"
    parts = [f"{r.host}: {verb} {r.old} -> {r.new} ({proof})"]
    if r.project_refs:
        files = len({ref.path for ref in r.project_refs})
        parts.append(f"{len(r.project_refs)} stale reference(s) in {files} project file(s) to fix")
    if r.rerender_hosts:
        # Name the command: "re-render" alone is no ddtreectl verb. deploy installs drifted units even
        # when the release is already built (no rebuild), and --plan shows the unit diff first.
        names = " ".join(r.rerender_hosts)
        parts.append(f"re-render units on {', '.join(r.rerender_hosts)}: `ddtreectl deploy {names} --plan` "
                     f"shows the unit diff, `ddtreectl deploy {names}` installs them")
    if r.unswept_hosts:
        parts.append("NOT swept: " + ", ".join(s.host for s in r.unswept_hosts))
    if not (r.project_refs or r.rerender_hosts or r.unswept_hosts):
        parts.append("no stale references found")
    if r.dry_run:
        parts.append("dry run: nothing written")
    elif r.verify_skipped:
        parts.append(f"next: `ddtreectl status {r.host}` once it is up")
    return "; ".join(parts)


def render_text(result: SetIpResult) -> str:
    r = result
    lines: list[str] = []
    if r.diff:
        lines.append(r.diff.rstrip("\n"))
    for note in r.notes:
        lines.append(f"note: {note}")
    if r.rank0_peers:
        lines.append(f"note: {r.host} is rank 0 (--dist-init-addr) of a multi-node profile: units of "
                     f"{', '.join(r.rank0_peers)} are rendered from its address")
    for proof in r.verified:
        lines.append(f"identity: {proof}")
    if r.changed:
        lines.append(f"inventory: {r.inventory} {'unchanged (dry run)' if r.dry_run else 'updated'}")
    for ref in r.project_refs:
        lines.append(f"stale: {ref.describe()}")
    for skipped in r.project_skipped:
        lines.append(f"not searched: {skipped}")
    for sweep in r.host_sweeps:
        for ref in sweep.refs:
            lines.append(f"stale on {sweep.host}: {ref.describe()}")
        if sweep.error:
            lines.append(f"not swept: {sweep.host}: {sweep.error}")
    if r.changed:
        lines.append(f"audit: {r.audit}")
    lines.append(summary(r))
    return "\n".join(lines)


def to_json(result: SetIpResult) -> dict[str, Any]:
    r = result
    return {
        "schema": SCHEMA,
        "exit_code": 0,
        "error": None,
        "host": r.host,
        "ok": True,
        "old": r.old,
        "new": r.new,
        "inventory": str(r.inventory),
        "changed": r.changed,
        "dry_run": r.dry_run,
        "diff": r.diff,
        "verified": not r.verify_skipped and r.changed,
        "verification": list(r.verified),
        "matched": list(r.matched),
        "notes": list(r.notes),
        "project_refs": [{"path": x.path, "line": x.line, "text": x.text} for x in r.project_refs],
        "project_skipped": list(r.project_skipped),
        "hosts": {
            s.host: {
                "swept": not s.error,
                "error": s.error or None,
                "needs_rerender": s.needs_rerender,
                "refs": [{"path": x.path, "line": x.line, "text": x.text} for x in s.refs],
            }
            for s in r.host_sweeps
        },
        "rank0_peers": list(r.rank0_peers),
        "rerender_hosts": r.rerender_hosts,
        "audit": r.audit,
        "summary": summary(r),
    }


def dumps(result: SetIpResult) -> str:
    return json.dumps(to_json(result), indent=2)
