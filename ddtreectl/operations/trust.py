"""`trust`: the ONLY way a host key becomes pinned (trust on first use, made explicit).

Order matters: connect and finish the key exchange, show the presented key's fingerprint, ask,
and only after a yes authenticate (so nothing is sent to an unverified machine but the SSH
handshake), read the machine's identity (/etc/machine-id, GPU UUIDs) and write all three into
the inventory under the host's NAME with one atomic edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal

from ddtreectl.errors import ConnectError, HostKeyError, IdentityMismatchError, RemoteCommandError, UsageError
from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.transport.hostkeys import PublicKey, pinned_key

if TYPE_CHECKING:
    from ddtreectl.transport.ssh import SshTransport

MARKER = "__ddtreectl_identity__"
# One round trip. The marker frames our output: a noisy ~/.bashrc on the host may print first.
IDENTITY_SCRIPT = (
    f"echo {MARKER}; cat /etc/machine-id; echo {MARKER}; "
    "if command -v nvidia-smi >/dev/null 2>&1; then "
    "timeout 60 nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null; echo \"@@gpus-rc=$?\"; "
    "else echo @@gpus-rc=missing; fi"
)

Decision = Literal["new", "same", "replace"]


@dataclass(frozen=True)
class TrustOffer:
    """What the operator is asked to approve."""

    host: Host
    address: str  # where the key was presented ("10.0.0.5:22 via jump")
    presented: PublicKey
    pinned: PublicKey | None
    decision: Decision


@dataclass(frozen=True)
class TrustOutcome:
    host: str
    key: PublicKey
    machine_id: str
    gpu_uuids: tuple[str, ...]
    changed: bool  # whether the inventory file was rewritten
    warnings: tuple[str, ...] = ()
    # GPU UUIDs recorded before that the host no longer lists / it lists that were not recorded
    # (both empty unless the recorded set was replaced: a GPU swap accepted with --replace).
    gpus_removed: tuple[str, ...] = ()
    gpus_added: tuple[str, ...] = ()
    key_replaced: str | None = None  # the fingerprint of the key that --replace unpinned
    machine_id_replaced: str | None = None


def parse_identity(stdout: str, host: str) -> tuple[str, tuple[str, ...]]:
    """(machine_id, gpu_uuids) from IDENTITY_SCRIPT's output; pure, tested on real output."""
    parts = stdout.split(MARKER + "\n")
    if len(parts) < 3:
        raise RemoteCommandError("identity probe printed no machine-id", host=host,
                                 hint="does /etc/machine-id exist on the host?")
    machine_id = parts[1].strip()
    uuids = tuple(line.strip() for line in parts[2].splitlines() if line.strip().startswith("GPU-"))
    return machine_id, uuids


