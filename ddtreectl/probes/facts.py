"""Frozen result types of the status probe: what a host told us, never what we wish it said.

Unknown stays unknown (None), never "idle" or "zero": a GPU whose memory reads `[N/A]` is not free,
and a unit systemd could not describe is not "stopped".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping

# ok: nvidia-smi answered with GPUs · no-devices: it answered "No devices were found" · missing: no
# nvidia-smi binary · timeout: it did not answer within the bound · error: it failed (driver not
# loaded, NVML mismatch, unparsable output) · not-run: the probe output had no GPU section at all.
GpuProbeStatus = Literal["ok", "no-devices", "missing", "timeout", "error", "not-run"]


@dataclass(frozen=True)
class GpuInfo:
    """One line of `nvidia-smi --query-gpu=...`; None where the driver said [N/A] or similar."""

    index: int | None
    uuid: str
    name: str
    memory_used_mib: int | None
    memory_total_mib: int | None
    utilization_pct: int | None
    persistence_mode: bool | None
    compute_cap: str | None


@dataclass(frozen=True)
class ComputeApp:
    """One line of `nvidia-smi --query-compute-apps=...` (pid None: not visible from our PID namespace)."""

    gpu_uuid: str
    pid: int | None
    process_name: str
    used_memory_mib: int | None


@dataclass(frozen=True)
class GpuState:
    """The GPUs of a host and their compute processes, with how the query went."""

    status: GpuProbeStatus
    gpus: tuple[GpuInfo, ...] = ()
    apps: tuple[ComputeApp, ...] = ()
    apps_known: bool = False  # the compute-apps query answered (an empty list then means "none")
    detail: str = ""  # nvidia-smi's own words when it failed or printed something unexpected
    duration_ms: int | None = None

    def busy(self, gpu: GpuInfo) -> bool | None:
        """Whether a GPU is in use: True, False, or None when a signal is unknown.

        Busy = a compute process on it, or memory used above max(512 MiB, 1%), or utilization > 0.
        One utilization sample proves little, so this is a status hint, not the idle gate.
        """
        if self.apps_known and any(app.gpu_uuid == gpu.uuid for app in self.apps):
            return True
        signals: list[bool | None] = [None if not self.apps_known else False]
        if gpu.memory_used_mib is None or gpu.memory_total_mib is None:
            signals.append(None)
        else:
            signals.append(gpu.memory_used_mib > max(512, gpu.memory_total_mib // 100))
        signals.append(None if gpu.utilization_pct is None else gpu.utilization_pct > 0)
        if any(s is True for s in signals):
            return True
        return None if any(s is None for s in signals) else False


@dataclass(frozen=True)
class ServiceState:
    """`systemctl show` of the host's unit. `known` is False when systemd could not be asked."""

    unit: str
    known: bool
    load_state: str = ""
    active_state: str = ""
    sub_state: str = ""
    unit_file_state: str = ""
    result: str = ""
    exec_main_status: int | None = None
    n_restarts: int | None = None
    active_since_epoch: int | None = None  # ActiveEnterTimestamp as Unix seconds, when parsable
    active_enter_raw: str = ""
    need_daemon_reload: bool | None = None
    main_pid: int | None = None
    detail: str = ""  # why `known` is False


@dataclass(frozen=True)
class ServiceHealth:
    """Whether an active unit serves yet (status.sh, health): its port open, and `/health`'s answer
    (SGLang and the reference server answer 503 while the model loads)."""

    port: int
    listening: bool | None  # None: /proc/net/tcp{,6} unreadable
    http_status: int | None  # None: not asked (port closed, no curl/python3) or no answer (see `answered`)
    asked: bool  # a GET was sent (curl or python3 on the host)

    @property
    def serving(self) -> bool | None:
        """True: /health said 200; False: port closed, an error status or no answer; None: not known."""
        if self.listening is False:
            return False
        if not self.asked:
            return None
        return self.http_status == 200


@dataclass(frozen=True)
class ReleaseState:
    """What `<remote_root>/current` points to, whether it was built, and what the service runs."""

    root: str
    root_exists: bool
    current: str | None = None  # release id (directory name under releases/)
    current_path: str | None = None
    current_exists: bool = False
    build_stamp: bool = False
    stamp_text: str = ""
    releases: tuple[str, ...] = ()
    running: str | None = None  # release id the service's main process was started from

    @property
    def restart_pending(self) -> bool:
        """The service runs another release than `current` (switched, not yet restarted)."""
        return self.running is not None and self.current is not None and self.running != self.current


@dataclass(frozen=True)
class DiskState:
    """`df -P -k` of the remote root (or its nearest existing parent)."""

    path: str
    mount: str
    total_kib: int
    avail_kib: int
    used_pct: int | None


@dataclass(frozen=True)
class OtherUnit:
    """A unit ddtreectl installed on the host that the inventory no longer renders there (its
    profile's unit name changed, or the host's service was removed): it keeps its port and GPUs
    while it runs."""

    unit: str
    installed: bool  # /etc/systemd/system/<unit> exists
    active: str  # `systemctl is-active` ("unknown": systemd could not be asked)
    enabled: str  # `systemctl is-enabled`

    @property
    def running(self) -> bool:
        """Anything but stopped: a unit starting, reloading or stopping still holds what it holds."""
        return self.active not in ("inactive", "failed", "unknown")

    @property
    def present(self) -> bool:
        """Still there in some form (a file, a loaded or enabled unit): worth reporting and removing."""
        return self.installed or self.running or self.enabled not in ("", "unknown", "not-found")


@dataclass(frozen=True)
class HostFacts:
    """Everything one status probe learned about a host."""

    hostname: str
    machine_id: str
    boot_id: str
    uptime_s: float | None
    kernel: str
    user: str
    pid1: str  # comm of PID 1 ("systemd" on a systemd host)
    gpus: GpuState
    service: ServiceState | None  # None: the host runs no service profile
    release: ReleaseState
    disk: DiskState | None
    disk_detail: str = ""
    state_files: Mapping[str, str] = field(default_factory=dict)  # path under root -> raw text
    unit_sha256: str | None = None  # of /etc/systemd/system/<unit> (None: not there or not hashed)
    unit_dropins: tuple[str, ...] = ()  # drop-in files overriding the unit
    # Lines of /etc/ssh/ssh_host_*_key.pub; None: the probe output had no such section (older
    # probe), () : the host has none readable there.
    host_keys: tuple[str, ...] | None = None
    # Whether the port this probe's SSH connection came in on still has a listener (status.sh,
    # sshlisten); None: not known (not over SSH, or an older probe).
    sshd_listening: bool | None = None
    # Units ddtreectl installed that are not the one rendered for the host now (status.sh, otherunits).
    other_units: tuple[OtherUnit, ...] = ()
    # The service's readiness when its unit is active and it serves HTTP here (status.sh, health);
    # None: not probed (unit not active, no port on this host: a multi-node rank > 0, an older probe).
    health: ServiceHealth | None = None
