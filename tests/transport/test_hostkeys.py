"""Host-key policy: fingerprints match OpenSSH's, decisions depend on the NAME's pin only."""

from __future__ import annotations

import base64
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from ddtreectl.errors import ExitCode, HostKeyError, InventoryError
from ddtreectl.inventory.models import Host
from ddtreectl.transport.hostkeys import PublicKey, check_presented_key, fingerprint_sha256

from tests.transport.sshd import keygen


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa", "rsa"])
def test_fingerprint_matches_ssh_keygen(tmp_path: Path, kind: str) -> None:
    line = keygen(tmp_path / "k", kind)
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(tmp_path / "k.pub")],
                         check=True, capture_output=True, text=True).stdout
    expected = out.split()[1]
    key = PublicKey.parse(line)
    assert key.fingerprint == expected
    assert key.line == line
    assert not key.fingerprint.endswith("=")


def test_fingerprint_of_known_vector() -> None:
    # SHA-256 of b"" is e3b0c442...; its base64 without padding is a fixed string.
    assert fingerprint_sha256(b"") == "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU"


def _host(tmp_path: Path, pinned: str | None) -> tuple[Host, PublicKey]:
    presented = PublicKey.parse(keygen(tmp_path / "a"))
    return Host(name="gpu1", address="10.200.0.5", host_key=pinned), presented


def test_pinned_key_accepted_at_any_address(tmp_path: Path) -> None:
    host, presented = _host(tmp_path, None)
    host = replace(host, host_key=presented.line + " a-comment")
    check_presented_key(host, presented, address="10.200.0.5:22")
    check_presented_key(replace(host, address="10.201.0.5"), presented, address="10.201.0.5:22")


def test_unknown_key_refused_with_fingerprint_and_trust_hint(tmp_path: Path) -> None:
    host, presented = _host(tmp_path, None)
    with pytest.raises(HostKeyError) as err:
        check_presented_key(host, presented, address="10.200.0.5:22")
    assert err.value.exit_code == ExitCode.CONNECTION
    assert presented.fingerprint in err.value.message
    assert err.value.hint is not None and "ddtreectl trust gpu1" in err.value.hint
    assert err.value.host == "gpu1"


def test_mismatch_refused_with_both_fingerprints(tmp_path: Path) -> None:
    other = PublicKey.parse(keygen(tmp_path / "b"))
    host, presented = _host(tmp_path, other.line)
    with pytest.raises(HostKeyError) as err:
        check_presented_key(host, presented, address="10.200.0.5:22")
    assert other.fingerprint in err.value.message and presented.fingerprint in err.value.message
    assert "MISMATCH" in err.value.message
    assert err.value.hint is not None and "--replace" in err.value.hint


@pytest.mark.parametrize("bad", [
    "ssh-ed25519",  # no data
    "ssh-dss AAAAB3NzaC1kc3MAAACBAP",  # unsupported type
    "ssh-ed25519 not*base64",
])
def test_malformed_pins_are_inventory_errors(bad: str) -> None:
    with pytest.raises(InventoryError) as err:
        PublicKey.parse(bad, where="hosts.x.host_key")
    assert "hosts.x.host_key" in err.value.message
    assert err.value.exit_code == ExitCode.INVENTORY


def test_key_data_of_another_type_is_rejected(tmp_path: Path) -> None:
    rsa = keygen(tmp_path / "r", "rsa").split()[1]
    with pytest.raises(InventoryError, match="does not encode a ssh-ed25519 key"):
        PublicKey.parse(f"ssh-ed25519 {rsa}")


def test_from_blob_reads_type_from_wire_format(tmp_path: Path) -> None:
    key = PublicKey.parse(keygen(tmp_path / "e", "ecdsa"))
    again = PublicKey.from_blob(base64.b64decode(key.line.split()[1]))
    assert again == key and again.key_type == "ecdsa-sha2-nistp256"
