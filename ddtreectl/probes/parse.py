"""Pure parsers for the status probe's output (scripts/status.sh) and the tools it runs.

Every function takes text and returns frozen facts; none touches a host. Tested on fixtures of real
output in tests/probes/fixtures/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from ddtreectl.probes.facts import (
    ComputeApp,
    DiskState,
    GpuInfo,
    GpuProbeStatus,
    GpuState,
    ReleaseState,
    ServiceState,
)

_BEGIN = "@@ddtree-begin "
_END = "@@ddtree-end "


@dataclass(frozen=True)
class Section:
    """One `@@ddtree-begin NAME [ARG]` ... `@@ddtree-end NAME rc=N ms=N` block of probe output."""

    name: str
    arg: str
    body: str
    rc: int | None  # None: the output was cut before the end marker
    ms: int | None
    missing: bool  # the tool the section runs is not installed


def split_sections(text: str) -> list[Section]:
    """Cut probe output into sections; text outside any section is ignored (login banners)."""
    sections: list[Section] = []
    name = arg = ""
    body: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(_BEGIN):
            if body is not None:  # previous section never ended: keep what it printed
                sections.append(Section(name, arg, _join(body), None, None, False))
            name, _, arg = line[len(_BEGIN):].strip().partition(" ")
            body = []
        elif line.startswith(_END) and body is not None:
            attrs = dict(
                part.split("=", 1) for part in line[len(_END):].split()[1:] if "=" in part
            )
            sections.append(
                Section(name, arg, _join(body), _int(attrs.get("rc")), _int(attrs.get("ms")),
                        attrs.get("missing") == "1")
            )
            body = None
        elif body is not None:
            body.append(line)
    if body is not None:
        sections.append(Section(name, arg, _join(body), None, None, False))
    return sections


def _join(lines: list[str]) -> str:
    return "\n".join(lines).strip("\n")


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


def parse_key_values(text: str) -> dict[str, str]:
    """`key=value` lines -> dict (later keys win; lines without `=` are ignored)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


# --- nvidia-smi -----------------------------------------------------------------------------------

# Values nvidia-smi prints instead of a number; all mean "unknown", none means zero.
_NOT_A_VALUE = re.compile(r"^\[?(N/A|Not Supported|Insufficient Permissions|Unknown Error|"
                          r"GPU is lost|Requires Reboot|Not Available|Unknown)\]?$", re.IGNORECASE)


def _field(value: str) -> str | None:
    value = value.strip()
    return None if not value or _NOT_A_VALUE.match(value) else value


def _number(value: str) -> int | None:
    text = _field(value)
    if text is None:
        return None
    try:
        return int(round(float(text.replace(",", "."))))
    except ValueError:
        return None


def parse_gpus(csv_text: str) -> list[GpuInfo]:
    """Parse `nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,
    persistence_mode,compute_cap --format=csv,noheader,nounits`. Lines of another shape (error
    text) are skipped; `gpu_state` reports them."""
    gpus: list[GpuInfo] = []
    for line in csv_text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 8 or not parts[1].startswith(("GPU-", "MIG-", "[")):
            continue
        persistence = (_field(parts[6]) or "").lower()
        gpus.append(GpuInfo(
            index=_number(parts[0]),
            uuid=parts[1],
            name=parts[2],
            memory_used_mib=_number(parts[3]),
            memory_total_mib=_number(parts[4]),
            utilization_pct=_number(parts[5]),
            persistence_mode={"enabled": True, "disabled": False}.get(persistence),
            compute_cap=_field(parts[7]),
        ))
    return gpus


def parse_compute_apps(csv_text: str) -> list[ComputeApp]:
    """Parse `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory
    --format=csv,noheader,nounits`. A process name may itself contain commas."""
    apps: list[ComputeApp] = []
    for line in csv_text.splitlines():
        head = line.split(",", 2)
        if len(head) != 3 or not head[0].strip().startswith(("GPU-", "MIG-")):
            continue
        name, sep, memory = head[2].rpartition(",")
        if not sep:
            continue
        apps.append(ComputeApp(
            gpu_uuid=head[0].strip(),
            pid=_number(head[1]),
            process_name=name.strip(),
            used_memory_mib=_number(memory),
        ))
    return apps


def _unexpected_lines(text: str, known: int) -> list[str]:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[known:] if known < len(lines) else []


def gpu_state(gpus: Section | None, apps: Section | None) -> GpuState:
    """Combine the probe's two nvidia-smi sections into one GpuState saying what went wrong."""
    if gpus is None:
        return GpuState(status="not-run", detail="the probe output has no GPU section")
    if gpus.missing:
        return GpuState(status="missing", detail="nvidia-smi is not installed", duration_ms=0)
    parsed = tuple(parse_gpus(gpus.body))
    text = gpus.body.strip()
    status: GpuProbeStatus
    detail = ""
    if gpus.rc in (124, 137):
        status, detail = "timeout", f"nvidia-smi did not answer in time (exit {gpus.rc})"
    elif "no devices were found" in text.lower():
        status, detail = "no-devices", "No devices were found"
    elif gpus.rc != 0 or (text and not parsed):
        status = "error"
        detail = _first_line(text) or f"nvidia-smi exited {gpus.rc}"
    else:
        status = "ok"
        stray = [ln for ln in text.splitlines()
                 if ln.strip() and ln not in _gpu_lines(text, parsed)]
        if stray:
            detail = "unexpected nvidia-smi output: " + stray[0].strip()
    apps_known = apps is not None and apps.rc == 0 and not apps.missing and status == "ok"
    app_list = tuple(parse_compute_apps(apps.body)) if apps is not None and apps_known else ()
    if apps is not None and status == "ok" and not apps_known:
        detail = detail or "compute-apps query failed: " + (_first_line(apps.body) or f"exit {apps.rc}")
    return GpuState(status=status, gpus=parsed, apps=app_list, apps_known=apps_known,
                    detail=detail, duration_ms=gpus.ms)


