"""End-to-end: what `ddtreectl mode` leaves on a real systemd + sshd test host when a switch cannot
be completed, through the INSTALLED CLI, with the engine's reference server as the service.

- `mode HOST dev` on a host without nvidia-smi refuses BEFORE it drains or stops anything: the idle
  check that ends the switch can never pass there, and production must not be left down for it.
- `mode HOST prod` whose health gate fails has still enabled and started the service: the host is
  production's from then on, so the development lease ends (`run` is refused, `mode`/`status` say
  prod) and the error says so and names the next step. A refused preflight starts nothing and keeps
  the development lease.
- `mode HOST prod` whose `systemctl start` itself fails (here: an operator's drop-in that refuses a
  manual start, let through by --force) has started nothing: the enable is put back, the development
  lease stays, and the output, --json, audit line and host all say so.

The hosts have no GPU; `mr-gate` gets tests/e2e/test_mode.py's nvidia-smi stand-in (fixture output,
listing the service's real MainPID), `mr-nosmi` has no nvidia-smi at all, as on a host whose driver
tools were never installed."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units
from tests.e2e.test_mode import SERVICES, UNIT, as_json, audit, ddtreectl, lay_out_release, lease, nvidia_smi_stand_in

pytestmark = pytest.mark.testbed

REPO = Path(__file__).resolve().parents[2]
CRASH = ("unit active", "port open")  # where a service that exits at once is caught


@pytest.fixture(scope="module")
def hosts(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    booted = testbed.boot(["mr-nosmi", "mr-gate"], gpus_stub={"mr-gate": nvidia_smi_stand_in()})
    path = testbed.inventory(booted, tmp_path_factory.mktemp("mode-refusals") / "hosts.yaml", services=SERVICES,
                             host_overrides={h.name: {"service": "ref", "role": "prod", "gpus": 1} for h in booted})
    shutil.copytree(REPO / "templates", path.parent / "templates")
    for host in booted:
        lay_out_release(host)
        install_service_units(path, host.name)
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
    # Nothing was stopped, and the message says so (it used to read "could not be verified idle after a stop").
    assert "so production was not stopped" in refused.stderr and "after a stop" not in refused.stderr, refused.stderr
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


def test_prod_whose_gate_fails_ends_the_dev_lease_and_says_what_next(hosts: Any) -> None:
    by_name, i = hosts
    host = by_name["mr-gate"]
    release = host.root / "opt/ddtree/releases/r1"
    dev = ddtreectl("-i", i, "mode", "mr-gate", "dev", "--reason", "bench", "--json")
    assert dev.returncode == 0, dev.stdout + dev.stderr
    assert lease(host)["mode"] == "dev"

    # A refused preflight (no build stamp) starts nothing: the development lease stays, and is true.
    stamp = (release / ".build-stamp").read_text()
    (release / ".build-stamp").unlink()
    refused = ddtreectl("-i", i, "mode", "mr-gate", "prod")
    assert refused.returncode == 5 and "no built release" in refused.stderr, refused.stdout + refused.stderr
    assert lease(host)["mode"] == "dev" and unit_state(host) == ("inactive", "disabled")
    (release / ".build-stamp").write_text(stamp)

    # The release cannot serve (its Python package is gone): the unit starts, crashes, the gate fails.
    shutil.move(str(release / "python"), str(host.root / "opt/ddtree/python.aside"))
    failed = ddtreectl("-i", i, "mode", "mr-gate", "prod")
    assert failed.returncode == 5, failed.stdout + failed.stderr
    # The crash shows in 'unit active' or, when systemd said active for a moment, in 'port open'.
    assert re.search(r"failed in phase '(unit active|port open)' after", failed.stderr), failed.stderr
    assert "the host is in production mode now" in failed.stderr and "the development lease has ended" in failed.stderr
    assert "hint: `ddtreectl logs mr-gate` shows why; once fixed, `ddtreectl restore-service mr-gate`" in failed.stderr
    assert "mr-gate: prod (since" in failed.stdout and "lease is kept" not in failed.stdout + failed.stderr
    record = lease(host)
    assert record["mode"] == "prod" and record["previous_holder"].startswith("alice@")
    assert unit_state(host)[1] == "enabled"
    last = audit(host)[-1]
    assert (last["action"], last["to"], last["ok"]) == ("mode", "prod", False) and last["failed_phase"] in CRASH
    # Nobody can run development work on it now, and `mode` / `status` say production.
    run = ddtreectl("-i", i, "run", "mr-gate", "--", "true")
    assert run.returncode == 7 and "production mode" in run.stderr, run.stderr
    assert as_json(ddtreectl("-i", i, "mode", "mr-gate", "--json"))["mode"] == "prod"
    assert as_json(ddtreectl("-i", i, "status", "mr-gate", "--json"))["hosts"][0]["mode"]["mode"] == "prod"

    # The holder takes it back for development and tries again, with --json: the same state, as data.
    again = ddtreectl("-i", i, "mode", "mr-gate", "dev", "--reason", "bench")
    assert again.returncode == 0, again.stdout + again.stderr
    failed = ddtreectl("-i", i, "mode", "mr-gate", "prod", "--json")
    assert failed.returncode == 5, failed.stdout + failed.stderr
    doc = as_json(failed)
    assert (doc["ok"], doc["lease"]["mode"]) == (False, "prod") and doc["restore"]["failure"]["phase"] in CRASH

    # The repair the hint names: fix the release, then restore-service.
    shutil.move(str(host.root / "opt/ddtree/python.aside"), str(release / "python"))
    fixed = ddtreectl("-i", i, "restore-service", "mr-gate")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert unit_state(host) == ("active", "enabled")


def test_restore_service_refuses_a_host_held_for_development(boot_hosts: Any, testbed: Any, tmp_path: Path) -> None:
    """restore-service (by default every role: prod host, as after a reboot) started production on a
    host someone had taken with `mode HOST dev`: the lease still said dev beside the running service,
    and the holder's `run` then put development work on the service's GPUs. It refuses now, even with
    --force; `mode HOST prod` is the way back, and ends the lease."""
    (host,) = boot_hosts(["mr-held"], gpus_stub={"mr-held": nvidia_smi_stand_in()})
    inv = testbed.inventory([host], tmp_path / "hosts.yaml", services=SERVICES,
                            host_overrides={"mr-held": {"service": "ref", "role": "prod", "gpus": 1}})
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    lay_out_release(host)
    install_service_units(inv, "mr-held")
    i = str(inv)
    dev = ddtreectl("-i", i, "mode", "mr-held", "dev", "--reason", "bench tree attention")
    assert dev.returncode == 0, dev.stdout + dev.stderr

    for args in (["restore-service"], ["restore-service", "mr-held", "--force"]):
        refused = ddtreectl("-i", i, *args, "--json")
        assert refused.returncode == 8, refused.stdout + refused.stderr
        (entry,) = as_json(refused)["hosts"]
        assert entry["ok"] is False and entry["error"]["exit_code"] == 8
        assert "held for development: dev, held by alice@" in entry["error"]["message"]
        assert "bench tree attention" in entry["error"]["message"]
        assert "`ddtreectl mode mr-held prod`" in entry["error"]["hint"]
        assert unit_state(host) == ("inactive", "disabled") and lease(host)["mode"] == "dev"
    # Another operator's restore-service is refused the same way; the holder's `mode prod` restores.
    assert ddtreectl("-i", i, "restore-service", "mr-held", user="bob").returncode == 8
    back = ddtreectl("-i", i, "mode", "mr-held", "prod")
    assert back.returncode == 0, back.stdout + back.stderr
    assert unit_state(host) == ("active", "enabled") and lease(host)["mode"] == "prod"
    again = ddtreectl("-i", i, "restore-service", "mr-held")  # production again: verified, not refused
    assert again.returncode == 0, again.stdout + again.stderr


def test_prod_whose_start_fails_puts_the_enable_back_and_keeps_the_dev_lease(hosts: Any) -> None:
    by_name, i = hosts
    host = by_name["mr-gate"]
    dev = ddtreectl("-i", i, "mode", "mr-gate", "dev", "--reason", "bench")
    assert dev.returncode == 0, dev.stdout + dev.stderr
    assert lease(host)["mode"] == "dev" and unit_state(host) == ("inactive", "disabled")
    dropin = f"/etc/systemd/system/{UNIT}.d"
    host.sh(f"mkdir -p {dropin} && printf '[Unit]\\nRefuseManualStart=yes\\n' > {dropin}/hold.conf")
    host.systemctl("daemon-reload")
    try:
        # Without --force the drop-in is drift and refused before anything changes.
        drift = ddtreectl("-i", i, "mode", "mr-gate", "prod")
        assert drift.returncode == 5 and "drop-in" in drift.stderr, drift.stdout + drift.stderr
        assert unit_state(host) == ("inactive", "disabled") and lease(host)["mode"] == "dev"

        # --force lets the drift through: enable succeeds, systemd refuses the start.
        failed = ddtreectl("-i", i, "mode", "mr-gate", "prod", "--force")
        assert failed.returncode == 5, failed.stdout + failed.stderr
        assert f"starting {UNIT} failed" in failed.stderr, failed.stderr
        assert "nothing was started and the host stays in development mode" in failed.stderr, failed.stderr
        assert f"{UNIT} disabled again, inactive" in failed.stderr and "development lease of alice@" in failed.stderr
        assert f"once fixed, `ddtreectl mode mr-gate prod` again" in failed.stderr, failed.stderr
        assert "dev, held by alice@" in failed.stdout and "(kept)" in failed.stdout, failed.stdout
        assert "production mode now" not in failed.stdout + failed.stderr
        # The host agrees: not enabled (a reboot must not start production under the lease), not running.
        assert unit_state(host) == ("inactive", "disabled")
        record = lease(host)
        assert record["mode"] == "dev" and record["holder"].startswith("alice@")
        last = audit(host)[-1]
        assert (last["action"], last["to"], last["ok"], last["failed_phase"]) == ("mode", "prod", False, "start")
        assert last["lease_kept"] is True
        # The holder may still run development work there; `mode` says dev.
        assert ddtreectl("-i", i, "run", "mr-gate", "--", "true").returncode == 0
        assert as_json(ddtreectl("-i", i, "mode", "mr-gate", "--json"))["mode"] == "dev"

        doc = as_json(ddtreectl("-i", i, "mode", "mr-gate", "prod", "--force", "--json"))
        assert (doc["ok"], doc["exit_code"], doc["lease"]["mode"], doc["lease_kept"]) == (False, 5, "dev", True)
        assert doc["start_failure"]["put_back"] == f"{UNIT} disabled again, inactive", doc
        assert "stays in development mode" in doc["error"]["message"] and doc["error"]["hint"], doc
        assert any("drop-in" in w for w in doc["warnings"]), doc["warnings"]
        assert unit_state(host) == ("inactive", "disabled")
    finally:
        host.sh(f"rm -rf {dropin}")
        host.systemctl("daemon-reload")
    # Fixed: the same command now gives the host back to production.
    fixed = ddtreectl("-i", i, "mode", "mr-gate", "prod")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert lease(host)["mode"] == "prod" and unit_state(host) == ("active", "enabled")


@pytest.mark.parametrize("declared", [0, 2])
def test_dev_refuses_before_stopping_production_when_the_gpu_count_is_not_the_inventorys(
        boot_hosts: Any, testbed: Any, tmp_path: Path, declared: int) -> None:
    """nvidia-smi lists one GPU where the inventory declares `declared` (0: a host said to have none
    has one after all). The idle check after the stop can never pass (unknown: the count differs), so,
    as without nvidia-smi, `mode dev` refuses before it drains or stops anything. With `gpus: 0` it
    used to take the host (the count was not checked); with 2 it stopped production, then refused."""
    name = f"mr-count{declared}"
    (host,) = boot_hosts([name], gpus_stub={name: nvidia_smi_stand_in()})
    inv = testbed.inventory([host], tmp_path / "hosts.yaml", services=SERVICES,
                            host_overrides={name: {"service": "ref", "role": "prod", "gpus": declared}})
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    lay_out_release(host)
    install_service_units(inv, name)
    i = str(inv)
    up = ddtreectl("-i", i, "restore-service", name, "--force")
    assert up.returncode == 0, up.stdout + up.stderr

    refused = ddtreectl("-i", i, "mode", name, "dev", "--reason", "bench")
    assert refused.returncode == 7, refused.stdout + refused.stderr
    assert (f"its GPUs can never be verified idle (expected {declared} GPUs, nvidia-smi listed 1), so production "
            f"was not stopped; nothing was changed ({UNIT} is still active)") in refused.stderr, refused.stderr
    assert f"correct hosts.{name}.gpus in hosts.yaml" in refused.stderr, refused.stderr
    assert "stopping" not in refused.stderr and "draining" not in refused.stderr, refused.stderr
    assert unit_state(host) == ("active", "enabled") and not (host.root / "opt/ddtree/state/mode.json").exists()
