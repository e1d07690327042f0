"""`systemctl show` parsing on REAL output captured from a systemd test host (capture.py)."""

from __future__ import annotations

import pytest

from ddtreectl.probes.parse import parse_systemctl_show
from ddtreectl.probes.status import parse_status_output
from ddtreectl.probes.words import service_condition

from tests.probes.fixtures import fixture

U = "fx.service"

CASES = [
    ("active", "running", "running"),
    ("active-human", "running", "running"),
    ("active-de_DE", "running", "running"),
    ("activating", "starting", "starting (start)"),
    ("auto-restart", "restarting", "restarting after a failure (result exit-code, exit status 1, "),
    ("failed", "failed", "failed (result exit-code, exit status 3, 0 restarts)"),
    ("failed-human", "failed", "failed (result exit-code, exit status 3, 0 restarts)"),
    ("failed-after-restarts", "failed", "failed (result exit-code, exit status 1, 3 restarts)"),
    ("stopped-enabled", "stopped-enabled", "stopped but enabled (starts at boot)"),
    ("stopped-disabled", "stopped-disabled", "stopped and disabled (will not start at boot)"),
    ("stopped-disabled-after-exit", "stopped-disabled", "stopped and disabled (will not start at boot)"),
    ("static", "stopped-static", "stopped (static: starts only when another unit pulls it in)"),
    ("masked", "masked", "masked: cannot be started until `systemctl unmask`"),
    ("not-found", "not-installed", f"not installed (no {U})"),
    ("need-reload", "running", "running"),
]


@pytest.mark.parametrize(("name", "kind", "words"), CASES, ids=[c[0] for c in CASES])
def test_real_systemctl_show(name: str, kind: str, words: str) -> None:
    state = parse_systemctl_show(fixture(f"systemctl-{name}.txt"), U)
    assert state.known
    condition = service_condition(state)
    assert condition.kind == kind
    assert condition.words.startswith(words)


def test_fields_of_a_failed_unit() -> None:
    state = parse_systemctl_show(fixture("systemctl-failed.txt"), U)
    assert (state.active_state, state.result, state.exec_main_status, state.n_restarts) == (
        "failed", "exit-code", 3, 0)
    assert state.main_pid is None and state.need_daemon_reload is False
    assert state.active_since_epoch is not None


def test_restart_count_of_a_crash_looping_unit() -> None:
    state = parse_systemctl_show(fixture("systemctl-auto-restart.txt"), U)
    assert state.n_restarts is not None and state.n_restarts >= 1
    assert (state.sub_state, state.exec_main_status) == ("auto-restart", 1)


def test_unix_and_human_timestamps_agree() -> None:
    for name in ("active", "failed", "auto-restart"):
        unix = parse_systemctl_show(fixture(f"systemctl-{name}.txt"), U).active_since_epoch
        human = parse_systemctl_show(fixture(f"systemctl-{name}-human.txt"), U).active_since_epoch
        assert unix is not None and human is not None
        assert abs(unix - human) <= 60  # captured seconds apart, same event
    active = parse_systemctl_show(fixture("systemctl-active.txt"), U)
    assert active.main_pid is not None and active.main_pid > 0


def test_need_daemon_reload_and_never_started_units() -> None:
    assert parse_systemctl_show(fixture("systemctl-need-reload.txt"), U).need_daemon_reload is True
    never = parse_systemctl_show(fixture("systemctl-stopped-enabled.txt"), U)
    assert never.active_since_epoch is None and never.active_enter_raw == ""


def test_not_systemctl_output_is_unknown() -> None:
    state = parse_systemctl_show("Failed to connect to bus: No such file or directory\n", U)
    assert not state.known and state.detail == "Failed to connect to bus: No such file or directory"


def test_whole_probe_from_a_systemd_host_with_a_failed_unit_and_a_release() -> None:
    facts = parse_status_output(fixture("probe-testbed-failed.txt"), unit="fx-failed.service")
    assert facts.pid1 == "systemd" and facts.hostname == "fixture-capture"
    assert facts.service is not None
    assert service_condition(facts.service).kind == "failed"
    assert facts.service.exec_main_status == 3
    rel = facts.release
    assert (rel.current, rel.build_stamp, rel.releases) == ("r2", True, ("r1", "r2"))
    assert dict(facts.state_files) == {"state/mode.json": '{"owner": "ana", "mode": "dev"}'}
    active = parse_status_output(fixture("probe-testbed-active.txt"), unit="fx-active.service")
    assert active.service is not None and service_condition(active.service).kind == "running"
    assert active.service.main_pid is not None
