"""OpenSSH command lines that pin host keys by host NAME (for rsync's `-e`).

Pure functions. OpenSSH normally looks keys up by the address it dials; `HostKeyAlias` makes it
look them up under `ddtreectl-<name>` instead, in a private known_hosts file holding only the
pinned keys. So rsync gets exactly the trust decision the Paramiko transport made: an IP move
keeps working, another machine at the address is refused ("HOST IDENTIFICATION HAS CHANGED").
"""

from __future__ import annotations

import os
import shlex

from ddtreectl.inventory.models import Host
from ddtreectl.transport.hostkeys import PublicKey

Hop = tuple[Host, PublicKey]  # a host and the key pinned (and verified) for it


def alias(host: Host) -> str:
    return f"ddtreectl-{host.name}"


def known_hosts_text(hops: list[Hop]) -> str:
    """The private known_hosts content: one `<alias> <key>` line per hop."""
    return "".join(f"{alias(host)} {key.line}\n" for host, key in hops)


def write_known_hosts(path: str, hops: list[Hop]) -> None:
    """Write `path` (0600 from creation: it decides whom we trust)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(known_hosts_text(hops))


def ssh_argv(hops: list[Hop], known_hosts: str) -> list[str]:
    """argv of `ssh` reaching the LAST hop, each earlier hop its ProxyCommand (`-W %h:%p`), in
    the order jump -> ... -> target. rsync appends `user@address command` itself.

    `-F /dev/null` so the operator's ~/.ssh/config cannot silently redirect the connection:
    the inventory is the only source. BatchMode: never prompt (a prompt under rsync hangs).
    """
    argv: list[str] = []
    previous: Host | None = None
    for host, key in hops:
        hop_argv = _one_hop(host, key, known_hosts)
        if previous is not None:
            # `%` is a ProxyCommand token character: escape the nested hop's own `%h:%p` so only
            # the ssh that runs that hop expands them.
            proxy = " ".join(shlex.quote(a).replace("%", "%%") for a in argv)
            address = shlex.quote(previous.address).replace("%", "%%")
            hop_argv[1:1] = ["-o", f"ProxyCommand={proxy} -W %h:%p {address}"]
        argv, previous = hop_argv, host
    return argv


def _one_hop(host: Host, key: PublicKey, known_hosts: str) -> list[str]:
    argv = [
        "ssh", "-F", "/dev/null",
        "-o", f"HostKeyAlias={alias(host)}",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "CheckHostIP=no",
        "-o", "UpdateHostKeys=no",
        "-o", f"HostKeyAlgorithms={','.join(key.algorithms)}",
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={max(1, int(host.connect_timeout))}",
        "-p", str(host.port),
        "-l", host.user,
    ]
    if host.identity_file:
        argv += ["-i", os.path.expanduser(host.identity_file), "-o", "IdentitiesOnly=yes"]
    return argv
