"""End-to-end: `mode HOST prod` whose `systemctl start` runs past its timeout, on a real systemd + sshd
test host through the INSTALLED CLI, with the engine's reference server as the service.

A `systemctl start --no-block` that does not return in time (systemd or D-Bus slow to answer) is
killed, but the start job may already be queued, and the unit then runs. mode prod used to take the
timeout for "nothing happened": exit 5, the development lease kept beside a running, enabled
production service. Now the unit's real state decides: running or with a job queued, the start took
(the gate runs, the lease ends, exit 0 once healthy); stopped with no job, nothing was started (the
enable is put back and the lease kept, as for a failed start). Output, --json, lease file, audit line
and the host agree.

The slow client is a `systemctl` in /usr/local/bin (ahead of /usr/bin on the SSH user's PATH) that,
only for start/restart and only while /run/slow-start says so, calls the real systemctl and then
hangs ("after": the job is queued), or hangs before reaching systemd ("before": nothing queued);
"enable-after" does the same to `systemctl enable`.
systemd, sshd, the unit and the server are real.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units
from tests.e2e.test_mode import SERVICES, UNIT, as_json, audit, ddtreectl, lay_out_release, lease, nvidia_smi_stand_in

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 8  # the host's command_timeout, which bounds `systemctl start`
SLOW_SYSTEMCTL = """#!/bin/sh
mode=$(cat /run/slow-start 2>/dev/null)
case "$mode" in
  enable-*) case " $* " in *" enable "*) mode=${mode#enable-} ;; *) mode= ;; esac ;;
  *) case " $* " in *" start "*|*" restart "*) ;; *) mode= ;; esac ;;
esac
case "$mode" in
  before) sleep 600; exit 1 ;;  # never reaches systemd, even if the kill missed it
  after) /usr/bin/systemctl "$@"; rc=$?; sleep 600; exit $rc ;;
  *) exec /usr/bin/systemctl "$@" ;;
