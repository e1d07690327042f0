"""End-to-end: right after a (re)start, `status` tells "started, still loading" from "serving" on a real
systemd + sshd test host, with the engine's reference server as the service (`--load-delay` keeps it
loading: its port opens, /health answers 503, then 200). It said "running for 2 s" either way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units, reference_service

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]


def status(inventory: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    return subprocess.run([exe, "-i", str(inventory), "status", name, *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "250"})


def service_of(inventory: Path, name: str) -> dict[str, Any]:
    run = status(inventory, name, "--json")
    assert run.returncode == 0, (run.stdout, run.stderr)
    return dict(json.loads(run.stdout)["hosts"][0]["service"])


def test_status_tells_loading_from_serving(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["ss-load"])
    profile = reference_service("ref-ddtree", "tiny-ddtree", load_delay_s=12)
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services={"ref": profile},
                                  host_overrides={host.name: {"service": "ref", "role": "prod"}})
    (host.root / "opt/ddtree/releases/r1").mkdir(parents=True)  # the unit's working directory
    host.sh("ln -sfn releases/r1 /opt/ddtree/current")
    install_service_units(inventory, host.name)

    stopped = service_of(inventory, host.name)
    assert (stopped["state"], stopped["serving"], stopped["health"]) == ("stopped-disabled", None, None), stopped
    host.systemctl("start", "ref-ddtree.service")
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        service = service_of(inventory, host.name)
        seen.append(service)
        if service["serving"]:
            break
        time.sleep(0.5)
    loading = [s for s in seen if s["state"] == "running" and s["serving"] is False]
    assert loading, seen  # systemd said running well before the server served
    assert all(s["health"]["port"] == 30000 for s in loading), loading
    assert any(s["health"]["http_status"] == 503 and s["words"] == "running, not serving yet: /health answers "
               "503 (loading)" for s in loading), loading
    assert all(s["words"] in ("running, not serving yet: /health answers 503 (loading)",
                              "running, not serving yet: port 30000 not open (loading?)") for s in loading), loading
    served = seen[-1]
    assert (served["state"], served["serving"], served["words"]) == ("running", True, "running, serving"), seen
    assert served["health"] == {"port": 30000, "listening": True, "http_status": 200}, served
    table = status(inventory, host.name)
    assert table.returncode == 0 and "ref-ddtree: running for " in table.stdout and ", serving" in table.stdout, \
        table.stdout

    host.systemctl("restart", "ref-ddtree.service")  # a restart loads again: not serving, in words
    table = status(inventory, host.name)
    assert "ref-ddtree: running for " in table.stdout and "not serving yet" in table.stdout, table.stdout
