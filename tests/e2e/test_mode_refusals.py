"""End-to-end: what `ddtreectl mode` leaves on a real systemd + sshd test host when a switch cannot
be completed, through the INSTALLED CLI, with the engine's reference server as the service.

- `mode HOST dev` on a host without nvidia-smi refuses BEFORE it drains or stops anything: the idle
  check that ends the switch can never pass there, and production must not be left down for it.
- (the prod direction is in the second test)

The hosts have no GPU; `mr-gate` gets tests/e2e/test_mode.py's nvidia-smi stand-in (fixture output,
listing the service's real MainPID), `mr-nosmi` has no nvidia-smi at all, as on a host whose driver
tools were never installed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ddtreectl.inventory.loader import load
from ddtreectl.operations.units import install_units
from ddtreectl.render.units import render_service
from ddtreectl.transport import connect
from tests.e2e.test_mode import SERVICES, UNIT, as_json, audit, ddtreectl, lay_out_release, lease, nvidia_smi_stand_in

pytestmark = pytest.mark.testbed

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hosts(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    booted = testbed.boot(["mr-nosmi", "mr-gate"], gpus_stub={"mr-gate": nvidia_smi_stand_in()})
    path = testbed.inventory(booted, tmp_path_factory.mktemp("mode-refusals") / "hosts.yaml", services=SERVICES,
                             host_overrides={h.name: {"service": "ref", "role": "prod", "gpus": 1} for h in booted})
    shutil.copytree(REPO / "templates", path.parent / "templates")
    inventory = load(path)
    for host in booted:
        lay_out_release(host)
        rendered = render_service(inventory, inventory.host(host.name))
        assert rendered is not None
        with connect(inventory.host(host.name), inventory) as transport:
            install_units(transport, rendered)
    yield {h.name: h for h in booted}, str(path)
    for host in booted:
        testbed.shutdown(host)


def unit_state(host: Any) -> tuple[str, str]:
    active = host.systemctl("is-active", UNIT, check=False).stdout.strip()
    return active, host.systemctl("is-enabled", UNIT, check=False).stdout.strip()


def test_dev_without_nvidia_smi_refuses_before_stopping_production(hosts: Any) -> None:
    by_name, i = hosts
    host = by_name["mr-nosmi"]
    assert host.sh("command -v nvidia-smi", check=False).returncode != 0
    # Production is up (the restore gate's GPU check needs --force here: it cannot read the GPUs either).
    up = ddtreectl("-i", i, "restore-service", "mr-nosmi", "--force")
    assert up.returncode == 0, up.stdout + up.stderr
    assert unit_state(host) == ("active", "enabled")

    refused = ddtreectl("-i", i, "mode", "mr-nosmi", "dev", "--reason", "bench")
    assert refused.returncode == 7, refused.stdout + refused.stderr
    assert "nvidia-smi is not installed" in refused.stderr
    assert f"nothing was changed ({UNIT} is still active)" in refused.stderr
    assert "hint: install nvidia-smi on mr-nosmi" in refused.stderr and "--force" in refused.stderr, refused.stderr
    assert "stopping" not in refused.stderr and "draining" not in refused.stderr
    # The host is exactly as it was: serving, enabled at boot, no lease, no switch in the audit log.
    assert unit_state(host) == ("active", "enabled")
    assert not (host.root / "opt/ddtree/state/mode.json").exists()
    assert [a for a in audit(host) if a["action"] == "mode"] == []
    assert not (host.root / "opt/ddtree/state/locks/mode.lock").exists()

    # --force takes the host anyway, and the override is recorded.
    forced = ddtreectl("-i", i, "mode", "mr-nosmi", "dev", "--reason", "bench", "--force", "--json")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    doc = as_json(forced)
    assert doc["stopped"] is True and doc["lease"]["mode"] == "dev" and doc["lease"]["forced"] is True
    assert unit_state(host) == ("inactive", "disabled")
    assert lease(host)["forced"] is True
    assert "nvidia-smi is not installed" in " ".join(audit(host)[-1]["forced"])
