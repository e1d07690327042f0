"""Pure checks of inventory values that later reach a shell, an SSH config or a systemd unit.

Each check returns None when the value is fine, or the reason it is not (a phrase that completes
"<value> ..."). Keeping them pure makes them reusable by `set-ip` and cheap to test exhaustively.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re

# RFC 1123 label: letters, digits, hyphens; no leading/trailing hyphen; 1..63 characters.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
# Names we use as identifiers in messages, JSON, file names and shell words.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# systemd unit names (without the ".service" suffix): systemd's own allowed characters.
_UNIT = re.compile(r"^[A-Za-z0-9:_.@\\-]{1,200}$")
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Paths reach unit files (ExecStart, WorkingDirectory) where spaces and `%` have meanings of
# their own, and shell words: allow only the characters real deployment paths use.
_PATH_CHARS = re.compile(r"^[A-Za-z0-9._/~+@,:=-]+$")
_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_MACHINE_ID = re.compile(r"^[0-9a-f]{32}$")
_GPU_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Fa-f-]{8,}$")
_IFACE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")
_IFACE = re.compile(r"^[A-Za-z0-9_.,=^:@-]{1,64}$")
_HTTP_PATH = re.compile(r"^/[A-Za-z0-9._~/?&=%+-]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

HOST_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
)


def address_problem(value: str) -> str | None:
    """An IPv4/IPv6 address (scope ids allowed) or an RFC 1123 host name."""
    # ipaddress accepts ANY text as an IPv6 scope id (`fe80::1%eth0\nX`): allow interface names only.
    if "%" in value and not _IFACE_NAME.fullmatch(value.partition("%")[2]):
        return "is not an IP address or hostname"
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    return None if is_hostname(value) else "is not an IP address or hostname"


def zone_problem(name: str, value: str) -> tuple[str, str] | None:
    """What is wrong with a scoped IPv6 address (`fe80::1%eth0`) in host `name`'s entry, and what to type
    instead: (phrase completing "<file>:<line>: hosts.<name>.address: ...", hint); None for any other
    address. The zone names an interface of the machine it was typed on; an inventory is shared and read
    on others, where the address reaches another link or nothing. One wording for set-ip's refusal and
    the warning every command gives for such an entry already in the file."""
    bare, sep, zone = value.partition("%")
    if not sep:
        return None
    phrase = (f"{value!r} carries a zone index (%{zone}), which names a network interface of the machine it "
              "is typed on; an inventory is shared and read on other machines, where "
              f"{zone} is another link or none")
    try:
        link_local = ipaddress.ip_address(bare).is_link_local
    except ValueError:
        link_local = False
    if link_local:
        hint = (f"{bare} is link-local and cannot be reached without a zone: give {name}'s global or "
                f"unique-local IPv6 address (`ip -6 addr show scope global` on the host), its IPv4 address or "
                f"its DNS name: `ddtreectl set-ip {name} ADDRESS`")
    else:
        hint = f"give the address without its zone: `ddtreectl set-ip {name} {bare}`"
    return phrase, hint


def is_hostname(value: str) -> bool:
    """RFC 1123 host name. A name whose last label is all digits is rejected (RFC 3696 §2): it is
    a mistyped IPv4 address (`10.1.230.` or `10.1.230.256`), never a real name."""
    if not value or len(value) > 253 or value.endswith("."):
        return False
    labels = value.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return False
    return not labels[-1].isdigit()


def name_problem(value: str) -> str | None:
    if _NAME.fullmatch(value):
        return None
    return "is not a valid name (letters, digits, '_', '.', '-'; starting with a letter or digit)"


def unit_problem(value: str) -> str | None:
    if value.endswith(".service"):
        return "must be given without the '.service' suffix"
    if _UNIT.fullmatch(value):
        return None
    return "is not a valid systemd unit name"


def user_problem(value: str) -> str | None:
    return None if _USER.fullmatch(value) else "is not a valid user name"


def env_name_problem(value: str) -> str | None:
    if _ENV_NAME.fullmatch(value):
        return None
    return "is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)"


def path_problem(value: str) -> str | None:
    """An absolute path or one starting with `~`, made of characters safe in units and shells."""
    if not (value.startswith("/") or value == "~" or value.startswith("~/")):
        return "must be an absolute path or start with '~/'"
    if not _PATH_CHARS.fullmatch(value):
        return "contains characters that are unsafe in a path (spaces, quotes, '%', '$', ...)"
    if "/../" in value + "/" or value.endswith("/.."):
        return "must not contain '..' components"
    return None


def python_problem(value: str) -> str | None:
    """An absolute interpreter path: systemd's ExecStart does not search PATH for us."""
    if not value.startswith("/"):
        return "must be an absolute path (systemd does not search PATH)"
    return path_problem(value)


