"""Connection failures in words: one wording for both SSH paths (Paramiko and OpenSSH).

Paramiko-free on purpose: the OpenSSH path (mux.py) classifies `ssh`'s own error lines into the
same (reason, hint) pairs the Paramiko path derives from socket exceptions, so an operator sees
the same message whichever path reached (or failed to reach) the host.
"""

from __future__ import annotations

import socket

from ddtreectl.errors import ConnectError
from ddtreectl.inventory.models import Host

TIMED_OUT = ("connection timed out",
             "host down, firewalled, or its address changed (then: `ddtreectl set-ip HOST ADDRESS`)")
REFUSED = ("connection refused", "is sshd running on that port? check `port:` in the inventory")


def connect_error(host: Host, where: str, reason: str, hint: str) -> ConnectError:
    # The hint's command names the host, ready to complete with its new address.
    return ConnectError(f"cannot reach {where}: {reason}", hint=hint.replace("set-ip HOST ", f"set-ip {host.name} "),
                        host=host.name)


def reason_of(exc: BaseException) -> tuple[str, str]:
    """(reason, hint) in words for a socket-level failure."""
    if isinstance(exc, socket.timeout):
        return TIMED_OUT
    if isinstance(exc, ConnectionRefusedError):
        return REFUSED
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve address ({exc.strerror})", "check `address:` in the inventory"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower(), "check the address and the network path to the host"
    return str(exc) or type(exc).__name__, "check the host and the network path to it"
