"""Warnings a status probe's facts raise against what the inventory expects of the host."""

from __future__ import annotations

import json
import time

from ddtreectl.inventory.models import Host
from ddtreectl.probes.facts import HostFacts

# nvidia-smi answers in ~25 ms with persistence mode on (shared/ops-notes.md); a second or more
# means the driver re-initialises per call, which slows every GPU tool on the host.
SLOW_NVIDIA_SMI_MS = 1000
# A release with a built engine is several GB; below this a deploy is likely to fail midway.
LOW_DISK_KIB = 20 * 1024 * 1024
LOW_DISK_PCT = 95


def warnings_for(host: Host, facts: HostFacts) -> list[str]:
    """Every mismatch between the host's facts and its inventory entry, most serious first."""
    out: list[str] = []
    if host.machine_id and facts.machine_id and facts.machine_id != host.machine_id:
        out.append(f"machine-id {facts.machine_id} differs from the recorded {host.machine_id}: "
                   "another machine answers at this address?")
    out.extend(_production_warnings(host, facts))
    out.extend(_gpu_warnings(host, facts))
    # The service's own state is reported beside the warnings (service.state / its column), so
    # only what that state does not say appears here.
    if facts.service is not None:
        if facts.service.need_daemon_reload:
            out.append(f"{facts.service.unit} changed on disk: daemon-reload pending")
    release = facts.release
    if release.restart_pending:
        out.append(f"restart pending: running release {release.running}, current {release.current}")
    if release.current is not None and not release.current_exists:
        out.append(f"current points to a missing release ({release.current_path or release.current})")
    elif release.current is not None and not release.build_stamp:
        out.append(f"release {release.current} has no build stamp (build incomplete or failed)")
    out.extend(lock_warnings(facts))
    if facts.disk is not None:
        low_pct = facts.disk.used_pct is not None and facts.disk.used_pct >= LOW_DISK_PCT
        if facts.disk.avail_kib < LOW_DISK_KIB or low_pct:
            out.append(f"disk low: {facts.disk.avail_kib / 1024 / 1024:.1f} GiB free on "
                       f"{facts.disk.mount} ({facts.disk.used_pct}% used)")
    elif facts.disk_detail:
        out.append(f"disk free unknown: {facts.disk_detail}")
    return out


def _production_warnings(host: Host, facts: HostFacts) -> list[str]:
    """A `role: prod` host whose service is not running, not held for development: the situation
    after a restart that status exists to answer. The service column says the state; this says it
    is production that is down, and the command that brings it back."""
    from ddtreectl.probes.mode_lease import lease_from_state_files
    from ddtreectl.probes.words import service_condition

    service = facts.service
    if host.role != "prod" or service is None:
        return []
    lease = lease_from_state_files(facts.state_files)
    if lease is not None and lease.mode == "dev":
        return []  # taken for development on purpose (the mode line says by whom)
    condition = service_condition(service)
    if condition.kind == "not-installed":
        return [f"production service {service.unit} is not installed: `ddtreectl deploy --host {host.name}` "
                "installs it"]
    if condition.kind not in ("failed", "stopped-enabled", "stopped-disabled", "stopped-static"):
        return []
    why = f"; `ddtreectl logs {host.name}` shows why it failed" if condition.kind == "failed" else ""
    return [f"production service {service.unit} is not running: `ddtreectl restore-service {host.name}` "
            f"starts it and verifies it is healthy{why}"]


def lock_warnings(facts: HostFacts, now: float | None = None) -> list[str]:
    """Held host locks (deploy, ...), from the owner records the probe passed through. An automatic
    lock past its TTL is named STALE: its ddtreectl died; the next deploy takes it over."""
    out: list[str] = []
    clock = time.time() if now is None else now
    for path, text in sorted(facts.state_files.items()):
        if not (path.startswith("state/locks/") and path.endswith(".lock/owner.json")):
            continue
        name = path[len("state/locks/"):-len(".lock/owner.json")]
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            out.append(f"{name} lock held (unreadable owner record {path})")
            continue
        since = int(data.get("since") or 0)
        ttl = int(data.get("ttl_s") or 0)
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
        who = f"{data.get('owner', '?')} since {when}: {data.get('reason') or 'no reason given'}"
        if data.get("kind") == "auto" and ttl > 0 and clock > since + ttl:
            out.append(f"{name} lock STALE (automatic, expired {int(clock - since - ttl)} s ago), was held by {who}")
        elif data.get("kind") == "auto":
            out.append(f"{name} lock held by {who} (automatic, expires after {ttl} s)")
        else:
            out.append(f"{name} lock held by {who} (manual: never expires)")
    return out


def _gpu_warnings(host: Host, facts: HostFacts) -> list[str]:
    gpus = facts.gpus
    out: list[str] = []
    if gpus.status == "missing":
        if host.gpus:
            out.append(f"nvidia-smi missing (expected {host.gpus} GPUs)")
        return out
    if gpus.status == "timeout":
        out.append(f"nvidia-smi timed out: {gpus.detail}")
    elif gpus.status == "error":
        out.append(f"nvidia-smi failed: {gpus.detail}")
    elif gpus.detail:
        out.append(gpus.detail)
    found = len(gpus.gpus)
    if gpus.status in ("ok", "no-devices") and found != host.gpus:
        out.append(f"expected {host.gpus} GPUs, found {found}")
    if gpus.status == "ok" and gpus.duration_ms is not None and gpus.duration_ms >= SLOW_NVIDIA_SMI_MS:
        out.append(f"nvidia-smi slow ({gpus.duration_ms} ms; persistence mode off?)")
    off = [str(g.index) for g in gpus.gpus if g.persistence_mode is False]
    if off:
        out.append(f"persistence mode off on GPU {','.join(off)}")
    if host.gpu_uuids and gpus.status == "ok":
        missing = sorted(set(host.gpu_uuids) - {g.uuid for g in gpus.gpus})
        if missing:
            out.append(f"{len(missing)} recorded GPU UUID(s) not found (e.g. {missing[0]}): "
                       "GPU swapped or another machine?")
    return out
