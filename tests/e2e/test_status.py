"""End-to-end: the INSTALLED `ddtreectl status --json` against real systemd + sshd test hosts.

One fleet of seven hosts, each in one situation the status command must name correctly: a healthy
host with an active unit and a built release, a failed unit, a disabled-and-stopped unit, no unit,
sshd stopped, a host key that no longer matches the pinned one, and a host moved to a new address.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ddtreectl.inventory.loader import load
from ddtreectl.render.units import render_service
from tests.probes.fixtures import fixture

pytestmark = pytest.mark.testbed

REPO = Path(__file__).resolve().parents[2]

UNIT = "ddtree-fx.service"
SERVICES = {"fx": {"template": "sglang-ddtree.service.j2", "port": 30000, "model_path": "/models/fx",
                   "served_model_name": "fx", "unit_name": "ddtree-fx", "exec_start": "/bin/sleep infinity"}}
# Hosts that run the service get the unit ddtreectl renders (so status sees no drift). It runs from the
# release `current` points to (WorkingDirectory resolves the link at start), so the probe can tell
# which release the running process belongs to.
FAILING_UNIT = "[Service]\nExecStart=/bin/sh -c 'exit 3'\nRestart=no\n[Install]\nWantedBy=multi-user.target\n"
NAMES = ["st-ok", "st-failed", "st-disabled", "st-nounit", "st-nossh", "st-rekey", "st-moved"]


def nvidia_smi_stub(gpus: str, apps: str) -> str:
    """An nvidia-smi that prints fixture output (these hosts have no GPU)."""
    return ("#!/bin/sh\ncase \"$1\" in\n"
            f"  --query-gpu=*) cat <<'EOF'\n{gpus}EOF\n  ;;\n"
            f"  --query-compute-apps=*) cat <<'EOF'\n{apps}EOF\n  ;;\n"
            "  *) exit 2 ;;\nesac\n")


def ddtreectl(*args: str) -> tuple[int, dict[str, Any], str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    run = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
    try:
        doc = json.loads(run.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (exit {run.returncode}): {run.stdout!r} {run.stderr!r}") from None
    return run.returncode, doc, run.stderr


def by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["name"]: h for h in doc["hosts"]}


@pytest.fixture(scope="module")
def fleet_hosts(testbed: Any) -> Any:
    serving = nvidia_smi_stub(fixture("nvidia-smi-gpus-rtxpro6000-8x-serving.txt"),
                              fixture("nvidia-smi-apps-rtxpro6000-8x-serving.txt"))
    seven = nvidia_smi_stub(fixture("nvidia-smi-gpus-rtxpro6000-7of8-idle-pm-off.txt"), "")
    hosts = testbed.boot(NAMES, gpus_stub={"st-ok": serving, "st-failed": seven})
    yield {h.name: h for h in hosts}
    for host in hosts:
        testbed.shutdown(host)


def test_status_of_seven_real_hosts(testbed: Any, fleet_hosts: dict[str, Any], tmp_path: Path) -> None:
    h = fleet_hosts
    pinned_before = h["st-rekey"].host_key
    inventory = testbed.inventory(
        list(h.values()), tmp_path / "hosts.yaml", services=SERVICES,
        groups={"healthy": ["st-ok", "st-failed", "st-disabled", "st-nounit", "st-moved"]},
        host_overrides={"st-ok": {"service": "fx", "gpus": 8}, "st-failed": {"service": "fx", "gpus": 8},
                        "st-disabled": {"service": "fx"}, "st-nounit": {"service": "fx"},
                        "st-rekey": {"host_key": pinned_before}, "st-moved": {"connect_timeout": 2}})
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    loaded = load(inventory)

    def rendered_unit(name: str) -> str:
        rendered = render_service(loaded, loaded.host(name))
        assert rendered is not None
        return rendered.unit_file.content

    ok = h["st-ok"]
    ok.sh("mkdir -p /opt/ddtree/releases/r1 /opt/ddtree/releases/r2 && touch /opt/ddtree/releases/r1/.build-stamp"
          " && ln -sfn releases/r1 /opt/ddtree/current")
    ok.write_file(f"/etc/systemd/system/{UNIT}", rendered_unit("st-ok"))
    ok.systemctl("daemon-reload")
    ok.systemctl("enable", "--now", UNIT)
    failed = h["st-failed"]
    failed.write_file(f"/etc/systemd/system/{UNIT}", FAILING_UNIT)
    failed.systemctl("daemon-reload")
    failed.systemctl("enable", UNIT)
    failed.systemctl("start", UNIT, check=False)  # exits 3: the unit ends up failed
    disabled = h["st-disabled"]
    disabled.write_file(f"/etc/systemd/system/{UNIT}", rendered_unit("st-disabled"))
    disabled.write_file(f"/etc/systemd/system/{UNIT}.d/override.conf", "[Service]\nNice=5\n")
    disabled.systemctl("daemon-reload")
    h["st-nossh"].stop_sshd()
    h["st-rekey"].regenerate_host_key()  # new key; the inventory keeps pinning the old one
    moved = h["st-moved"]
    old_address = moved.address

    new_address = testbed.new_address()
    moved.move_address(new_address)  # the inventory still names the old address

    # 1. Everything at once: a key refusal outranks the rest (exit 4); every other host answers.
    code, doc, stderr = ddtreectl("-i", str(inventory), "status", "--json")
    assert code == 4, stderr
    assert "st-rekey" in stderr and "refused" in stderr
    hosts = by_name(doc)
    assert doc["exit_code"] == 4 and doc["summary"]["hosts"] == 7

    o = hosts["st-ok"]
    assert o["outcome"] == "ok" and o["identity"]["hostname"] == "st-ok"
    assert o["identity"]["machine_id"] == ok.machine_id and o["identity"]["pid1"] == "systemd"
    assert (o["service"]["state"], o["service"]["unit_file_state"]) == ("running", "enabled")
    assert o["service"]["main_pid"] and o["service"]["active_since"]
    assert (o["release"]["current"], o["release"]["build_stamp"], o["release"]["running"]) == ("r1", True, "r1")
    assert o["gpus"]["status"] == "ok" and (o["gpus"]["found"], o["gpus"]["busy"]) == (8, 8)
    assert len(o["gpus"]["processes"]) == 8 and o["warnings"] == []
    # Reached through an OpenSSH master started by this run: the connection is inside probe_ms.
    assert o["probe_ms"] > 0 and o["connection"] == "new" and o["connect_ms"] is None

    f = hosts["st-failed"]
    assert f["outcome"] == "ok"
    assert (f["service"]["state"], f["service"]["exec_main_status"], f["service"]["n_restarts"]) == (
        "failed", 3, 0)
    assert f["service"]["words"] == "failed (result exit-code, exit status 3, 0 restarts)"
    assert "expected 8 GPUs, found 7" in f["warnings"]
    assert any(w.startswith("persistence mode off on GPU 0,1,2,3,4,5,6") for w in f["warnings"])
    assert f["release"]["root_exists"] is False
    # Its unit was written by hand, not rendered: drift, with the command that shows it.
    assert f"{UNIT} differs from the rendered unit (hand edit?): ddtreectl render st-failed --diff" in f["warnings"]

    d = hosts["st-disabled"]
    assert (d["service"]["state"], d["service"]["words"]) == (
        "stopped-disabled", "stopped and disabled (will not start at boot)")
    assert d["warnings"] == [f"drop-in overrides {UNIT}: /etc/systemd/system/{UNIT}.d/override.conf"]
    n = hosts["st-nounit"]
    assert (n["service"]["state"], n["service"]["load_state"]) == ("not-installed", "not-found")
    assert n["gpus"]["status"] == "missing" and n["warnings"] == []

    s = hosts["st-nossh"]
    assert s["outcome"] == "unreachable" and s["identity"] is None and s["error"]["message"]

    r = hosts["st-rekey"]
    assert r["outcome"] == "refused" and r["identity"] is None
    assert "SHA256:" in r["error"]["message"]  # both fingerprints shown

    m = hosts["st-moved"]
    assert m["outcome"] in ("unreachable", "timeout") and m["address"] == old_address

    # 2. The healthy group, with the moved host's entry edited to its new address: same pinned key,
    #    still trusted. Without the refused host the sshd-less host makes it a partial failure (6).
    inventory.write_text(inventory.read_text().replace(f"address: {old_address}\n", f"address: {new_address}\n"))
    code, doc, stderr = ddtreectl("-i", str(inventory), "status", "--json", "healthy", "st-nossh")
    assert code == 6, stderr
    hosts = by_name(doc)
    assert [hn for hn, hv in hosts.items() if hv["outcome"] != "ok"] == ["st-nossh"]
    assert hosts["st-moved"]["address"] == new_address
    assert hosts["st-moved"]["identity"]["machine_id"] == moved.machine_id
    assert doc["summary"] == {"hosts": 6, "answered": 5, "unreachable": 1, "refused": 0, "timeout": 0,
                              "failed": 0}

    # 3. Switch `current` without restarting the service: restart pending, and all answered (exit 0).
    ok.sh("touch /opt/ddtree/releases/r2/.build-stamp && ln -sfn releases/r2 /opt/ddtree/current.new"
          " && mv -T /opt/ddtree/current.new /opt/ddtree/current")
    code, doc, stderr = ddtreectl("-i", str(inventory), "status", "--json", "healthy")
    assert code == 0, stderr
    o = by_name(doc)["st-ok"]
    assert (o["release"]["current"], o["release"]["running"], o["release"]["restart_pending"]) == (
        "r2", "r1", True)
    assert "restart pending: running release r1, current r2" in o["warnings"]


def test_table_output_names_each_state(testbed: Any, fleet_hosts: dict[str, Any], tmp_path: Path) -> None:
    h = fleet_hosts
    inventory = testbed.inventory([h["st-nounit"], h["st-nossh"]], tmp_path / "hosts.yaml",
                                  services=SERVICES, host_overrides={"st-nounit": {"service": "fx"}})
    exe = shutil.which("ddtreectl")
    assert exe is not None
    run = subprocess.run([exe, "-i", str(inventory), "status"], capture_output=True, text=True,
                         timeout=120, env={"COLUMNS": "220", "PATH": "/usr/bin:/bin",
                                           "DDTREECTL_SSH_CONTROL_DIR": os.environ["DDTREECTL_SSH_CONTROL_DIR"]})
    assert run.returncode == 6
    assert "not installed" in run.stdout and "unreachable" in run.stdout
    assert "1/2 hosts answered" in run.stdout
    assert "error: 1 of 2 hosts did not answer: st-nossh (unreachable)" in run.stderr
