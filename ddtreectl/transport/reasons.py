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


def not_ssh(text: str, port: int, timeout: float, greeted: bool) -> tuple[str, str] | None:
    """(reason, hint) when the handshake failed because whatever answered on the port does not speak SSH
    (Paramiko's words: "Error reading SSH protocol banner", "Indecipherable protocol version"; or its
    start_client simply returning at the timeout, here text "timeout"); None for any other failure."""
    wrong = (f"wrong port or address? check `address:` and `port:` ({port}) in the inventory: another "
             "service may listen there")
    if text == "timeout":
        if greeted:
            return (f"SSH key exchange did not finish in {timeout:g} s",
                    "is the host overloaded? its sshd log says more; connect_timeout in the inventory")
        return (f"no SSH server there? port {port} accepted the connection but sent no SSH greeting in {timeout:g} s",
                f"{wrong}; a heavily loaded host can be this slow (connect_timeout in the inventory)")
    if text.startswith("Error reading SSH protocol banner") or text == "EOFError":
        return (f"no SSH server there: something answered on port {port} but closed the connection "
                "without an SSH greeting",
                f"{wrong}; or sshd dropped the connection before greeting (MaxStartups, hosts.deny: see its log)")
    if text.startswith("Indecipherable protocol version"):
        said = text.partition(" version ")[2][:60]
        return f"no SSH server there: port {port} answered {said} instead of an SSH greeting", wrong
    return None
