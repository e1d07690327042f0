"""Load `hosts.yaml` into the frozen models, validating every key with file:line + key-path errors.

The schema is the tables below: one converter per key. Every problem found is reported at once
(ordered by line); the first one's hint is shown. Cross-references (service profiles, jump hosts,
group members, multi-node peers) are checked after every section is read.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator, Mapping

from yaml.nodes import Node, ScalarNode

from ddtreectl.errors import InventoryError
from ddtreectl.inventory import checks
from ddtreectl.inventory.fields import (
    INVALID,
    Converter,
    choice,
    flag,
    integer,
    nullable,
    seconds,
    text,
    text_list,
    text_map,
)
from ddtreectl.inventory.models import (
    BuildSettings, HealthSettings, Host, Inventory, InventoryWarning, ServiceProfile, did_you_mean,
)
from ddtreectl.inventory.yamltree import Problems, compose, join, kind, line_of, mapping

LOCAL_ADDRESS = "127.0.0.1"
RESERVED_NAMES = ("all",)  # `all` is the target that means every host

HOST_FIELDS: dict[str, Converter] = {
    "address": text(checks.address_problem, hint="use an IPv4/IPv6 address or a DNS host name"),
    "port": integer(1, 65535),
    "user": text(checks.user_problem),
    "identity_file": nullable(text(checks.path_problem)),
    "jump_host": nullable(text(checks.name_problem)),
    "transport": choice(("ssh", "local")),
    "gpus": integer(0, hint="the number of GPUs the host should have (0 for none)"),
    "role": choice(("prod", "dev")),
    "service": nullable(text(checks.name_problem)),
    "host_key": nullable(
        text(checks.host_key_problem, hint="set it to null and run `ddtreectl trust HOST` to record it")
    ),
    "machine_id": nullable(text(checks.machine_id_problem)),
    "gpu_uuids": text_list(checks.gpu_uuid_problem),
    "remote_root": text(checks.path_problem),
    "keep_releases": integer(2, hint="keep at least the current and the previous release"),
    "connect_timeout": seconds(),
    "command_timeout": seconds(),
    "ssh_reuse": flag(),
    "build": lambda node, path, problems: _build(node, path, problems),
}
# Facts that identify ONE machine can never come from defaults.
PER_HOST_ONLY = ("address", "host_key", "machine_id", "gpu_uuids")
DEFAULT_FIELDS = {k: v for k, v in HOST_FIELDS.items() if k not in PER_HOST_ONLY}

HEALTH_FIELDS: dict[str, Converter] = {
    "readiness_path": text(checks.http_path_problem),
    "unit_active_timeout": seconds(),
    "port_open_timeout": seconds(),
    "liveness_timeout": seconds(),
    "readiness_timeout": seconds(),
    "total_timeout": seconds(),
}

BUILD_FIELDS: dict[str, Converter] = {
    "cuda_archs": text_list(checks.cuda_arch_problem),
    "cmake_args": text_list(checks.cmake_arg_problem, unique=False),
}

SERVICE_FIELDS: dict[str, Converter] = {
    "template": text(checks.template_problem),
    "port": integer(1, 65535),
    "model_path": text(checks.model_path_problem),
    "served_model_name": text(checks.text_problem),
    "tp_size": integer(1),
    "unit_name": text(checks.unit_problem),
    "extra_args": text_list(checks.text_problem, unique=False),
    "environment": text_map(checks.env_name_problem, checks.text_problem),
    "speculative": text_map(checks.name_problem, checks.text_problem, typed=True),
    "nodes": text_list(checks.name_problem),
    "dist_init_port": integer(1, 65535),
    "nccl_interface": text(checks.interface_problem),
    "health": lambda node, path, problems: _health(node, path, problems),
    "python": text(checks.python_problem),
    "module": text(checks.module_problem),
    "exec_start": text(checks.text_problem),
    "user": text(checks.user_problem),
    "restart_sec": integer(0),
    "start_timeout": integer(1),
    "stop_timeout": integer(1),
}
SERVICE_REQUIRED = ("template", "port", "model_path", "served_model_name")

TOP_LEVEL: tuple[str, ...] = ("defaults", "services", "hosts", "groups")

Values = dict[str, tuple[Any, Node]]  # key -> (converted value, node it came from)


def load(path: Path) -> Inventory:
    """Read, validate and build the inventory at `path`; raises InventoryError (exit 3)."""
    return parse(_read(path), path)


def parse(text: str, path: Path) -> Inventory:
    """Validate and build an inventory from `text` (messages name `path` as given).

    Separate from `load` so an edit can be checked before it is written.
    """
    filename = str(path)
    root = compose(text, filename)
    problems = Problems(filename)
    if root is None:
        raise InventoryError(f"{filename}:1: the inventory is empty", hint="it needs at least a hosts: section")
    top = mapping(root, "", problems, what="a mapping with hosts:, services:, groups:, defaults:")
    if top is None:
        problems.raise_if_any()
        raise AssertionError("unreachable: mapping() reported the problem")
    _unknown_keys(top, "", TOP_LEVEL, "at the top level", problems)
    if "hosts" not in top:
        problems.add(root, "", "missing required section 'hosts:'", hint="add hosts: with at least one host")

    defaults_node = top["defaults"][1] if "defaults" in top else None
    defaults, _ = _section_fields(defaults_node, "defaults", DEFAULT_FIELDS, "in defaults", problems)
    services, service_nodes = _services(top.get("services"), problems)
    hosts = _hosts(top.get("hosts"), defaults, problems)
    groups = _groups(top.get("groups"), hosts, problems)
    _check_references(hosts, services, service_nodes, problems)
    problems.raise_if_any()
    return Inventory(
        path=path,
        hosts=MappingProxyType({name: _build_host(name, v) for name, v in hosts.items()}),
        groups=MappingProxyType(groups),
        services=MappingProxyType(services),
        warnings=tuple(_scoped_addresses(hosts, filename)),
        machine_warnings=tuple(_missing_identity_files(hosts, filename)),
    )


def _missing_identity_files(hosts: Mapping[str, _HostEntry], filename: str) -> Iterator[InventoryWarning]:
    """An SSH host's identity_file that this machine lacks (or cannot read) showed up only at connect
    time, as "login failed". A warning, not an error: the file is shared, the key is this machine's
    (a CI job validating the inventory has no operator keys), and the other hosts are still fine."""
    for name, entry in hosts.items():
        raw, node = entry.values.get("identity_file", (None, None))
        if not isinstance(raw, str) or not raw or entry.values.get("transport", ("ssh", None))[0] == "local":
            continue
        path = os.path.expanduser(raw)
        problem = ("does not exist on this machine" if not os.path.exists(path) else
                   "is not a file" if not os.path.isfile(path) else
                   "is not readable by this user" if not os.access(path, os.R_OK) else None)
        if problem is not None:
            fix = f"create it (ssh-keygen -t ed25519 -f {raw}) or " if not os.path.exists(path) else ""
            yield InventoryWarning(name, f"{filename}:{line_of(node)}: identity_file of host {name}: {raw} {problem}",
                                   f"{fix}point identity_file at your private key; connecting fails until then")


def _scoped_addresses(hosts: Mapping[str, _HostEntry], filename: str) -> Iterator[InventoryWarning]:
    """A scoped IPv6 address (`fe80::1%eth0`) is accepted, not an error: it does reach the host from
    the one machine whose interface it names, and refusing the file would stop every command for every
    host in it, `set-ip` (which replaces the address) and `status` of the others included. It is still
    wrong in a shared file (set-ip never writes one), so each command warns, naming file, line and host."""
    for name, entry in hosts.items():
        address, node = entry.values.get("address", (None, None))
        words = checks.zone_problem(name, address) if isinstance(address, str) else None
        if words is not None:
            yield InventoryWarning(name, f"{filename}:{line_of(node)}: hosts.{name}.address: {words[0]}", words[1])


def _read(path: Path) -> str:
    hint = "pass --inventory/-i PATH or set DDTREECTL_INVENTORY (the project ships hosts.yaml at its root)"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InventoryError(f"{path}: inventory file not found", hint=hint) from None
    except IsADirectoryError:
        raise InventoryError(f"{path}: is a directory, not an inventory file", hint=hint) from None
    except PermissionError:
        raise InventoryError(f"{path}: cannot read the inventory: permission denied", hint=hint) from None
    except OSError as err:
        raise InventoryError(f"{path}: cannot read the inventory: {err.strerror}", hint=hint) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise InventoryError(
            f"{path}:{line}: the inventory is not UTF-8 text", hint="save the file as UTF-8"
        ) from None


def _unknown_keys(
    entries: Mapping[str, tuple[ScalarNode, Node]],
    path: str,
    allowed: tuple[str, ...] | Mapping[str, Any],
    where: str,
    problems: Problems,
) -> set[str]:
    """Report keys outside `allowed`; returns the allowed names suggested for misspelled keys."""
    names = tuple(allowed)
    suggested: set[str] = set()
    for name, (key, _) in entries.items():
        if name in names:
            continue
        if path == "defaults" and name in PER_HOST_ONLY:
            problems.add(
                key, join(path, name), f"{name!r} cannot have a default: it identifies one host",
                hint=f"move {name}: under each host in hosts:",
            )
            continue
        close = difflib.get_close_matches(name, names, n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        suggested.update(close)
        problems.add(
            key, join(path, name), f"unknown key {name!r}{guess}",
            hint=f"allowed keys {where}: {', '.join(names)}",
        )
    return suggested


def _section_fields(
    node: Node | None, path: str, schema: Mapping[str, Converter], where: str, problems: Problems
) -> tuple[Values, set[str] | None]:
    """Convert the keys of one mapping section (defaults, a host, a profile) by `schema`.

    Returns the valid values and the names of every key present (valid or not, and those a
    misspelled key was probably meant to be), so a key that is present but wrong is not also
    reported as missing; None instead of names when the section is not a mapping at all.
    """
    if node is None or (isinstance(node, ScalarNode) and kind(node) == "null"):
        return {}, set()
    entries = mapping(node, path, problems)
    if entries is None:
        return {}, None
    suggested = _unknown_keys(entries, path, tuple(schema), where, problems)
    values: Values = {}
    for name, (_, value_node) in entries.items():
        if name in schema:
            value = schema[name](value_node, join(path, name), problems)
            if value is not INVALID:
                values[name] = (value, value_node)
    return values, set(entries) | suggested


def _named_entries(
    entry: tuple[ScalarNode, Node] | None, section: str, problems: Problems, what: str
) -> dict[str, tuple[ScalarNode, Node]]:
    """A section keyed by names (hosts:, services:, groups:), with each name checked."""
    if entry is None or (isinstance(entry[1], ScalarNode) and kind(entry[1]) == "null"):
        return {}
    entries = mapping(entry[1], section, problems, what=what)
    if entries is None:
        return {}
    good: dict[str, tuple[ScalarNode, Node]] = {}
    for name, (key, node) in entries.items():
        problem = checks.name_problem(name)
        if problem is None and name in RESERVED_NAMES:
            problem = "is reserved (it means every host)"
        if problem:
            problems.add(key, join(section, name), f"{name!r} {problem}")
            continue
        good[name] = (key, node)
    return good


def _health(node: Node, path: str, problems: Problems) -> Any:
    before = len(problems.items)
    values, _ = _section_fields(node, path, HEALTH_FIELDS, "in health", problems)
    if len(problems.items) > before:
        return INVALID
    return HealthSettings(**{k: v for k, (v, _) in values.items()})


def _build(node: Node, path: str, problems: Problems) -> Any:
    # A host's build: replaces the one from defaults as a whole (the settings belong together).
    before = len(problems.items)
    values, _ = _section_fields(node, path, BUILD_FIELDS, "in build", problems)
    if len(problems.items) > before:
        return INVALID
    return BuildSettings(**{k: v for k, (v, _) in values.items()})


def _services(
    entry: tuple[ScalarNode, Node] | None, problems: Problems
) -> tuple[dict[str, ServiceProfile], dict[str, Values]]:
    """The valid profiles, and every profile's raw values (lines for cross-reference errors)."""
    services: dict[str, ServiceProfile] = {}
    raw: dict[str, Values] = {}
    for name, (key, node) in _named_entries(entry, "services", problems, "a mapping of profile names").items():
        path = join("services", name)
        before = len(problems.items)
        values, present = _section_fields(node, path, SERVICE_FIELDS, "in a service profile", problems)
        raw[name] = values
        for required in SERVICE_REQUIRED:
            if present is not None and required not in present:
                problems.add(key, path, f"missing required key {required!r}")
        if "unit_name" not in values and checks.unit_problem(name):
            problems.add(key, path, f"{name!r} is not a valid systemd unit name", hint="set unit_name:")
        if values.get("nodes", ((), None))[0] and "dist_init_port" not in (present or ()):
            problems.add(key, path, "a multi-node profile (nodes:) needs dist_init_port:")
        if len(problems.items) == before:
            services[name] = ServiceProfile(name=name, **{k: v for k, (v, _) in values.items()})
    return services, raw


