"""`ssh_reuse:` (per host or in defaults): whether status may keep an OpenSSH master warm to a host."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtreectl.errors import InventoryError
from ddtreectl.inventory.loader import load
from ddtreectl.transport.mux import open_mux

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFu6igXqK4KTyj8xUB4FHydX/si4UE6p0Z/rlEBQdmCV"
TEXT = f"""\
defaults:
  ssh_reuse: false
hosts:
  audited:
    address: 10.200.9.1
    host_key: {KEY}
  plain:
    address: 10.200.9.2
    host_key: {KEY}
    ssh_reuse: yes
"""


def test_defaults_and_per_host_values(tmp_path: Path) -> None:
    (tmp_path / "hosts.yaml").write_text(TEXT)
    inv = load(tmp_path / "hosts.yaml")
    assert (inv.host("audited").ssh_reuse, inv.host("plain").ssh_reuse) == (False, True)
    # No network here: open_mux only decides (and names a control socket) for the reusable host.
    assert open_mux(inv.host("audited"), inv) is None
    assert open_mux(inv.host("plain"), inv) is not None


@pytest.mark.parametrize("value", ['"false"', "0", "[true]"])
def test_anything_but_a_boolean_is_refused_with_its_line(tmp_path: Path, value: str) -> None:
    (tmp_path / "hosts.yaml").write_text(TEXT.replace("ssh_reuse: yes", f"ssh_reuse: {value}"))
    with pytest.raises(InventoryError) as err:
        load(tmp_path / "hosts.yaml")
    assert "hosts.yaml:10: hosts.plain.ssh_reuse: expected true or false" in str(err.value)
    assert err.value.hint == "use true or false"