def module_problem(value: str) -> str | None:
    return None if _MODULE.fullmatch(value) else "is not a Python module name"


def model_path_problem(value: str) -> str | None:
    """A model directory (absolute or `~/`) or a Hugging Face repository id (`org/name`)."""
    if _HF_REPO.fullmatch(value) and not value.startswith("~"):
        return None
    problem = path_problem(value)
    if problem is None:
        return None
    return "must be an absolute path, a '~/' path or a Hugging Face id 'org/name'"


def template_problem(value: str) -> str | None:
    """A file name relative to the project's templates/ directory."""
    if value.startswith("/") or value.startswith("~"):
        return "must be relative to the templates/ directory"
    if not _PATH_CHARS.fullmatch(value) or ".." in value.split("/"):
        return "is not a safe relative file name"
    return None


def text_problem(value: str) -> str | None:
    """Free text that ends up as one word of a command line or one unit line."""
    if _CONTROL.search(value):
        return "contains control characters (newline, tab, NUL, ...)"
    return None


def machine_id_problem(value: str) -> str | None:
    return None if _MACHINE_ID.fullmatch(value) else "is not a machine-id (32 lowercase hex digits)"


def gpu_uuid_problem(value: str) -> str | None:
    return None if _GPU_UUID.fullmatch(value) else "is not a GPU UUID ('GPU-...' as nvidia-smi prints)"


def interface_problem(value: str) -> str | None:
    return None if _IFACE.fullmatch(value) else "is not a network interface name or NCCL interface list"


def http_path_problem(value: str) -> str | None:
    return None if _HTTP_PATH.fullmatch(value) else "is not an HTTP path starting with '/'"


def host_key_problem(value: str) -> str | None:
    """`<type> <base64>` (an optional comment after it), as `ssh-keyscan` and `trust` write it.

    The key blob itself starts with its type name in SSH wire format; checking that catches a
    truncated or mangled paste, which would otherwise fail only at connect time as a "mismatch".
    """
    if _CONTROL.search(value) or value != value.strip():
        return "must be one line, without leading or trailing spaces"
    parts = value.split()
    if len(parts) < 2 or parts[0] not in HOST_KEY_TYPES:
        return "is not a public host key ('ssh-ed25519 AAAA...')"
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return "is not a public host key (its key data is not base64)"
    kind = parts[0].encode()
    if blob[:4] != len(kind).to_bytes(4, "big") or blob[4 : 4 + len(kind)] != kind:
        return f"is not a valid {parts[0]} key (the key data does not match its type)"
    return None


_CUDA_ARCH = re.compile(r"[1-9][0-9]{1,2}[af]?")
_CMAKE_DEFINE = re.compile(r"-D[A-Za-z_][A-Za-z0-9_]*(:[A-Z]+)?=[^\n\r]*")


def cuda_arch_problem(value: str) -> str | None:
    if _CUDA_ARCH.fullmatch(value) is None:
        return "is not a CUDA architecture (like 90, 90a or 120)"
    return None


def cmake_arg_problem(value: str) -> str | None:
    if _CMAKE_DEFINE.fullmatch(value) is None:
        return "is not a CMake cache definition -DNAME=VALUE"
    if value.startswith("-DDDTREE_CUDA_ARCHS"):
        return "sets the architectures: use build.cuda_archs instead"
    return None