esac
"""


@pytest.fixture(scope="module")
def slow_host(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    (host,) = testbed.boot(["ms-host"], gpus_stub={"ms-host": nvidia_smi_stand_in()})
    path = testbed.inventory([host], tmp_path_factory.mktemp("mode-start-timeout") / "hosts.yaml",
                             services=SERVICES, host_overrides={host.name: {
                                 "service": "ref", "role": "prod", "gpus": 1, "command_timeout": START_TIMEOUT}})
    shutil.copytree(REPO / "templates", path.parent / "templates")
    lay_out_release(host)
    install_service_units(path, host.name)
    host.write_file("/usr/local/bin/systemctl", SLOW_SYSTEMCTL, mode=0o755)
    yield host, str(path)
    testbed.shutdown(host)


def unit_state(host: Any) -> tuple[str, str]:
    active = host.sh(f"/usr/bin/systemctl is-active {UNIT}", check=False).stdout.strip()
    return active, host.sh(f"/usr/bin/systemctl is-enabled {UNIT}", check=False).stdout.strip()


def slow_start(host: Any, when: str) -> None:
    host.write_file("/run/slow-start", when)


def hold_for_development(host: Any, inventory: str) -> None:
    """`mode HOST dev`: production stopped and disabled, the host leased for development."""
    dev = ddtreectl("-i", inventory, "mode", host.name, "dev", "--reason", "bench")
    assert dev.returncode == 0, dev.stdout + dev.stderr
    assert lease(host)["mode"] == "dev" and unit_state(host) == ("inactive", "disabled")


def test_start_that_times_out_after_queueing_its_job_ends_the_lease(slow_host: Any) -> None:
    host, i = slow_host
    hold_for_development(host, i)
    slow_start(host, "after")
    try:
        doc = as_json(ddtreectl("-i", i, "mode", host.name, "prod", "--json"))
    finally:
        slow_start(host, "")
    # The start took: the gate passed, the lease ended, and everything says so.
    assert (doc["exit_code"], doc["ok"], doc["error"]) == (0, True, None), doc
    assert doc["lease"]["mode"] == "prod" and doc["lease_kept"] is False and doc["start_failure"] is None, doc
    assert doc["restore"]["started"] is True and doc["restore"]["failure"] is None, doc
    assert any(f"`systemctl start` of {UNIT} timed out and was stopped, but the start took" in w
               for w in doc["warnings"]), doc["warnings"]
    assert unit_state(host) == ("active", "enabled")
    assert lease(host)["mode"] == "prod"
    last = audit(host)[-1]
    assert (last["action"], last["to"], last["ok"]) == ("mode", "prod", True), last
    # `run` is production's answer now, not the holder's
    assert ddtreectl("-i", i, "run", host.name, "--", "true").returncode == 7


def test_start_that_times_out_before_systemd_has_it_keeps_the_lease(slow_host: Any) -> None:
    host, i = slow_host
    hold_for_development(host, i)
    slow_start(host, "before")
    try:
        text = ddtreectl("-i", i, "mode", host.name, "prod")
        assert text.returncode == 5, text.stdout + text.stderr
        assert f"starting {UNIT} timed out" in text.stderr and "nothing was started" in text.stderr, text.stderr
        assert "the host stays in development mode" in text.stderr and "development lease of alice@" in text.stderr
        assert f"{UNIT} disabled again, inactive" in text.stderr, text.stderr
        assert "(kept)" in text.stdout and "production mode now" not in text.stdout + text.stderr
        assert unit_state(host) == ("inactive", "disabled") and lease(host)["mode"] == "dev"

        doc = as_json(ddtreectl("-i", i, "mode", host.name, "prod", "--json"))
        assert (doc["exit_code"], doc["ok"], doc["lease"]["mode"], doc["lease_kept"]) == (5, False, "dev", True), doc
        assert "timed out" in doc["start_failure"]["error"] and "no job queued" in doc["start_failure"]["error"], doc
        assert doc["start_failure"]["put_back"] == f"{UNIT} disabled again, inactive", doc
        assert unit_state(host) == ("inactive", "disabled") and lease(host)["mode"] == "dev"
        last = audit(host)[-1]
        assert (last["action"], last["to"], last["ok"], last["lease_kept"]) == ("mode", "prod", False, True), last
    finally:
        slow_start(host, "")
    fixed = ddtreectl("-i", i, "mode", host.name, "prod")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert lease(host)["mode"] == "prod" and unit_state(host) == ("active", "enabled")


def test_an_enable_that_hangs_is_bounded_by_command_timeout_and_put_back(slow_host: Any) -> None:
    """`systemctl enable` had a fixed 60 s bound, whatever the host's command_timeout said, and its
    timeout was a bare "command timed out" raised past mode prod's put-back: the unit could be left
    enabled (production at the next boot) under the kept development lease. Now it is bounded by
    command_timeout like the start, and treated as a failed start: nothing started, the enable undone,
    the lease kept."""
    host, i = slow_host
    hold_for_development(host, i)
    slow_start(host, "enable-after")  # the enable reaches systemd, then the client hangs
    try:
        doc = as_json(ddtreectl("-i", i, "mode", host.name, "prod", "--json"))
    finally:
        slow_start(host, "")
    assert (doc["exit_code"], doc["ok"], doc["lease"]["mode"], doc["lease_kept"]) == (5, False, "dev", True), doc
    assert f"enabling {UNIT} timed out" in doc["start_failure"]["error"], doc
    assert f"after {START_TIMEOUT:g} s" in doc["start_failure"]["error"], doc  # the host's bound, not 60 s
    assert doc["start_failure"]["put_back"] == f"{UNIT} disabled again, inactive", doc
    assert unit_state(host) == ("inactive", "disabled") and lease(host)["mode"] == "dev"
    fixed = ddtreectl("-i", i, "mode", host.name, "prod")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert lease(host)["mode"] == "prod" and unit_state(host) == ("active", "enabled")
