"""End-to-end: `deploy --restart` of the release that is already current, on a real systemd + sshd
test host with the engine's reference server.

An operator who only wants the service restarted on what is deployed runs `deploy HOST --restart`.
The line read "noop <id> · units unchanged · service restarted and verified healthy": "noop" and
"restarted" side by side, as if the restart had not happened or the deploy had done nothing at all.
Now it says what happened: the release was already current (nothing built or switched) and the
service was restarted on it and verified. --json keeps `action: "noop"`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import deployed_and_running, reference_service

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

UNIT = "ref-nr.service"
OLD = "c0c0c0c0c0c0"


def deploy(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    return subprocess.run([exe, "-i", str(inventory), "deploy", "--host", "nr-host", *args], capture_output=True,
                          text=True, timeout=240, env={**os.environ, "COLUMNS": "200"})


def main_pid(host: Any) -> str:
    return str(host.systemctl("show", "-p", "MainPID", "--value", UNIT).stdout.strip())


@pytest.mark.testbed
def test_restart_of_the_current_release_says_what_happened(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["nr-host"])
    services = {"ref": reference_service("ref-nr", "tiny-nr")}
    inventory, new = deployed_and_running(testbed, host, tmp_path, services, "ref", OLD, UNIT)
    first = deploy(inventory, "--restart")
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"activated {new} (was {OLD})" in first.stdout, first.stdout

    before = main_pid(host)
    again = deploy(inventory, "--restart")
    assert again.returncode == 0, again.stdout + again.stderr
    line = again.stdout.strip().splitlines()[0]
    assert line.startswith(f"nr-host: {new} already current: nothing built or switched · "), line
    assert "service restarted on it and verified healthy" in line and "noop" not in line, line
    assert main_pid(host) not in (before, "0")  # it was restarted, as the line says
    assert "nr-host: done already current" in again.stderr, again.stderr  # the progress line (not a terminal)

    plain = deploy(inventory)  # without --restart: nothing happened at all, and it says so
    line = plain.stdout.strip().splitlines()[0]
    assert line.startswith(f"nr-host: {new} already current: nothing built or switched · units unchanged"), line
    assert "restarted" not in line, line
    doc = json.loads(deploy(inventory, "--json").stdout)
    assert doc["hosts"][0]["action"] == "noop"
