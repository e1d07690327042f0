"""`ddtreectl status --json`: a stable, documented schema (`ddtreectl.status/1`).

Fields are only ever added within a schema version; a rename or removal bumps the version.
Unknown values are `null`, never 0 or false. The schema text (ui/status_schema.py) is what the
command's --help shows.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ddtreectl.operations.status import HostStatus, StatusReport
from ddtreectl.probes.facts import GpuState, HostFacts
from ddtreectl.probes.mode_lease import lease_from_state_files
from ddtreectl.probes.words import health_words, service_condition
from ddtreectl.ui.status_schema import SCHEMA, STATUS_JSON_SCHEMA

__all__ = ["SCHEMA", "STATUS_JSON_SCHEMA", "dumps", "host_to_json", "report_to_json"]


def report_to_json(report: StatusReport, inventory_path: Path) -> dict[str, Any]:
    """The whole report as plain JSON-able data (see STATUS_JSON_SCHEMA)."""
    counts = {k: 0 for k in ("ok", "unreachable", "refused", "timeout", "failed")}
    for h in report.hosts:
        counts[h.outcome] += 1
    return {
        "schema": SCHEMA,
        "inventory": str(inventory_path),
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "deadline_s": report.deadline_s,
        "elapsed_ms": round(report.elapsed_s * 1000, 1),
        "exit_code": report.exit_code(),
        "ok": report.exit_code() == 0,
        "error": None,
        "summary": {"hosts": len(report.hosts), "answered": counts["ok"],
                    **{k: v for k, v in counts.items() if k != "ok"}},
        "hosts": [host_to_json(h) for h in report.hosts],
    }


def dumps(report: StatusReport, inventory_path: Path) -> str:
    return json.dumps(report_to_json(report, inventory_path), indent=2, sort_keys=False)


def host_to_json(status: HostStatus) -> dict[str, Any]:
    host = status.host
    out: dict[str, Any] = {
        "name": host.name, "host": host.name, "ok": status.outcome == "ok",
        "address": host.address, "port": host.port, "role": host.role,
        "transport": host.transport, "outcome": status.outcome,
        "error": {"message": status.error, "hint": status.hint or None,
                  "exit_code": status.exit_code} if status.error else None,
        "connect_ms": _ms(status.connect_ms), "probe_ms": _ms(status.probe_ms),
        "connection": status.connection,
    }
    facts = status.facts
    if facts is None:
        out.update(identity=None, gpus=None, service=None, release=None, mode=None, disk=None,
                   state_files=None, warnings=list(status.warnings))
        return out
    out["identity"] = {
        "hostname": facts.hostname, "machine_id": facts.machine_id, "boot_id": facts.boot_id,
        "uptime_s": facts.uptime_s, "kernel": facts.kernel, "user": facts.user, "pid1": facts.pid1,
    }
    out["gpus"] = _gpus_json(facts.gpus, host.gpus)
    out["service"] = _service_json(facts, host.service)
    rel = facts.release
    out["release"] = {
        "root": rel.root, "root_exists": rel.root_exists, "current": rel.current,
        "current_path": rel.current_path, "current_exists": rel.current_exists,
        "build_stamp": rel.build_stamp, "stamp": _maybe_json(rel.stamp_text) if rel.stamp_text else None,
        "releases": list(rel.releases), "running": rel.running, "restart_pending": rel.restart_pending,
    }
    lease = lease_from_state_files(facts.state_files)
    out["mode"] = None if lease is None else lease.to_json(int(time.time()))
    disk = facts.disk
    out["disk"] = None if disk is None else {
        "path": disk.path, "mount": disk.mount, "total_bytes": disk.total_kib * 1024,
        "free_bytes": disk.avail_kib * 1024, "used_pct": disk.used_pct,
    }
    out["state_files"] = {k: _maybe_json(v) for k, v in facts.state_files.items()}
    out["warnings"] = list(status.warnings)
    return out


def _gpus_json(state: GpuState, expected: int) -> dict[str, Any]:
    from ddtreectl.probes.words import gpu_summary

    busy = [state.busy(g) for g in state.gpus]
    return {
        "status": state.status, "expected": expected, "found": len(state.gpus),
        "busy": None if state.status not in ("ok", "no-devices") or any(b is None for b in busy)
        else sum(1 for b in busy if b),
        "summary": gpu_summary(state), "detail": state.detail or None,
        "duration_ms": state.duration_ms,
        "devices": [{
            "index": g.index, "uuid": g.uuid, "name": g.name, "memory_used_mib": g.memory_used_mib,
            "memory_total_mib": g.memory_total_mib, "utilization_pct": g.utilization_pct,
            "persistence_mode": g.persistence_mode, "compute_cap": g.compute_cap, "busy": b,
        } for g, b in zip(state.gpus, busy)],
        "processes": [{"gpu_uuid": a.gpu_uuid, "pid": a.pid, "process_name": a.process_name,
                       "used_memory_mib": a.used_memory_mib} for a in state.apps]
        if state.apps_known else None,
    }


def _service_json(facts: HostFacts, profile: str | None) -> dict[str, Any] | None:
    svc = facts.service
    if svc is None:
        return None
    condition = service_condition(svc)
    since = (datetime.fromtimestamp(svc.active_since_epoch, timezone.utc).isoformat()
             if svc.active_since_epoch else None)
    health = facts.health if condition.kind == "running" else None
    said = health_words(health)
    return {
        "profile": profile, "unit": svc.unit, "state": condition.kind,
        "words": condition.words + (f", {said}" if said else ""),
        "known": svc.known, "load_state": svc.load_state or None,
        "active_state": svc.active_state or None, "sub_state": svc.sub_state or None,
        "unit_file_state": svc.unit_file_state or None, "result": svc.result or None,
        "exec_main_status": svc.exec_main_status, "n_restarts": svc.n_restarts,
        "active_since": since, "need_daemon_reload": svc.need_daemon_reload,
        "main_pid": svc.main_pid,
        "serving": health.serving if health else None,
        "health": {"port": health.port, "listening": health.listening, "http_status": health.http_status}
        if health else None,
    }


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
