"""The restore gate's decisions, driven through a scripted transport (the real gate runs against a
real server on the test hosts in tests/e2e/test_restore_service.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from ddtreectl.errors import ConnectError
from ddtreectl.inventory.models import HealthSettings, ServiceProfile
from ddtreectl.operations.service_gate import ServiceGate, config_mismatches
from ddtreectl.transport.base import HttpResponse, RunResult

SERVICE = ServiceProfile(name="demo", template="t.service.j2", port=8000, model_path="/m",
                         served_model_name="tiny", tp_size=1,
                         health=HealthSettings(unit_active_timeout=2, port_open_timeout=2, liveness_timeout=2,
                                               readiness_timeout=2, total_timeout=5))
EXPECTED = {"model-path": "/m", "served-model-name": "tiny", "tp-size": 1, "host": "0.0.0.0", "port": 8000,
            "speculative-algorithm": "DDTREE"}
SERVER_INFO = {"model_path": "/m", "served_model_name": "tiny", "tp_size": 1, "speculative_algorithm": "DDTREE"}


def show(active: str, sub: str, restarts: int = 0) -> str:
    return (f"LoadState=loaded\nActiveState={active}\nSubState={sub}\nResult=success\n"
            f"ExecMainStatus=0\nNRestarts={restarts}\nMainPID=42\n")


@dataclass
class ScriptedTransport:
    """Answers `systemctl show` from `states` (advancing one per call) and HTTP from `http`."""

    states: list[str]
    http: Callable[[str], HttpResponse]
    host_name: str = "h1"
    commands: list[str] = field(default_factory=list)

    def run(self, command: str, **_: object) -> RunResult:
        self.commands.append(command)
        if command.startswith("systemctl show"):
            out = self.states[0] if len(self.states) == 1 else self.states.pop(0)
        else:
            out = "journal line 1\njournal line 2\n"
        return RunResult(command, 0, out, "", 0.0)

    def port_open(self, port: int, *, timeout: float) -> bool:
        return True

    def http_get(self, port: int, path: str, *, timeout: float) -> HttpResponse:
        return self.http(path)


def healthy(path: str) -> HttpResponse:
    bodies = {"/v1/models": {"data": [{"id": "tiny"}]}, "/server_info": SERVER_INFO}
    return HttpResponse(200, json.dumps(bodies.get(path, {})).encode(), {})


def test_all_phases_pass_in_order() -> None:
    events = []
    gate = ServiceGate(ScriptedTransport([show("activating", "start"), show("active", "running")], healthy),
                       "h1", SERVICE, EXPECTED, on_event=events.append)
    assert gate.run() is None
    passed = [e.phase for e in events if e.status == "passed"]
    assert passed == ["unit active", "port open", "liveness", "readiness", "model listed", "config matches"]


def test_readiness_waits_through_503_while_loading() -> None:
    answers = iter([503, 503, 200])

    def loading(path: str) -> HttpResponse:
        if path == "/health_generate":
            return HttpResponse(next(answers, 200), b"", {})
        return healthy(path)

    gate = ScriptedTransport([show("active", "running")], loading)
    assert ServiceGate(gate, "h1", SERVICE, EXPECTED).run() is None
    assert len([c for c in gate.commands if c.startswith("systemctl show")]) >= 4


def test_crash_during_load_fails_the_current_phase_with_journal() -> None:
    def refused(path: str) -> HttpResponse:
        raise ConnectError("could not open a TCP connection", host="h1")

    transport = ScriptedTransport(
        [show("active", "running"), show("active", "running"), show("activating", "auto-restart", 1)], refused)
    failure = ServiceGate(transport, "h1", SERVICE, EXPECTED).run()
    assert failure is not None
    assert failure.phase == "liveness"
    assert "auto-restart" in failure.reason
    assert "journal line 2" in failure.journal


def test_unit_that_fails_to_start_fails_phase_one() -> None:
    failure = ServiceGate(ScriptedTransport([show("failed", "failed")], healthy), "h1", SERVICE, EXPECTED).run()
    assert failure is not None and failure.phase == "unit active"


def test_wrong_model_and_wrong_config_are_reported() -> None:
    def other_model(path: str) -> HttpResponse:
        if path == "/v1/models":
            return HttpResponse(200, b'{"data": [{"id": "other"}]}', {})
        return healthy(path)

    failure = ServiceGate(ScriptedTransport([show("active", "running")], other_model), "h1", SERVICE, EXPECTED).run()
    assert failure is not None and failure.phase == "model listed" and "other" in failure.reason
    assert config_mismatches(EXPECTED, {**SERVER_INFO, "tp_size": 8}) == ["tp_size: running 8, rendered 1"]
    assert config_mismatches(EXPECTED, {k: v for k, v in SERVER_INFO.items() if k != "speculative_algorithm"}) == [
        "speculative_algorithm: not reported by /server_info (rendered 'DDTREE')"]


def test_phase_timeout_names_the_phase() -> None:
    never_ready = ScriptedTransport([show("activating", "start")], healthy)
    failure = ServiceGate(never_ready, "h1", SERVICE, EXPECTED).run()
    assert failure is not None and failure.phase == "unit active" and "phase timeout" in failure.reason
