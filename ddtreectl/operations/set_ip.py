"""`set-ip`: move a host to a new address in one safe step.

Order (each step only if the previous one passed):
1. check the new address (form, not another host's) and compute the one-line inventory edit;
2. prove the machine answering at the NEW address is this host: the key pinned for its NAME,
   its recorded machine-id, its recorded GPU UUIDs (one SSH command);
3. write the inventory atomically (not in a dry run);
4. sweep for stale references to the OLD address: project files, and units/configs installed on
   every reachable inventory host (one command per host, in parallel, one deadline);
5. append an audit line on the moved host (not in a dry run).
Nothing here prints; the result says what happened and what to do next.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from ddtreectl.errors import (
    ConnectError,
    DdtreeError,
    HostKeyError,
    IdentityMismatchError,
    InventoryError,
)
from ddtreectl.inventory import checks
from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.operations.stale_refs import StaleRef, sweep_host, sweep_project
from ddtreectl.transport.base import Transport


@dataclass(frozen=True)
class HostSweep:
    """Stale references on one inventory host, or why it could not be checked."""

    host: str
    refs: tuple[StaleRef, ...] = ()
    error: str = ""

    @property
    def needs_rerender(self) -> bool:
        return bool(self.refs)


@dataclass(frozen=True)
class SetIpResult:
    host: str
    old: str
    new: str
    inventory: Path
    changed: bool  # the inventory file was (or, in a dry run, would be) changed
    dry_run: bool
    diff: str
    verified: tuple[str, ...]  # one line per identity check at the new address (what it found)
    verify_skipped: bool
    matched: tuple[str, ...] = ()  # the identity facts that matched ("host key", "machine-id", ...)
    project_refs: tuple[StaleRef, ...] = ()
    project_skipped: tuple[str, ...] = ()
    host_sweeps: tuple[HostSweep, ...] = ()
    audit: str = ""  # "written", or why not
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Peers whose units are rendered from this host's address (it is rank 0 of their multi-node
    # profile): stale once rendered, whether or not the grep found an installed copy yet.
    rank0_peers: tuple[str, ...] = ()

    @property
    def rerender_hosts(self) -> list[str]:
        found = [s.host for s in self.host_sweeps if s.needs_rerender]
        return list(dict.fromkeys([*found, *self.rank0_peers]))

    @property
    def unswept_hosts(self) -> list[HostSweep]:
        return [s for s in self.host_sweeps if s.error]


def validate_address(address: str) -> None:
    problem = checks.address_problem(address)
    if problem:
        raise InventoryError(f"set-ip: {address!r} {problem}", hint=_address_hint(address))


def _address_hint(address: str) -> str:
    """What to type instead, for the forms an operator copies from `ip addr` or an ssh command
    line (a prefix length, a port, brackets); else the forms that are accepted."""
    bare = address.strip()
    head, sep, tail = bare.partition("/")
    if sep and tail.isdigit() and not checks.address_problem(head):
        return f"give the address without its prefix length: {head}"
    if bare.startswith("[") and "]" in bare:
        inner, _, rest = bare[1:].partition("]")
        if not checks.address_problem(inner):
            port = " (the SSH port is `port:` in the inventory)" if rest else ""
            return f"give the address without brackets: {inner}{port}"
    host, sep, port = bare.rpartition(":")
    if sep and port.isdigit() and "." in host and not checks.address_problem(host):
        return f"give the address alone: {host} (the SSH port is `port:` in the inventory)"
    if bare != address and not checks.address_problem(bare):
        return f"give the address without the surrounding spaces: {bare}"
    return "give an IPv4 address (10.1.230.171), an IPv6 address or a DNS host name"


def same_address(a: str, b: str) -> bool:
    """Equal as addresses (`::1` == `0::1`), or equal as names (case-insensitive)."""
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a.lower() == b.lower()


def set_ip(
    inventory: Inventory,
    name: str,
    address: str,
    *,
    force: bool = False,
    dry_run: bool = False,
    verify: bool = True,
    sweep_deadline_s: float,
) -> SetIpResult:
    """Move host `name` to `address` (see the module docstring for the steps and guarantees).

    Raises InventoryError (3) for a bad address, unknown host, address in use or an uneditable
    file; ConnectError/HostKeyError/IdentityMismatchError (4) when the new address does not prove
    to be this host. In every error case the inventory file is untouched.
    """
    from ddtreectl.inventory import edit  # PyYAML: not imported for `ddtreectl --help`

    validate_address(address)
    host = inventory.host(name)
    if "%" in address:
        raise _zone_refusal(inventory, host, address)
    old = host.address
    path = inventory.path
    if same_address(old, address):
        return SetIpResult(name, old, address, path, False, dry_run, "", (), not verify,
                           audit="not needed", notes=(f"{name} already has address {old}",))
    matched: tuple[str, ...] = ()
    holders = [h.name for h in inventory.hosts.values() if h.name != name and same_address(h.address, address)]
    if holders and not force:
        raise InventoryError(
            f"set-ip: {address} is already the address of {', '.join(holders)}",
            hint="two names for one machine split its pinned identity; pass --force if that is intended",
        )
    if host.transport == "local" and verify:
        raise _local_refusal(inventory, host, address)
    text = edit.read_text(path)
    new_text = edit.edit_host(text, path, name, {"address": address})
    moved = dataclasses.replace(host, address=address)
    conn: Transport | None = None
    notes: list[str] = []
    try:
        if verify:
            conn, verified, matched = verify_identity(moved, inventory)
        else:
            verified = ()
            conn = _try_connect(moved, inventory, notes)
        if not dry_run:
            current = edit.read_text(path)
            if current != text:  # edited meanwhile: redo the edit on what is there now
                new_text = edit.edit_host(current, path, name, {"address": address})
                text = current
            try:
                edit.write_atomic(path, new_text)
            except OSError as err:
                raise InventoryError(
                    f"{path}: cannot write the inventory: {err.strerror or err}; it was not changed",
                    hint="check the permissions of the file and its directory",
                ) from None
            # A status master kept warm for the old address must not outlive the entry it was
            # made for (the next status at the new address starts a verified one).
            from ddtreectl.transport.control import close_master_for

            close_master_for(host)
        from ddtreectl.inventory.loader import parse

        after = parse(new_text, path)
        project_refs, skipped = sweep_project(path.parent, old, contents={path: new_text})
        sweeps = _sweep_hosts(after, name, conn, old, sweep_deadline_s)
        audit = "not written (dry run)" if dry_run else _audit(conn, moved, old, address)
    finally:
        if conn is not None:
            conn.close()
    return SetIpResult(
        name, old, address, path, True, dry_run, edit.diff(text, new_text, path.name),
        verified, not verify, matched, tuple(project_refs), tuple(skipped), tuple(sweeps), audit,
        tuple(notes), rank0_peers(inventory, name),
    )


def _zone_refusal(inventory: Inventory, host: Host, address: str) -> InventoryError:
    """`fe80::1%eth0`: the zone index names an interface of the machine it was typed on. The inventory
    is shared (other operators, CI, a bastion read it), and there `eth0` is another link or none, so
    the address would reach a different machine or nothing. Refused before anything is checked or
    written; the hint gives the form to type (a link-local address is useless without its zone)."""
    from ddtreectl.inventory import edit

    try:  # the line the address is written on, which is what would change; else the host's entry
        line = edit.key_line(edit.read_text(inventory.path), host.name, "address",
                             filename=inventory.path.name) or host.line
    except (InventoryError, OSError):
        line = host.line
    where = f"{inventory.path.name}:{line}" if line else inventory.path.name
    words = checks.zone_problem(host.name, address)
    assert words is not None, address  # called for an address with a zone only
    phrase, hint = words
    message = f"{where}: hosts.{host.name}.address: set-ip: {phrase}. The inventory was not changed"
    return InventoryError(message, hint=hint)


def _local_refusal(inventory: Inventory, host: Host, address: str) -> InventoryError:
    """A `local` host is run on this machine and never connected to: nothing could prove that the
    machine at `address` is it, yet the move used to be reported as verified ("moved ... identity:
    local transport") and audited on this machine. Its address only labels `status` and, for rank 0
    of a multi-node profile, goes into the peers' rendered units: recording it is --no-verify."""
    where = f"{inventory.path.name}:{host.line}" if host.line else inventory.path.name
    return InventoryError(
        f"{where}: hosts.{host.name} uses `transport: local`: ddtreectl runs its commands on this machine and "
        f"never connects to an address, so set-ip cannot prove that the machine at {address} is {host.name}; "
        "the inventory was not changed",
        hint=f"if {host.name} is now a remote machine, set `transport: ssh` and `address: {address}` in its "
             f"entry, then `ddtreectl trust {host.name}`; to record the address anyway (used by `status` and, "
             f"for rank 0 of a multi-node profile, by its peers' units): "
             f"`ddtreectl set-ip {host.name} {address} --no-verify`")


def rank0_peers(inventory: Inventory, name: str) -> tuple[str, ...]:
    """Every node of each multi-node profile whose rank 0 (`--dist-init-addr`) is `name`."""
    peers: list[str] = []
    for profile in inventory.services.values():
        if profile.nodes and profile.nodes[0] == name:
            peers.extend(profile.nodes)
    return tuple(dict.fromkeys(peers))


def verify_identity(
    moved: Host, inventory: Inventory
) -> tuple[Transport, tuple[str, ...], tuple[str, ...]]:
    """Connect to `moved` (already at the new address) and prove it is the recorded machine.

    Returns the open connection (for the sweep and the audit line), one line per check, and the
    names of the facts that matched.
    """
    from ddtreectl.operations.trust import IDENTITY_SCRIPT, parse_identity
    from ddtreectl.transport import connect

    where = f"{moved.address}"
    untouched = "the inventory was not changed"
    if moved.transport == "ssh" and moved.host_key is None:
        raise HostKeyError(
            f"no host key is pinned for {moved.name}: nothing proves the machine at {where} is it; {untouched}",
            hint=f"if the host is still down, `ddtreectl set-ip {moved.name} {moved.address} --no-verify`, "
            f"then `ddtreectl trust {moved.name}` once it is up",
            host=moved.name,
        )
    try:
        conn = connect(moved, inventory)
    except HostKeyError as err:
        # Not the connect error's own hint ("trust --replace"): that would re-pin whatever answers
        # at the new address under this name.
        raise HostKeyError(f"the machine at {where} is not {moved.name}: {err.message}; {untouched}",
                           hint=f"check which machine has {where}; if {moved.name} was reinstalled on purpose, "
                           f"compare the fingerprint on its console, then `ddtreectl set-ip {moved.name} {where} "
                           f"--no-verify` and `ddtreectl trust {moved.name} --replace`", host=moved.name) from None
    except ConnectError as err:
        raise ConnectError(
            f"cannot verify {moved.name} at {where}: {err.message}; {untouched}",
            hint="check the new address (is the host up there yet?); "
            "`--no-verify` skips the identity check for a host that is still down",
            host=moved.name,
        ) from None
    try:
        proven = [f"host key {moved.host_key.split()[0]} matches the key pinned for {moved.name}"
                  if moved.host_key else "local transport: no host key to check"]
        result = conn.run(IDENTITY_SCRIPT, timeout=max(moved.command_timeout, 90.0))
        if not result.ok:
            raise ConnectError(
                f"cannot read the identity of the machine at {where} (exit {result.exit_code}): "
                f"{result.stderr.strip()[:200]}; {untouched}", hint="check the host", host=moved.name)
        machine_id, uuids = parse_identity(result.stdout, moved.name)
        proven += _compare_identity(moved, machine_id, uuids)
    except BaseException:
        conn.close()
        raise
    matched = [name for name, ok in (
        ("host key", moved.transport == "ssh"),
        ("machine-id", moved.machine_id is not None),
        (f"{len(uuids)} GPU UUIDs", bool(moved.gpu_uuids and uuids)),
    ) if ok]
    return conn, tuple(proven), tuple(matched)


def _compare_identity(host: Host, machine_id: str, uuids: tuple[str, ...]) -> list[str]:
    differences: list[str] = []
    proven: list[str] = []
    if host.machine_id is None:
        proven.append("machine-id not recorded (not checked; `ddtreectl trust` records it)")
    elif machine_id != host.machine_id:
        differences.append(f"machine-id is {machine_id}, recorded {host.machine_id}")
    else:
        proven.append("machine-id matches")
    if host.gpu_uuids:
        missing = sorted(set(host.gpu_uuids) - set(uuids))
        extra = sorted(set(uuids) - set(host.gpu_uuids))
        if not uuids:
            proven.append("GPU UUIDs could not be read (nvidia-smi missing or failed): not checked")
        elif missing or extra:
            differences.append("GPU UUIDs differ: " + "; ".join(
                part for part in (f"missing {', '.join(missing)}" if missing else "",
                                  f"unexpected {', '.join(extra)}" if extra else "") if part))
        else:
            proven.append(f"{len(uuids)} GPU UUIDs match")
    elif host.gpus:
        proven.append("GPU UUIDs not recorded (not checked)")
    if differences:
        raise IdentityMismatchError(
            f"the machine at {host.address} is not {host.name}: " + "; ".join(differences)
            + "; the inventory was not changed",
            hint=f"check which machine has {host.address}; if {host.name} was replaced on purpose, "
            f"run `ddtreectl trust {host.name} --replace` after the move",
            host=host.name,
        )
    return proven


def _try_connect(moved: Host, inventory: Inventory, notes: list[str]) -> Transport | None:
    """--no-verify: still try (pinned key enforced) so the sweep and audit can reach the host."""
    from ddtreectl.transport import connect

    notes.append("identity NOT verified (--no-verify)")
    try:
        return connect(moved, inventory)
    except DdtreeError as err:
        notes.append(f"{moved.name} not reachable at {moved.address}: {err.message}")
        return None


def _sweep_hosts(
    inventory: Inventory, moved: str, conn: Transport | None, old: str, deadline_s: float
) -> list[HostSweep]:
    from ddtreectl.fleet import run_on_hosts
    from ddtreectl.transport import connect

    timeout = max(5.0, deadline_s - 5.0)

    def one(host: Host) -> list[StaleRef]:
        if host.name == moved:
            if conn is None:
                raise ConnectError("not reachable at its new address", host=host.name)
            return sweep_host(conn, old, host.remote_root, timeout=timeout)
        with connect(host, inventory) as transport:
            return sweep_host(transport, old, host.remote_root, timeout=timeout)

    fleet = run_on_hosts(list(inventory.hosts.values()), one, deadline_s=deadline_s, deadline_option="--timeout")
    sweeps: list[HostSweep] = []
    for result in fleet.results:
        if result.error is None:
            sweeps.append(HostSweep(result.host.name, tuple(result.value or ())))
        else:
            message = result.error.message if isinstance(result.error, DdtreeError) else repr(result.error)
            sweeps.append(HostSweep(result.host.name, error=message))
    return sweeps


def _audit(conn: Transport | None, host: Host, old: str, new: str) -> str:
    """One audit line on the moved host; the outcome is reported, never raised (the move is done)."""
    from ddtreectl.operations.audit import append_audit

    if conn is None:
        return "not written (host not reachable)"
    try:
        failed = append_audit(conn, host.remote_root, "set-ip", host=host.name, old=old, new=new)
    except DdtreeError as err:
        return f"not written ({err.message})"
    return f"not written ({failed})" if failed else "written"