def gpu_query_status(stdout: str) -> str | None:
    """How IDENTITY_SCRIPT's GPU query ended: "0" (listed), "missing" (no nvidia-smi), another exit
    status (failed or timed out), or None when the output has no status line."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("@@gpus-rc="):
            return line.split("=", 1)[1].strip()
    return None


def _gpu_identity(host: Host, listed: tuple[str, ...], status: str | None) -> tuple[tuple[str, ...], list[str]]:
    """The GPU UUIDs to record and what to warn about.

    A query that did not run or failed read nothing: the recorded UUIDs are kept. They were replaced
    by an empty list, so re-running `trust` (or `trust --replace` after a reinstall) on a host whose
    nvidia-smi was missing, broken or slow erased the identity record set-ip checks, and said only
    "no GPUs"."""
    if status != "0":
        why = ("nvidia-smi is not installed" if status == "missing" else
               "the query printed no status" if status is None else f"nvidia-smi failed (exit {status})")
        if host.gpu_uuids:
            return host.gpu_uuids, [f"GPU UUIDs not read ({why}): the {len(host.gpu_uuids)} recorded are kept"]
        if host.gpus > 0:
            return (), [f"GPU UUIDs not read ({why}): none recorded, so set-ip cannot check this host's GPUs; "
                        f"run `ddtreectl trust {host.name}` again once nvidia-smi works"]
        return (), []
    if host.gpus and len(listed) != host.gpus:
        return listed, [f"nvidia-smi listed {len(listed)} GPU(s); the inventory says gpus: {host.gpus}"]
    return listed, []


def trust_host(
    inventory: Inventory,
    name: str,
    *,
    confirm: Callable[[TrustOffer], bool],
    replace: bool = False,
) -> TrustOutcome:
    """Pin `name`'s host key after `confirm(offer)` agrees; record machine-id and GPU UUIDs.

    A different key already pinned is refused (HostKeyError, exit 4, both fingerprints) unless
    `replace`. Declining raises HostKeyError too: the key stays untrusted.
    """
    from ddtreectl.transport import resolve_jump
    from ddtreectl.transport.ssh import SshTransport

    host = inventory.host(name)
    if host.transport != "ssh":
        # host=name already prefixes the message with the name ("error: box: ..."): not repeated here.
        raise UsageError(f"transport {host.transport!r}: ddtreectl runs its commands on this machine, without "
                         "SSH, so there is no host key to trust; nothing was recorded",
                         hint=f"nothing to do for {name}: its commands need no trust; for a remote host, set "
                              f"hosts.{name}.transport to ssh (the default) with its address, then "
                              f"`ddtreectl trust {name}`",
                         host=name)
    jump_host = resolve_jump(host, inventory)
    jump = _reopen_jump(jump_host, inventory)
    try:
        session = SshTransport.handshake(host, jump=jump)
    except ConnectError as exc:
        if "no acceptable host key" not in exc.message:
            raise
        # The host no longer offers the pinned key's type (reinstalled with other keys): look at
        # whatever it offers now, so the operator sees a fingerprint and the --replace decision.
        jump = _reopen_jump(jump_host, inventory)
        session = SshTransport.handshake(host, jump=jump, restrict_to_pin=False)
    with session:
        presented = session.presented_key
        pinned = pinned_key(host)
        decision: Decision = "new" if pinned is None else "same" if pinned == presented else "replace"
        if decision == "replace" and not replace:
            raise HostKeyError(
                f"a different key is already pinned: pinned {pinned.describe() if pinned else ''}, "
                f"{session.where} presents {presented.describe()}",
                hint=f"if the host was reinstalled and you verified the new fingerprint, run "
                f"`ddtreectl trust {name} --replace`",
                host=name,
            )
        offer = TrustOffer(host, session.where, presented, pinned, decision)
        if decision != "same" and not confirm(offer):
            raise HostKeyError(f"key {presented.describe()} NOT trusted (declined)", host=name,
                               hint="nothing was recorded; the host stays refused until trusted")
        session.authenticate(presented)
        result = session.run(IDENTITY_SCRIPT, timeout=max(host.command_timeout, 90.0))
        if not result.ok:
            raise RemoteCommandError(f"identity probe failed (exit {result.exit_code}): "
                                     f"{result.stderr.strip()[:200]}", host=name)
        machine_id, listed = parse_identity(result.stdout, name)
        uuids, warnings = _gpu_identity(host, listed, gpu_query_status(result.stdout))
    if host.machine_id and host.machine_id != machine_id and not replace:
        raise IdentityMismatchError(
            f"machine-id {machine_id} differs from the recorded {host.machine_id}",
            hint=f"a different machine answers with the pinned key; if intended, "
            f"`ddtreectl trust {name} --replace`",
            host=name,
        )
    removed, added = gpu_change(host.gpu_uuids, uuids)
    if (removed or added) and not replace:
        # GPU UUIDs are identity, as the machine-id is (set-ip refuses a host whose GPUs differ): a
        # swapped GPU, or another box with a cloned image, is the operator's decision, not a silent
        # rewrite of the record that set-ip then trusts.
        raise IdentityMismatchError(
            f"GPU UUIDs differ from the recorded ones: {describe_gpu_change(removed, added)}; "
            "nothing was recorded",
            hint=f"if the GPUs were swapped (or the machine replaced) and you verified it, "
            f"`ddtreectl trust {name} --replace` records the new UUIDs",
            host=name,
        )
    changed = (presented.line != (pinned.line if pinned else None) or machine_id != host.machine_id
               or uuids != host.gpu_uuids)
    if changed:
        _record(inventory, name, presented.line, machine_id, uuids)
    return TrustOutcome(name, presented, machine_id, uuids, changed, tuple(warnings), removed, added,
                        key_replaced=pinned.fingerprint if pinned and decision == "replace" else None,
                        machine_id_replaced=host.machine_id if host.machine_id and host.machine_id != machine_id
                        else None)


def gpu_change(recorded: tuple[str, ...], read: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(removed, added) between the recorded GPU UUIDs and the ones read; nothing recorded yet (first
    contact) is no change. Order does not matter (nvidia-smi lists by bus id)."""
    if not recorded:
        return (), ()
    return (tuple(u for u in recorded if u not in read), tuple(u for u in read if u not in recorded))


def describe_gpu_change(removed: tuple[str, ...], added: tuple[str, ...]) -> str:
    parts = ([f"{len(removed)} recorded no longer present ({', '.join(removed)})"] if removed else []) + \
        ([f"{len(added)} new ({', '.join(added)})"] if added else [])
    return "; ".join(parts)


def _reopen_jump(jump_host: Host | None, inventory: Inventory) -> "SshTransport | None":
    """A fresh connection to the jump host (its own pinned key enforced), or None."""
    if jump_host is None:
        return None
    from ddtreectl.transport import connect
    from ddtreectl.transport.ssh import SshTransport

    opened = connect(jump_host, inventory)
    assert isinstance(opened, SshTransport)
    return opened


def _record(inventory: Inventory, name: str, key: str, machine_id: str, uuids: tuple[str, ...]) -> None:
    """One surgical, verified, atomic edit of the inventory file (comments and layout kept)."""
    from ddtreectl.inventory import edit
    from ddtreectl.transport.control import close_master_for

    # A master authenticated under the old pin (trust --replace) ends with it.
    close_master_for(inventory.host(name))
    text = edit.read_text(inventory.path)
    values: dict[str, edit.EditValue] = {"host_key": key, "machine_id": machine_id, "gpu_uuids": uuids}
    edit.write_atomic(inventory.path, edit.edit_host(text, inventory.path, name, values))
