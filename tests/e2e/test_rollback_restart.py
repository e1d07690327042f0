"""End-to-end: `ddtreectl rollback --restart` on a real systemd + sshd test host.

It used `systemctl try-restart` and took its exit status as "restarted": a stopped service was
reported "service restarted" (try-restart does nothing and exits 0), and a running service whose
restart failed left production down behind exit 0 and no error. Now a running service is
restarted, verified through restore-service's health gate, and a failure is exit 5 naming the unit;
a stopped one stays stopped and is not said to be restarted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units, lay_out_built, reference_service

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
UNIT = "ddtree-rb.service"
SERVICES = {"rb": reference_service("ddtree-rb", "rb")}
OLD, NEW = "a0a0a0a0a0a0", "b1b1b1b1b1b1"


def rollback(inventory: Path, host: str) -> tuple[int, dict[str, Any], str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    run = subprocess.run([exe, "-i", str(inventory), "rollback", "--host", host, "--restart", "--json"],
                         capture_output=True, text=True, timeout=120)
    return run.returncode, json.loads(run.stdout), run.stderr


def current_of(host: Any) -> str:
    return os.readlink(host.root / "opt/ddtree/current").rsplit("/", 1)[-1]


@pytest.mark.testbed
def test_rollback_restart_reports_what_happened_to_the_service(testbed: Any, boot_hosts: Any,
                                                               tmp_path: Path) -> None:
    (host,) = boot_hosts(["rb-host"])
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services=SERVICES,
                                  host_overrides={host.name: {"service": "rb", "role": "prod"}})
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    # two good releases, as deploy leaves them; `current` on the newer, the older recorded as previous
    for release in (OLD, NEW):
        lay_out_built(host, release)
    host.sh(f"ln -sfn releases/{NEW} /opt/ddtree/current && mkdir -p /opt/ddtree/state "
            f"&& echo {OLD} > /opt/ddtree/state/previous-release")
    install_service_units(inventory, host.name)

    # 1. stopped on purpose: rolled back, left stopped, and not reported as restarted
    code, doc, err = rollback(inventory, host.name)
    assert code == 0, err
    assert doc["hosts"][0]["release"] == OLD and doc["hosts"][0]["restarted"] is False, doc
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"

    # 2. running: restarted (a new main PID) and verified through the health gate
    host.systemctl("start", UNIT)
    pid = host.systemctl("show", "-p", "MainPID", "--value", UNIT).stdout.strip()
    code, doc, err = rollback(inventory, host.name)  # back to NEW (the previous release now)
    assert code == 0, err
    assert doc["hosts"][0]["release"] == NEW and doc["hosts"][0]["restarted"] is True, doc
    assert doc["hosts"][0]["restart_verified"] is True, doc
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "active"
    assert host.systemctl("show", "-p", "MainPID", "--value", UNIT).stdout.strip() != pid

    # 2b. without --restart the running service keeps its release: said, as deploy says it (rollback
    # reported only "current -> OLD", which read as if the bad release no longer served)
    exe = shutil.which("ddtreectl")
    assert exe is not None
    plain = subprocess.run([exe, "-i", str(inventory), "rollback", "--host", host.name], capture_output=True,
                           text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert f"current -> {OLD} (was {NEW}) · restart pending: the service still runs {NEW}" in plain.stdout, plain.stdout
    assert f"`ddtreectl restore-service {host.name}` verifies it" in plain.stdout, plain.stdout
    back = subprocess.run([exe, "-i", str(inventory), "rollback", "--host", host.name, "--json"], capture_output=True,
                          text=True, timeout=120)
    (entry,) = json.loads(back.stdout)["hosts"]
    assert (back.returncode, entry["release"], entry["still_running"]) == (0, NEW, None), entry  # runs NEW again

    # 3. running, but it cannot start again: the switch happened, the failed restart is exit 5
    host.write_file(f"/etc/systemd/system/{UNIT}.d/broken.conf", "[Service]\nExecStartPre=/bin/false\n")
    host.systemctl("daemon-reload")
    code, doc, err = rollback(inventory, host.name)
    assert code == 5, (doc, err)
    (entry,) = doc["hosts"]
    assert (entry["ok"], entry["release"], entry["error"]["exit_code"]) == (False, None, 5)
    (error,) = doc["errors"]
    assert error["exit_code"] == 5 and f"rolled back to {OLD}" in error["error"], error
    assert f"systemctl restart {UNIT} failed" in error["error"], error
    assert f"ddtreectl logs {host.name}" in error["hint"], error
    assert current_of(host) == OLD
    audit = (host.root / "opt/ddtree/state/audit.log").read_text().splitlines()
    assert json.loads(audit[-1])["restart_failed"], audit[-1]