class _HostEntry:
    """A host's merged values (defaults under host keys) and where each came from."""

    def __init__(self, key: ScalarNode, values: Values) -> None:
        self.key = key
        self.values = values


def _hosts(entry: tuple[ScalarNode, Node] | None, defaults: Values, problems: Problems) -> dict[str, _HostEntry]:
    hosts: dict[str, _HostEntry] = {}
    for name, (key, node) in _named_entries(entry, "hosts", problems, "a mapping of host names").items():
        path = join("hosts", name)
        own, present = _section_fields(node, path, HOST_FIELDS, "in a host", problems)
        merged = {**defaults, **own}
        transport = merged.get("transport", ("ssh", None))[0]
        inherited_jump = merged.get("jump_host", (None, None))[0] if "jump_host" not in own else None
        if inherited_jump is not None and (inherited_jump == name or transport == "local"):
            # A jump host from defaults: the bastion itself and local hosts are reached directly.
            del merged["jump_host"]
        # An invalid transport (`locl`) is reported at its own line; whether an address is required
        # then is unknown, and "missing required key 'address'" first sent the reader the wrong way.
        transport_known = "transport" not in present or "transport" in own if present is not None else True
        if transport == "ssh" and transport_known and present is not None and "address" not in present:
            problems.add(key, path, "missing required key 'address'", hint="add address: <IP or DNS name>")
        if transport == "local" and "jump_host" in own and own["jump_host"][0] is not None:
            problems.add(own["jump_host"][1], join(path, "jump_host"), "a local host cannot use a jump host")
        hosts[name] = _HostEntry(key, merged)
    return hosts


