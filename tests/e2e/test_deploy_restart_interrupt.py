"""End-to-end: Ctrl-C during `deploy --restart`'s health gate, on a real systemd + sshd test host.

The gate waits as long as the profile's health timeouts allow (an hour by default, for very large
models). Ctrl-C set the fan-out's cancel event, which the gate never looked at: ddtreectl waited 20 s,
then exited saying the host was "still working", with the gate still polling. Now the gate stops at
its next poll and the deploy exits 130 saying the state the host is in: `current` switched, the unit
restarted on it, its health unknown. The reference server with a long `--load-delay` stays loading
(/health 503) for the whole test. The release is laid out already built, so deploy only activates it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import ctrl_c_during_gate, deployed_and_running, reference_service

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

UNIT = "ref-di.service"
OLD = "b0b0b0b0b0b0"


@pytest.mark.testbed
def test_ctrl_c_stops_the_restart_gate_and_says_the_state(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["di-host"])
    services = {"ref": reference_service("ref-di", "tiny-di", load_delay_s=600)}
    inventory, new = deployed_and_running(testbed, host, tmp_path, services, "ref", OLD, UNIT)
    code, out, err, took = ctrl_c_during_gate(["-i", str(inventory), "deploy", "--host", host.name, "--restart",
                                               "--json"], host, UNIT)
    assert code == 130, (out, err)
    assert took < 15, f"{took:.1f} s after Ctrl-C"  # it used to wait 20 s, then leave the gate polling
    doc = json.loads(out)
    message = doc["error"]["message"]
    assert "still working" not in message, message
    assert f"interrupted while verifying the restart (" in message, message
    assert f"`current` is {new} (was {OLD}); {UNIT} was restarted on it; its health is unknown" in message, message
    assert f"`ddtreectl status {host.name}` says whether it serves yet" in err, err
    assert f"`ddtreectl rollback --host {host.name} --to {OLD} --restart` goes back to {OLD}" in err, err
    assert os.readlink(host.root / "opt/ddtree/current") == f"releases/{new}"
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "active"  # left starting, not stopped
    assert not (host.root / "opt/ddtree/state/locks/deploy.lock").exists()
    last = json.loads((host.root / "opt/ddtree/state/audit.log").read_text().splitlines()[-1])
    assert (last["action"], last["release"], last["previous"], last["restarted"]) == ("deploy", new, OLD, True), last
    assert last["restart_interrupted"] in ("unit active", "port open", "liveness"), last
