"""End-to-end: `restore-service` on a unit that crash-loops under Restart=on-failure, after the cause
was fixed, on a real systemd + sshd test host through the INSTALLED CLI.

Between attempts such a unit sits in ActiveState=activating, SubState=auto-restart until RestartSec
passes. restore-service took "activating" for running: it started nothing and its gate failed at once
on the auto-restart state (exit 5, the old crash's journal), so the repair that `mode HOST prod` and
the gate's failures point to did not work until systemd's timer happened to fire. RestartSec is 300 s
here, so the timer cannot fire during the test and pass it by itself."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units
from tests.e2e.test_mode import HEALTH, ddtreectl, lay_out_release

pytestmark = pytest.mark.testbed

REPO = Path(__file__).resolve().parents[2]
UNIT = "loop-ref.service"
SERVICES = {"loop": {
    "template": "sglang-ddtree.service.j2", "python": sys.executable, "module": "ddtree_engine.serve",
    "unit_name": "loop-ref", "port": 30000, "model_path": "/models/tiny-ddtree", "served_model_name": "tiny-ddtree",
    "extra_args": ["--allow-random-weights"], "restart_sec": 300,
    "speculative": {"algorithm": "DDTREE", "ddtree_budget": 7},
    "environment": {"PYTHONPATH": "/opt/ddtree/current/python", "OMP_NUM_THREADS": "1"},
    "health": HEALTH}}


def sub_state(host: Any) -> str:
    return str(host.systemctl("show", "-p", "SubState", "--value", UNIT).stdout.strip())


@pytest.mark.testbed
def test_restore_service_restarts_a_crash_looping_unit_now(boot_hosts: Any, testbed: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["rs-loop"])
    inv = testbed.inventory([host], tmp_path / "hosts.yaml", services=SERVICES,
                            host_overrides={"rs-loop": {"service": "loop", "role": "prod"}})
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    lay_out_release(host)
    install_service_units(inv, "rs-loop")

    # The release cannot serve (its Python package is aside): started, the unit crashes and loops.
    package = host.root / "opt/ddtree/releases/r1/python"
    shutil.move(str(package), str(host.root / "opt/ddtree/python.aside"))
    host.systemctl("enable", "--now", UNIT, check=False)
    deadline = time.monotonic() + 60
    while sub_state(host) != "auto-restart" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sub_state(host) == "auto-restart", host.journal(UNIT)

    # Fixed; the operator restores at once, without waiting out RestartSec.
    shutil.move(str(host.root / "opt/ddtree/python.aside"), str(package))
    run = ddtreectl("-i", str(inv), "restore-service", "rs-loop", "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    (result,) = json.loads(run.stdout)["hosts"]
    assert result["ok"] is True and result["started"] is True, result
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "active"
