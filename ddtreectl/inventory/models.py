"""Typed, frozen models of the inventory: hosts, groups, service profiles.

These are the only shapes the rest of ddtreectl sees; `loader.py` builds them from `hosts.yaml`
after validating every key, so code above this layer may trust every field.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Literal, Mapping

def did_you_mean(name: str, known: Iterable[str]) -> str:
    """" (did you mean 'X'?)" for the closest of `known`, or "" when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


Role = Literal["prod", "dev"]
TransportKind = Literal["ssh", "local"]


@dataclass(frozen=True)
class HealthSettings:
    """Per-phase and total timeouts (seconds) of the restore-service gate, and the readiness path."""

    readiness_path: str = "/health_generate"
    unit_active_timeout: float = 120.0
    port_open_timeout: float = 1800.0
    liveness_timeout: float = 1800.0
    readiness_timeout: float = 1800.0
    total_timeout: float = 3600.0


@dataclass(frozen=True)
class ServiceProfile:
    """What a host serves: the unit template and the values rendered into it."""

    name: str
    template: str
    port: int
    model_path: str
    served_model_name: str
    tp_size: int = 1
    unit_name: str = ""  # systemd unit name without ".service"; defaults to the profile name
    extra_args: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    speculative: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()  # multi-node: host names in rank order (rank 0 serves HTTP)
    dist_init_port: int = 0
    nccl_interface: str = ""
    health: HealthSettings = field(default_factory=HealthSettings)
    # How the unit starts the server: `<python> -m <module> --config <rendered yaml>`, unless an explicit
    # `exec_start` is given. `python` must be an absolute path (systemd does not search PATH for us).
    python: str = "/usr/bin/python3"
    module: str = "sglang.launch_server"
    exec_start: str = ""
    user: str = "root"
    restart_sec: int = 10
    start_timeout: int = 1800  # TimeoutStartSec: TP-8 loads and kernel warm-up take many minutes
    stop_timeout: int = 120

    @property
    def unit(self) -> str:
        """The systemd unit file name, e.g. `sglang-k26-ddtree.service`."""
        return f"{self.unit_name or self.name}.service"


@dataclass(frozen=True)
class BuildSettings:
    """How deploy builds the engine on a host. `cuda_archs` applies only where the host has no GPU to
    detect (then empty means the engine's default); `cmake_args` are extra `-DNAME=VALUE` options."""

    cuda_archs: tuple[str, ...] = ()
    cmake_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Host:
    """One machine ddtreectl manages, keyed by its NAME (never by its address)."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    identity_file: str | None = None
    jump_host: str | None = None  # a host name from the same inventory (ProxyJump)
    transport: TransportKind = "ssh"
    gpus: int = 0  # expected GPU count; 0 means the host has none
    role: Role = "dev"
    service: str | None = None  # service profile name
    host_key: str | None = None  # pinned public key, "ssh-ed25519 AAAA..." (None: not yet trusted)
    machine_id: str | None = None  # /etc/machine-id recorded at first contact
    gpu_uuids: tuple[str, ...] = ()  # GPU UUIDs recorded at first contact
    remote_root: str = "/opt/ddtree"
    keep_releases: int = 5
    build: BuildSettings = field(default_factory=BuildSettings)
    connect_timeout: float = 5.0
    command_timeout: float = 60.0
    ssh_reuse: bool = True  # status may keep an OpenSSH master to the host warm (transport/mux.py)
    line: int = 0  # line of the host's entry in the inventory file (for messages)


@dataclass(frozen=True)
class InventoryWarning:
    """A value the loader accepts that is still wrong for a shared inventory (a scoped IPv6 address):
    `message` names the file, line and key path, as a validation error does."""

    host: str
    message: str
    hint: str


@dataclass(frozen=True)
class Inventory:
    """A validated inventory file."""

    path: Path
    hosts: Mapping[str, Host]
    groups: Mapping[str, tuple[str, ...]]
    services: Mapping[str, ServiceProfile]
    warnings: tuple[InventoryWarning, ...] = ()
    # About the machine reading the file, not the file: an identity_file missing HERE (see
    # loader._missing_identity_files). Only `validate` shows them; a connect says so itself.
    machine_warnings: tuple[InventoryWarning, ...] = ()

    def warnings_of(self, name: str) -> tuple[InventoryWarning, ...]:
        """The inventory's warnings about host `name`'s entry."""
        return tuple(w for w in self.warnings if w.host == name)

    def host(self, name: str) -> Host:
        """The host called `name`; raises InventoryError naming the known hosts otherwise."""
        from ddtreectl.errors import InventoryError

        try:
            return self.hosts[name]
        except KeyError:
            known = ", ".join(sorted(self.hosts)) or "none"
            raise InventoryError(
                f"{self.path.name}: no host named {name!r}{did_you_mean(name, self.hosts)} (known: {known})",
                hint=f"add it under hosts: in {self.path} or check the spelling",
            ) from None

    def resolve(self, targets: list[str] | tuple[str, ...]) -> list[Host]:
        """Expand host names, group names and `all` to hosts, in order, without duplicates.

        An empty target list means every host.
        """
        from ddtreectl.errors import InventoryError

        names: list[str] = []
        for target in targets or ["all"]:
            if target == "all":
                names.extend(self.hosts)
            elif target in self.hosts:
                names.append(target)
            elif target in self.groups:
                names.extend(self.groups[target])
            else:
                raise InventoryError(
                    f"{self.path.name}: {target!r} is neither a host nor a group"
                    + did_you_mean(target, [*self.hosts, *self.groups, "all"]),
                    hint="hosts: " + ", ".join(sorted(self.hosts))
                    + "; groups: " + (", ".join(sorted(self.groups)) or "none"),
                )
        if not names:
            # An empty group or an inventory without hosts: every command did nothing and exited 0
            # (`deploy GROUP` "succeeded" having deployed nowhere).
            empty = next((t for t in targets if t in self.groups), None)
            raise InventoryError(
                f"{self.path.name}: group {empty!r} is empty: no host to act on" if empty
                else f"{self.path.name}: the inventory has no hosts: no host to act on",
                hint=f"list host names under groups.{empty} in {self.path}" if empty
                else f"add hosts under hosts: in {self.path}",
            )
        return [self.hosts[n] for n in dict.fromkeys(names)]

    def service_of(self, host: Host) -> ServiceProfile | None:
        """The service profile the host runs, if any."""
        return self.services[host.service] if host.service else None
