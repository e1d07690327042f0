"""The status probe: ONE shell script per host (scripts/status.sh), one round trip, parsed into HostFacts."""

from __future__ import annotations

import shlex
from functools import lru_cache
from importlib import resources
from typing import Any

from ddtreectl.errors import RemoteCommandError
from ddtreectl.probes.facts import HostFacts, OtherUnit, ServiceHealth
from ddtreectl.probes.parse import (
    Section,
    gpu_state,
    parse_df,
    parse_key_values,
    parse_release,
    service_state,
    split_sections,
)
from ddtreectl.transport.base import Transport

# nvidia-smi normally answers in ~25 ms; with persistence mode off it has taken tens of seconds on
# 8-GPU hosts (shared/ops-notes.md). Bound it well below the command timeout so the rest still arrives.
DEFAULT_GPU_TIMEOUT_S = 10


@lru_cache(maxsize=None)
def load_script(name: str) -> str:
    """The text of a probe script shipped as package data (ddtreectl/probes/scripts/NAME)."""
    return resources.files("ddtreectl.probes").joinpath("scripts", name).read_text(encoding="utf-8")


def status_command(unit: str, remote_root: str, gpu_timeout_s: int = DEFAULT_GPU_TIMEOUT_S,
                   port: int | None = None) -> str:
    """The complete remote command: `sh -c SCRIPT ddtree-probe UNIT ROOT GPU_TIMEOUT PORT`, all quoted
    (PORT: the service's HTTP port on this host, asked for its readiness when the unit is active).

    The script travels as an argument (not stdin) so it needs nothing from the transport but a
    command string, and runs under /bin/sh whatever the user's login shell is.
    """
    parts = ["sh", "-c", load_script("status.sh"), "ddtree-probe", unit, remote_root,
             str(int(gpu_timeout_s)), str(port) if port else ""]
    return " ".join(shlex.quote(p) for p in parts)


def parse_status_output(text: str, *, unit: str | None) -> HostFacts:
    """HostFacts from the probe's output. Raises ValueError when it is not probe output at all."""
    sections = split_sections(text)
    by_name: dict[str, Section] = {}
    files: dict[str, str] = {}
    for section in sections:
        if section.name == "file":
            files[section.arg] = section.body
        else:
            by_name.setdefault(section.name, section)
    if "meta" not in by_name:
        raise ValueError("no @@ddtree-begin meta section in the probe output")
    meta = parse_key_values(by_name["meta"].body)
    release = by_name.get("release")
    stamp = by_name.get("stamp")
    disk = by_name.get("disk")
    disk_state = parse_df(disk.body) if disk is not None and disk.rc == 0 else None
    return HostFacts(
        hostname=meta.get("hostname", ""),
        machine_id=meta.get("machine_id", ""),
        boot_id=meta.get("boot_id", ""),
        uptime_s=_float(meta.get("uptime", "")),
        kernel=meta.get("kernel", ""),
        user=meta.get("user", ""),
        pid1=meta.get("pid1", ""),
        gpus=gpu_state(by_name.get("gpus"), by_name.get("apps")),
        service=service_state(by_name.get("service"), unit, meta.get("pid1", "")) if unit else None,
        release=parse_release(release.body if release else "", stamp.body if stamp else ""),
        disk=disk_state,
        disk_detail="" if disk_state else _disk_detail(disk),
        state_files=files,
        host_keys=_host_keys(by_name.get("hostkeys")),
        sshd_listening=_sshd_listening(by_name.get("sshlisten")),
        other_units=_other_units(by_name.get("otherunits")),
        health=_health(by_name.get("health")),
        **_unit_file(by_name.get("unitfile")),
    )


def _other_units(section: Section | None) -> tuple[OtherUnit, ...]:
    """The `otherunits` section: one `unit=NAME file=0|1 active=STATE enabled=STATE` line each; a unit
    whose file is gone and that systemd no longer runs or enables is left out (nothing to remove)."""
    if section is None:
        return ()
    found = []
    for line in section.body.splitlines():
        fields = {key: value for key, _, value in (part.partition("=") for part in line.split())}
        if not fields.get("unit"):
            continue
        unit = OtherUnit(fields["unit"], fields.get("file") == "1", fields.get("active") or "unknown",
                         fields.get("enabled") or "unknown")
        if unit.present:
            found.append(unit)
    return tuple(found)


def _unit_file(section: Section | None) -> dict[str, Any]:
    """unit_sha256 and unit_dropins from the `unitfile` section (absent for hosts without a unit)."""
    if section is None:
        return {}
    sha = None
    dropins = []
    for line in section.body.splitlines():
        key, _, value = line.partition("=")
        if key == "sha256" and value.strip():
            sha = value.split()[0]  # sha256sum prints "HEX  -"
        elif key == "dropin" and value:
            dropins.append(value.strip())
    return {"unit_sha256": sha, "unit_dropins": tuple(dropins)}


def _host_keys(section: Section | None) -> tuple[str, ...] | None:
    if section is None:
        return None
    return tuple(line.strip() for line in section.body.splitlines() if line.strip())


def _sshd_listening(section: Section | None) -> bool | None:
    """The `sshlisten` section: `port=N listening=0|1`; None when absent or unreadable."""
    if section is None:
        return None
    fields = dict(part.partition("=")[::2] for part in section.body.split())
    return {"1": True, "0": False}.get(fields.get("listening", ""))


def _health(section: Section | None) -> ServiceHealth | None:
    """The `health` section: `port=N listening=0|1|` then `tool=curl|python3| code=NNN` (000: no answer)."""
    if section is None:
        return None
    fields = dict(part.partition("=")[::2] for part in section.body.split())
    if not fields.get("port", "").isdigit():
        return None
    code = fields.get("code", "")
    status = int(code) if code.isdigit() and int(code) > 0 else None
    return ServiceHealth(int(fields["port"]), {"1": True, "0": False}.get(fields.get("listening", "")),
                         status, bool(fields.get("tool")))


def _disk_detail(section: Section | None) -> str:
    if section is None:
        return "the probe output has no disk section"
    if section.missing:
        return "df is not installed"
    return section.body.strip().splitlines()[0] if section.body.strip() else f"df exited {section.rc}"


def _float(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def probe_status(transport: Transport, *, unit: str | None, remote_root: str,
                 timeout: float, gpu_timeout_s: int = DEFAULT_GPU_TIMEOUT_S, port: int | None = None) -> HostFacts:
    """Run the status probe on an open transport and parse it (one round trip). `port`: the service's
    HTTP port on this host, whose /health says whether an active unit serves yet or still loads."""
    command = status_command(unit or "", remote_root, gpu_timeout_s, port)
    result = transport.run(command, timeout=timeout)
    try:
        return parse_status_output(result.stdout, unit=unit)
    except ValueError:
        said = (result.stderr or result.stdout).strip().splitlines()
        raise RemoteCommandError(
            f"status probe failed (exit {result.exit_code}): {said[-1] if said else 'no output'}",
            hint="check that /bin/sh works for the SSH user (`ssh HOST sh -c true`)",
            host=transport.host_name,
        ) from None
