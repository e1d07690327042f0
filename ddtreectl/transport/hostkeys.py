"""Host-key policy: keys are pinned by host NAME and checked for whatever address is current.

Pure functions, no Paramiko: the SSH transport hands over the key the server presented (its
OpenSSH one-line form, "ssh-ed25519 AAAA...") right after the key exchange and BEFORE
authenticating; `check_presented_key` either returns or raises HostKeyError (exit 4).
There is deliberately no "accept and remember" path here: the only way a key becomes trusted is
`ddtreectl trust HOST`, which shows the fingerprint first (Fabric's default and AutoAddPolicy
would trust whatever machine answers at an address — after an IP move, possibly the wrong one).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from ddtreectl.errors import HostKeyError, InventoryError
from ddtreectl.inventory.models import Host

# Key type (first word of a public key line) -> the host-key algorithms that can present it.
# Restricting negotiation to the pinned key's algorithms stops a server that ALSO has, say, an RSA
# key from presenting that one instead and tripping a false "mismatch".
KEY_ALGORITHMS: dict[str, tuple[str, ...]] = {
    "ssh-ed25519": ("ssh-ed25519",),
    "ecdsa-sha2-nistp256": ("ecdsa-sha2-nistp256",),
    "ecdsa-sha2-nistp384": ("ecdsa-sha2-nistp384",),
    "ecdsa-sha2-nistp521": ("ecdsa-sha2-nistp521",),
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256"),
}


@dataclass(frozen=True)
class PublicKey:
    """A parsed public host key."""

    key_type: str
    blob: bytes

    @classmethod
    def parse(cls, text: str, *, where: str = "host_key") -> "PublicKey":
        """Parse "TYPE BASE64 [comment]"; InventoryError (exit 3) naming `where` if malformed."""
        parts = text.split()
        if len(parts) < 2:
            raise InventoryError(
                f"{where}: expected 'TYPE BASE64' (e.g. 'ssh-ed25519 AAAA...'), got {text!r}",
                hint="re-record it with `ddtreectl trust HOST --replace`",
            )
        key_type, b64 = parts[0], parts[1]
        if key_type not in KEY_ALGORITHMS:
            raise InventoryError(
                f"{where}: unsupported key type {key_type!r}",
                hint="supported: " + ", ".join(KEY_ALGORITHMS),
            )
        try:
            blob = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise InventoryError(f"{where}: key data is not valid base64") from None
        if _blob_type(blob) != key_type:
            raise InventoryError(
                f"{where}: key data does not encode a {key_type} key",
                hint="copy the whole line from /etc/ssh/ssh_host_*_key.pub or use `ddtreectl trust`",
            )
        return cls(key_type, blob)

    @classmethod
    def from_blob(cls, blob: bytes) -> "PublicKey":
        """From the SSH wire-format blob a server presents (its type is the blob's first field)."""
        return cls(_blob_type(blob) or "unknown", blob)

    @property
    def line(self) -> str:
        """The OpenSSH one-line form without comment, as stored in the inventory."""
        return f"{self.key_type} {base64.b64encode(self.blob).decode('ascii')}"

    @property
    def fingerprint(self) -> str:
        """OpenSSH-style SHA256 fingerprint, e.g. `SHA256:nThbg6kXUpJWGl7E1IGOCspRomTxdCARLviKw6E5SY8`."""
        return fingerprint_sha256(self.blob)

    @property
    def algorithms(self) -> tuple[str, ...]:
        return KEY_ALGORITHMS.get(self.key_type, (self.key_type,))

    def describe(self) -> str:
        return f"{self.key_type} {self.fingerprint}"


def fingerprint_sha256(blob: bytes) -> str:
    """What `ssh-keygen -lf` prints: base64 of SHA-256 of the key blob, without '=' padding."""
    digest = hashlib.sha256(blob).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def _blob_type(blob: bytes) -> str | None:
    """The type string an SSH wire-format key blob starts with (uint32 length + name)."""
    if len(blob) < 4:
        return None
    n = int.from_bytes(blob[:4], "big")
    if n > 64 or len(blob) < 4 + n:
        return None
    try:
        return blob[4 : 4 + n].decode("ascii")
    except UnicodeDecodeError:
        return None


def pinned_key(host: Host) -> PublicKey | None:
    """The key pinned for `host`, parsed (InventoryError if the stored line is malformed)."""
    if host.host_key is None:
        return None
    return PublicKey.parse(host.host_key, where=f"hosts.{host.name}.host_key")


def check_presented_key(host: Host, presented: PublicKey, *, address: str) -> None:
    """Accept `presented` only if it equals the key pinned for `host`'s NAME.

    `address` ("10.0.0.5:22") is only for the message: the decision never depends on it, so an
    IP move keeps trust and a different box inheriting an IP is refused.
    """
    pinned = pinned_key(host)
    if pinned is None:
        raise HostKeyError(
            f"host key not trusted yet: {address} presented {presented.describe()}",
            hint=f"check that fingerprint out of band (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub "
            f"on the host), then run `ddtreectl trust {host.name}`",
            host=host.name,
        )
    if pinned != presented:
        raise HostKeyError(
            f"HOST KEY MISMATCH at {address}: pinned {pinned.describe()}, "
            f"presented {presented.describe()}; refusing to connect",
            hint="another machine may answer at this address, or the host was reinstalled; if you "
            f"verified the new fingerprint, run `ddtreectl trust {host.name} --replace`",
            host=host.name,
        )