def _gpu_lines(text: str, parsed: tuple[GpuInfo, ...]) -> set[str]:
    uuids = {g.uuid for g in parsed}
    return {ln for ln in text.splitlines() if any(u in ln for u in uuids)}


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


# --- systemctl show -------------------------------------------------------------------------------

_TIMESTAMP = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?: (\S+))?$")


def parse_timestamp(value: str) -> int | None:
    """systemd timestamps -> Unix seconds: `@1732900000` (--timestamp=unix) or `Day YYYY-MM-DD
    HH:MM:SS UTC`; the weekday may be in any locale. Other zones stay unparsed (None)."""
    value = value.strip()
    if not value or value == "n/a":
        return None
    if value.startswith("@"):
        return _int(value[1:].split(".")[0])
    match = _TIMESTAMP.search(value)
    if not match or (match.group(2) or "UTC") not in ("UTC", "GMT", "+0000", "Z"):
        return None
    stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    return int(stamp.timestamp())


def parse_systemctl_show(text: str, unit: str) -> ServiceState:
    """Parse `systemctl show -p LoadState,ActiveState,... UNIT` output (key=value lines)."""
    kv = parse_key_values(text)
    if "LoadState" not in kv or "ActiveState" not in kv:
        return ServiceState(unit=unit, known=False,
                            detail=_first_line(text) or "systemctl printed no unit properties")
    main_pid = _int(kv.get("MainPID"))
    return ServiceState(
        unit=unit,
        known=True,
        load_state=kv["LoadState"],
        active_state=kv["ActiveState"],
        sub_state=kv.get("SubState", ""),
        unit_file_state=kv.get("UnitFileState", ""),
        result=kv.get("Result", ""),
        exec_main_status=_int(kv.get("ExecMainStatus")),
        n_restarts=_int(kv.get("NRestarts")),
        active_since_epoch=parse_timestamp(kv.get("ActiveEnterTimestamp", "")),
        active_enter_raw=kv.get("ActiveEnterTimestamp", ""),
        need_daemon_reload={"yes": True, "no": False}.get(kv.get("NeedDaemonReload", "")),
        main_pid=main_pid if main_pid else None,
    )


def service_state(section: Section | None, unit: str, pid1: str) -> ServiceState:
    """The unit's state, or why it is unknown (no systemctl, systemd not PID 1, ...)."""
    if section is None:
        return ServiceState(unit=unit, known=False, detail="the probe output has no service section")
    if section.missing:
        return ServiceState(unit=unit, known=False, detail="systemctl is not installed")
    state = parse_systemctl_show(section.body, unit)
    if not state.known and "not been booted with systemd" in section.body:
        return ServiceState(unit=unit, known=False,
                            detail=f"systemd is not running (PID 1 is {pid1 or 'unknown'})")
    return state


# --- release and disk -----------------------------------------------------------------------------

def _release_id(path: str, root: str) -> str | None:
    """`<root>/releases/<id>/...` -> id; anything else (or a deleted path) -> None."""
    path = path.removesuffix(" (deleted)")
    prefix = root.rstrip("/") + "/releases/"
    if not path.startswith(prefix):
        return None
    return path[len(prefix):].split("/", 1)[0] or None


def parse_release(text: str, stamp_text: str = "") -> ReleaseState:
    """Parse the probe's `release` section (key=value lines; `release=` repeats)."""
    kv = parse_key_values(text)
    root = kv.get("root", "")
    releases = tuple(line[len("release="):] for line in text.splitlines()
                     if line.startswith("release="))
    current_path = kv.get("current_path") or None
    current = _release_id(current_path, root) if current_path else None
    if current is None and kv.get("current_link"):
        current = kv["current_link"].rstrip("/").rsplit("/", 1)[-1]
    running = None
    for key in ("main_exe", "main_cwd"):
        running = running or _release_id(kv.get(key, ""), root)
    return ReleaseState(
        root=root,
        root_exists=kv.get("root_exists") == "1",
        current=current,
        current_path=current_path,
        current_exists=kv.get("current_exists") == "1",
        build_stamp=kv.get("stamp") == "1",
        stamp_text=stamp_text,
        releases=releases,
        running=running,
    )


def parse_df(text: str) -> DiskState | None:
    """Parse `df -P -k PATH`: the header's words vary with the locale, so go by position
    (-P keeps each filesystem on one line; a mount point may contain spaces)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        return None
    fields = lines[1].split()
    if len(fields) < 6:
        return None
    total, avail, capacity = _int(fields[1]), _int(fields[3]), fields[4].rstrip("%")
    if total is None or avail is None:
        return None
    return DiskState(path=fields[0], mount=" ".join(fields[5:]), total_kib=total,
                     avail_kib=avail, used_pct=_int(capacity))
