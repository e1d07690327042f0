"""End-to-end: Ctrl-C during `restore-service`'s health gate, on a real systemd + sshd test host.

Session 12 made deploy / rollback --restart stop their gate at Ctrl-C and exit 130 saying the state
the host is in. restore-service's own gate did not look at the interrupt: ddtreectl printed a bare
"interrupted", with neither the unit's state nor a next step, and its gate thread went on polling.
Now it stops waiting at once and says: the unit was started (enabled at boot), its health unknown,
`status HOST` / `restore-service HOST` as the next steps; the audit line records the phase. The
reference server with a long `--load-delay` stays loading (/health 503) for the whole test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import ctrl_c_during_gate, installed_current, reference_service

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

UNIT = "ref-ri.service"


@pytest.mark.testbed
def test_ctrl_c_stops_the_restore_gate_and_says_the_state(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["ri-host"])
    services = {"ref": reference_service("ref-ri", "tiny-ri", load_delay_s=600)}
    inventory = installed_current(testbed, host, tmp_path, services, "ref")
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"

    code, out, err, took = ctrl_c_during_gate(["-i", str(inventory), "restore-service", host.name, "--json"],
                                              host, UNIT)
    assert code == 130, (out, err)
    assert took < 15, f"{took:.1f} s after Ctrl-C"
    doc = json.loads(out)
    assert doc["schema"] == "ddtreectl.restore-service/1" and doc["exit_code"] == 130, doc
    message = doc["error"]["message"]
    assert "interrupted while verifying the start (" in message, message
    assert f"{UNIT} was started (enabled at boot); its health is unknown" in message, message
    assert f"`ddtreectl status {host.name}` says whether it serves yet" in err, err
    assert f"`ddtreectl restore-service {host.name}` verifies it" in err, err
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "active"  # left starting, not stopped
    last = json.loads((host.root / "opt/ddtree/state/audit.log").read_text().splitlines()[-1])
    assert (last["action"], last["unit"], last["ok"], last["started"]) == ("restore-service", UNIT, False, True), last
    assert last["interrupted"] in ("unit active", "port open", "liveness"), last
