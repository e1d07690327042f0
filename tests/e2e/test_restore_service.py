"""End-to-end: `ddtreectl restore-service` and `render --diff` on real systemd + sshd test hosts, with
the engine's reference server (`python -m ddtree_engine.serve`) as the service.

The release on each host is laid out as `ddtreectl deploy` leaves it (releases/<id>/ with the engine's
Python package, a build stamp, `current` pointing at it); the units are installed with the same
operation deploy uses (operations.units.install_units), so these tests exercise restore on its own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ddtreectl.inventory.loader import load
from ddtreectl.operations.units import install_units
from ddtreectl.render.units import render_service
from ddtreectl.transport import connect
from tests.e2e.test_status import nvidia_smi_stub
from tests.probes.fixtures import fixture

pytestmark = pytest.mark.testbed

REPO = Path(__file__).resolve().parents[2]
UNIT = "ref-ddtree.service"
HEALTH = {"unit_active_timeout": 30, "port_open_timeout": 120, "liveness_timeout": 60,
          "readiness_timeout": 120, "total_timeout": 300}


def profile(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "template": "sglang-ddtree.service.j2",
        # The runner's interpreter (it has torch); the hosts see it through their overlay root.
        "python": sys.executable,
        "module": "ddtree_engine.serve",
        "unit_name": "ref-ddtree",
        "port": 30000,
        # No such weights on a test host: the reference server then uses seeded random weights.
        "model_path": "/models/tiny-ddtree",
        "extra_args": ["--allow-random-weights"],
        "served_model_name": "tiny-ddtree",
        "tp_size": 1,
        "speculative": {"algorithm": "DDTREE", "ddtree_budget": 7},
        "environment": {"PYTHONPATH": "/opt/ddtree/current/python", "OMP_NUM_THREADS": "1"},
        "health": HEALTH,
    }
    base.update(overrides)
    return base


SERVICES = {"ref": profile(), "crashing": profile(module="ddtree_engine.no_such_module"),
            "two-node": profile(nodes=["rs-n0", "rs-n1"], dist_init_port=5757)}


def ddtreectl(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def lay_out_release(host: Any, release: str = "r1") -> None:
    """A built release as deploy leaves it: the engine's Python package, a stamp, `current`."""
    target = host.root / "opt/ddtree/releases" / release
    shutil.copytree(REPO / "engine/python", target / "python",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (target / ".build-stamp").write_text(json.dumps({"id": release, "selftest": "skipped: no GPU"}) + "\n")
    host.sh(f"ln -sfn releases/{release} /opt/ddtree/current")


def install(inventory_path: Path, name: str) -> None:
    inventory = load(inventory_path)
    host = inventory.host(name)
    rendered = render_service(inventory, host)
    assert rendered is not None
    with connect(host, inventory) as transport:
        install_units(transport, rendered)


@pytest.fixture(scope="module")
def hosts(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    names = ["rs-main", "rs-crash", "rs-gpu", "rs-n0", "rs-n1"]
    booted = testbed.boot(names)
    by_name = {h.name: h for h in booted}
    path = testbed.inventory(
        booted, tmp_path_factory.mktemp("restore") / "hosts.yaml", services=SERVICES,
        host_overrides={"rs-main": {"service": "ref", "role": "prod"},
                        "rs-crash": {"service": "crashing", "role": "prod"},
                        "rs-gpu": {"service": "ref", "role": "prod", "gpus": 1},
                        "rs-n0": {"service": "two-node", "role": "prod"},
                        "rs-n1": {"service": "two-node", "role": "prod"}})
    # templates/ must sit beside the inventory: ddtreectl renders from there
    shutil.copytree(REPO / "templates", path.parent / "templates")
    for host in booted:
        lay_out_release(host)
        install(path, host.name)
    yield by_name, path
    for host in booted:
        testbed.shutdown(host)


def results(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return {r["host"]: r for r in json.loads(run.stdout)["hosts"]}
    except ValueError:
        raise AssertionError(f"not JSON (exit {run.returncode}): {run.stdout!r}\n{run.stderr}") from None


def test_restore_starts_enables_and_passes_every_phase_then_verifies_a_running_service(hosts: Any) -> None:
    by_name, inventory = hosts
    host = by_name["rs-main"]
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"
    run = ddtreectl("-i", str(inventory), "restore-service", "rs-main", "--json")
    assert run.returncode == 0, run.stderr
    r = results(run)["rs-main"]
    assert r["ok"] and r["started"] and r["enabled"]
    assert [p["phase"] for p in r["phases"]] == [
        "unit active", "port open", "liveness", "readiness", "model listed", "config matches"]
    assert all(p["status"] == "passed" for p in r["phases"])
    assert host.systemctl("is-enabled", UNIT, check=False).stdout.strip() == "enabled"
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "active"
    assert '"action": "restore-service"' in host.read_file("/opt/ddtree/state/audit.log")

    # Already running: verified through the same gate, not restarted.
    pid = host.systemctl("show", "-p", "MainPID", "--value", UNIT).stdout.strip()
    again = results(ddtreectl("-i", str(inventory), "restore-service", "rs-main", "--json"))["rs-main"]
    assert again["ok"] and not again["started"]
    assert host.systemctl("show", "-p", "MainPID", "--value", UNIT).stdout.strip() == pid

    # Stopped on purpose, then restored: started again.
    host.systemctl("stop", UNIT)
    third = results(ddtreectl("-i", str(inventory), "restore-service", "rs-main", "--json"))["rs-main"]
    assert third["ok"] and third["started"]


def test_default_target_is_every_prod_host_and_a_crash_fails_in_its_phase_with_journal(hosts: Any) -> None:
    by_name, inventory = hosts
    run = ddtreectl("-i", str(inventory), "restore-service", "rs-crash", "--json")
    assert run.returncode == 5, run.stderr
    r = results(run)["rs-crash"]
    assert not r["ok"]
    failure = r["failure"]
    assert failure["phase"] in ("unit active", "port open")
    assert "no_such_module" in failure["journal"]
    text = ddtreectl("-i", str(inventory), "restore-service", "rs-crash")
    assert text.returncode == 5
    assert "failed in phase" in text.stdout and "last journal lines" in text.stdout


def test_drift_is_shown_by_render_diff_and_refused_by_restore(hosts: Any) -> None:
    by_name, inventory = hosts
    host = by_name["rs-main"]
    unit_path = f"/etc/systemd/system/{UNIT}"
    original = host.read_file(unit_path)
    host.systemctl("start", UNIT)  # loaded in systemd, so an edit on disk sets NeedDaemonReload
    host.write_file(unit_path, original.replace("RestartSec=10", "RestartSec=1"))
    host.sh(f"mkdir -p /etc/systemd/system/{UNIT}.d && printf '[Service]\\nNice=5\\n' "
            f"> /etc/systemd/system/{UNIT}.d/override.conf")
    try:
        diff = ddtreectl("-i", str(inventory), "render", "rs-main", "--diff", "--json")
        assert diff.returncode == 0, diff.stderr
        kinds = {d["kind"]: d for d in json.loads(diff.stdout)["drift"]}
        assert set(kinds) == {"modified", "drop-in", "need-daemon-reload"}
        assert "-RestartSec=1" in kinds["modified"]["diff"] and "+RestartSec=10" in kinds["modified"]["diff"]
        status = ddtreectl("-i", str(inventory), "status", "rs-main", "--json")
        (entry,) = json.loads(status.stdout)["hosts"]
        assert f"{UNIT} differs from the rendered unit (hand edit?): ddtreectl render rs-main --diff" in entry["warnings"]
        assert any(w.startswith(f"drop-in overrides {UNIT}") for w in entry["warnings"])
        host.systemctl("stop", UNIT)
        refused = ddtreectl("-i", str(inventory), "restore-service", "rs-main")
        assert refused.returncode == 5
        assert "drifted" in refused.stderr and "render rs-main --diff" in refused.stderr
        assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"
    finally:
        host.sh(f"rm -rf /etc/systemd/system/{UNIT}.d")
        host.write_file(unit_path, original)
        host.systemctl("daemon-reload")
    clean = ddtreectl("-i", str(inventory), "render", "rs-main", "--diff", "--json")
    assert json.loads(clean.stdout)["drift"] == []


def test_foreign_gpu_process_refuses_until_it_exits(hosts: Any) -> None:
    by_name, inventory = hosts
    host = by_name["rs-gpu"]
    host.sh("systemd-run --unit=dev-bench.service /bin/sleep 600")
    pid = host.systemctl("show", "-p", "MainPID", "--value", "dev-bench.service").stdout.strip()
    gpus = fixture("nvidia-smi-gpus-h200-1x.txt")
    uuid = gpus.split(",")[1].strip()
    host.install_nvidia_smi_stub(nvidia_smi_stub(gpus, f"{uuid}, {pid}, /bin/sleep, 2048\n"))
    refused = ddtreectl("-i", str(inventory), "restore-service", "rs-gpu")
    assert refused.returncode == 7, refused.stderr
    assert f"pid {pid}" in refused.stderr and "sleep 600" in refused.stderr
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"

    host.systemctl("stop", "dev-bench.service")
    host.install_nvidia_smi_stub(nvidia_smi_stub(gpus, ""))
    run = ddtreectl("-i", str(inventory), "restore-service", "rs-gpu", "--json")
    assert run.returncode == 0, run.stderr


def test_enabled_service_comes_back_after_a_reboot_and_status_says_so(testbed: Any, hosts: Any) -> None:
    by_name, inventory = hosts
    host = by_name["rs-main"]
    run = ddtreectl("-i", str(inventory), "restore-service", "rs-main", "--json")
    assert run.returncode == 0, run.stderr
    testbed.reboot(host)
    deadline = time.monotonic() + 120
    while host.systemctl("is-active", UNIT, check=False).stdout.strip() != "active":
        assert time.monotonic() < deadline, host.journal(UNIT)
        time.sleep(0.5)
    status = ddtreectl("-i", str(inventory), "status", "rs-main", "--json")
    assert status.returncode == 0, status.stderr
    (entry,) = json.loads(status.stdout)["hosts"]
    assert entry["service"]["state"] == "running"
    assert entry["service"]["unit_file_state"] == "enabled"


def test_multi_node_service_starts_every_rank_and_gates_on_rank0(hosts: Any) -> None:
    by_name, inventory = hosts
    # Naming only rank 1 restores the whole service: rank 1 is started, rank 0 started and gated.
    run = ddtreectl("-i", str(inventory), "restore-service", "rs-n1", "--json")
    assert run.returncode == 0, run.stderr
    r = results(run)
    assert set(r) == {"rs-n0", "rs-n1"}
    assert r["rs-n1"]["started"] and r["rs-n1"]["phases"] == []
    assert [p["phase"] for p in r["rs-n0"]["phases"]][-1] == "config matches"
    for name in ("rs-n0", "rs-n1"):
        assert by_name[name].systemctl("is-active", UNIT, check=False).stdout.strip() == "active"
    rank0 = by_name["rs-n0"]
    config = by_name["rs-n1"].read_file("/opt/ddtree/config/ref-ddtree.yaml")
    assert f'dist-init-addr: "{rank0.address}:5757"' in config and "node-rank: 1" in config


def test_logs_shows_the_service_journal_prefixed_per_host(hosts: Any) -> None:
    by_name, inventory = hosts
    for name in ("rs-n0", "rs-n1"):
        if by_name[name].systemctl("is-active", UNIT, check=False).stdout.strip() != "active":
            by_name[name].systemctl("start", UNIT)
    one = ddtreectl("-i", str(inventory), "logs", "rs-n0", "-n", "200")
    assert one.returncode == 0, one.stderr
    assert "listening on http" in one.stdout and not one.stdout.startswith("rs-n0: ")
    both = ddtreectl("-i", str(inventory), "logs", "rs-n0", "rs-n1", "-n", "200")
    assert both.returncode == 0, both.stderr
    prefixes = {line.split(": ", 1)[0] for line in both.stdout.splitlines() if line}
    assert prefixes == {"rs-n0", "rs-n1"}


def test_after_a_real_deploy_a_stopped_service_is_restored(testbed: Any, boot_hosts: Any,
                                                          tmp_path: Path) -> None:
    """The operator's path end to end: `deploy` builds the engine and installs the unit (it does not
    start it), the service is stopped, `restore-service` brings it back through every phase."""
    from tests.e2e.test_deploy import BUILD

    (host,) = boot_hosts(["rs-deployed"])
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services={"ref": SERVICES["ref"]},
                                  host_overrides={"rs-deployed": {"service": "ref", "role": "prod",
                                                                  "build": BUILD}})
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    deployed = ddtreectl("-i", str(inventory), "deploy", "--host", "rs-deployed", "--engine",
                         str(REPO / "engine"), "--json", timeout=900)
    assert deployed.returncode == 0, deployed.stderr
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"
    run = ddtreectl("-i", str(inventory), "restore-service", "--json")  # default target: role prod
    assert run.returncode == 0, run.stderr
    r = results(run)["rs-deployed"]
    assert r["ok"] and r["started"] and len(r["phases"]) == 6
    host.systemctl("stop", UNIT)
    again = results(ddtreectl("-i", str(inventory), "restore-service", "rs-deployed", "--json"))
    assert again["rs-deployed"]["ok"] and again["rs-deployed"]["started"]