def _groups(
    entry: tuple[ScalarNode, Node] | None, hosts: Mapping[str, _HostEntry], problems: Problems
) -> dict[str, tuple[str, ...]]:
    groups: dict[str, tuple[str, ...]] = {}
    members_of = text_list(checks.name_problem)
    for name, (key, node) in _named_entries(entry, "groups", problems, "a mapping of group names").items():
        path = join("groups", name)
        if name in hosts:
            problems.add(key, path, f"group {name!r} has the same name as a host", hint="rename the group")
            continue
        members = members_of(node, path, problems)
        if members is INVALID:
            continue
        for index, member in enumerate(members):
            if member not in hosts:
                problems.add(
                    node.value[index], f"{path}[{index}]",
                    f"group {name!r} names unknown host {member!r}{did_you_mean(member, hosts)}",
                    hint="hosts: " + (", ".join(hosts) or "none"),
                )
        groups[name] = members
    return groups


def _check_references(
    hosts: Mapping[str, _HostEntry],
    services: Mapping[str, ServiceProfile],
    service_values: Mapping[str, Values],
    problems: Problems,
) -> None:
    for name, entry in hosts.items():
        path = join("hosts", name)
        service, service_node = entry.values.get("service", (None, None))
        if service is not None and service not in services and service not in service_values:
            problems.add(
                service_node, join(path, "service"),
                f"unknown service profile {service!r}{did_you_mean(service, services)}",
                hint="profiles: " + (", ".join(services) or "none (add a services: section)"),
            )
        elif service is not None and service in services and services[service].nodes \
                and name not in services[service].nodes:
            problems.add(
                service_node, join(path, "service"),
                f"host {name!r} runs multi-node profile {service!r} but is not one of its nodes",
                hint=f"add {name} to services.{service}.nodes",
            )
        _check_jump(name, entry, hosts, problems)
    for profile_name, values in service_values.items():
        nodes, nodes_node = values.get("nodes", ((), None))
        for index, node_name in enumerate(nodes):
            if node_name not in hosts:
                problems.add(
                    nodes_node.value[index] if nodes_node is not None else None,
                    f"services.{profile_name}.nodes[{index}]",
                    f"unknown host {node_name!r}{did_you_mean(node_name, hosts)}",
                    hint="hosts: " + ", ".join(hosts),
                )


