"""Transports: how ddtreectl reaches a host. `connect()` picks local or SSH for a Host.

Importing this package is cheap: Paramiko is imported only when an SSH connection is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddtreectl.errors import InventoryError
from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.transport.base import HttpResponse, RunResult, Transport

if TYPE_CHECKING:
    from ddtreectl.transport.ssh import SshTransport

__all__ = ["HttpResponse", "RunResult", "Transport", "connect"]

MAX_JUMP_DEPTH = 4


def connect(host: Host, inventory: Inventory | None = None, *, nodelay: bool = True,
            reuse: bool = False) -> Transport:
    """Open a transport to `host`: LocalTransport for `transport: local`, else SSH with the key
    pinned for the host's name enforced (and the jump host's own pinned key, resolved by name
    through `inventory`). Raises ConnectError/HostKeyError (exit 4) or InventoryError (exit 3).

    `reuse=True`: an OpenSSH master kept warm across invocations where possible (mux.py; off
    with $DDTREECTL_SSH_REUSE=0). That transport connects on its first command, so connection
    errors surface from `run()`, with the same classes and messages. Callers that can, hand it
    the host keys their probe saw (`MuxTransport.confirm_host_keys`).
    """
    if host.transport == "local":
        from ddtreectl.transport.local import LocalTransport

        return LocalTransport(host)
    if reuse:
        from ddtreectl.transport.mux import open_mux

        mux = open_mux(host, inventory)
        if mux is not None:
            return mux
    return _open_ssh(host, inventory, nodelay)


def _open_ssh(host: Host, inventory: Inventory | None, nodelay: bool) -> "SshTransport":
    from ddtreectl.transport.ssh import open_ssh

    jump_host = resolve_jump(host, inventory)
    jump = _open_ssh(jump_host, inventory, nodelay) if jump_host is not None else None
    try:
        return open_ssh(host, jump=jump, nodelay=nodelay)
    except BaseException:
        if jump is not None:
            jump.close()  # idempotent: open_ssh may already have closed it
        raise


def resolve_jump(host: Host, inventory: Inventory | None) -> Host | None:
    """The jump host's own Host entry (an SSH host of the same inventory), or None."""
    if host.jump_host is None:
        return None
    if inventory is None:
        raise InventoryError(
            f"hosts.{host.name}.jump_host: {host.jump_host!r} needs the inventory to resolve",
            host=host.name,
        )
    seen = [host.name]
    jump = inventory.host(host.jump_host)
    node: Host | None = jump
    while node is not None:
        if node.name in seen or len(seen) > MAX_JUMP_DEPTH:
            raise InventoryError(
                f"{inventory.path.name}: hosts.{host.name}.jump_host: jump chain "
                + " -> ".join(seen + [node.name]) + " loops or is too long",
                hint="jump_host must name a different SSH host, at most 4 hops deep",
            )
        if node.transport != "ssh":
            raise InventoryError(
                f"{inventory.path.name}: hosts.{host.name}.jump_host: {node.name!r} is not an SSH host",
                hint="a jump host must use transport: ssh",
            )
        seen.append(node.name)
        node = inventory.hosts.get(node.jump_host) if node.jump_host else None
    return jump