def _check_jump(name: str, entry: _HostEntry, hosts: Mapping[str, _HostEntry], problems: Problems) -> None:
    jump, node = entry.values.get("jump_host", (None, None))
    if jump is None:
        return
    path = join(join("hosts", name), "jump_host")
    if entry.values.get("transport", ("ssh", None))[0] == "local":
        return  # reported in _hosts
    if jump not in hosts:
        problems.add(node, path, f"unknown jump host {jump!r}{did_you_mean(jump, hosts)}", hint="hosts: " + ", ".join(hosts))
        return
    seen = [name]
    current = jump
    while current is not None:
        if current in seen:
            chain = " -> ".join([*seen, current])
            problems.add(node, path, f"jump hosts form a loop: {chain}")
            return
        seen.append(current)
        hop = hosts.get(current)
        if hop is None:
            return  # reported on that host
        if hop.values.get("transport", ("ssh", None))[0] == "local":
            problems.add(node, path, f"jump host {current!r} uses the local transport; it must be an SSH host")
            return
        current = hop.values.get("jump_host", (None, None))[0]


def _build_host(name: str, entry: _HostEntry) -> Host:
    values: dict[str, Any] = {k: v for k, (v, _) in entry.values.items()}
    if values.get("transport") == "local":
        values.setdefault("address", LOCAL_ADDRESS)
        if "remote_root" in values:
            values["remote_root"] = os.path.expanduser(values["remote_root"])
    if values.get("identity_file"):
        values["identity_file"] = os.path.expanduser(values["identity_file"])
    return Host(name=name, line=line_of(entry.key), **values)
