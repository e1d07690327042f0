"""The phased health gate: unit active -> port open -> liveness -> readiness -> model listed -> config matches.

Each phase polls through the host's open transport (HTTP over a forwarded SSH channel, so no port
has to be open to the operator) until it passes, its own timeout expires, or the total timeout
does. While polling, a unit that leaves the active state fails the phase at once with the reason
instead of waiting out a half-hour timeout for a server that already crashed.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from ddtreectl.errors import ConnectError, RemoteCommandError
from ddtreectl.inventory.models import HealthSettings, ServiceProfile
from ddtreectl.probes.parse import parse_systemctl_show
from ddtreectl.transport.base import Transport

POLL_S = 0.1  # HTTP probes are cheap on an open channel; polling fast keeps gate overhead well under 1 s
SHOW_PROPS = "LoadState,ActiveState,SubState,UnitFileState,Result,ExecMainStatus,NRestarts,MainPID"


@dataclass(frozen=True)
class PhaseEvent:
    """Progress of one phase on one host, for the live view."""

    host: str
    phase: str
    status: str  # "running" | "passed" | "failed"
    elapsed_s: float
    detail: str = ""


@dataclass(frozen=True)
class GateFailure:
    phase: str
    elapsed_s: float
    reason: str
    journal: str
    cancelled: bool = False  # the caller's cancel event stopped the wait: the service's health is unknown


class _PhaseFailed(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _normalise(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def config_mismatches(expected: Mapping[str, object], running: Mapping[str, object]) -> list[str]:
    """Which rendered arguments the running server reports differently (pure).

    The server reports arguments with underscores (`tp_size`); the config uses the long form
    (`tp-size`). Only arguments that identify what is served are compared: host and port are where it
    listens, which the earlier phases already proved.
    """
    problems = []
    for key, want in expected.items():
        if key in ("host", "port"):
            continue
        field = key.replace("-", "_")
        if field not in running:
            problems.append(f"{field}: not reported by /server_info (rendered {want!r})")
        elif _normalise(running[field]) != _normalise(want):
            problems.append(f"{field}: running {running[field]!r}, rendered {want!r}")
    return problems


class ServiceGate:
    """Runs the phases for one host's service over an open transport."""

    def __init__(
        self,
        transport: Transport,
        host: str,
        service: ServiceProfile,
        expected_args: Mapping[str, object],
        *,
        on_event: Callable[[PhaseEvent], None] = lambda event: None,
        health: HealthSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        journal_since: str | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.transport = transport
        # Set by Ctrl-C in a fan-out: the gate stops waiting at its next poll (a large model's gate
        # may otherwise wait up to its total timeout, an hour by default, with no way out).
        self.cancel = cancel
        # `@<epoch>` on the host's clock from before this start: a failure then shows this start's
        # journal lines only, not older failures of the unit that read as the cause of this one.
        self.journal_since = journal_since
        self.host = host
        self.service = service
        self.expected_args = expected_args
        self.on_event = on_event
        self.health = health or service.health
        self.clock = clock
        self.restarts_at_start: int | None = None

    # --- one check per phase: return a detail string when passed, None to keep polling ---------

    def _unit_state(self) -> tuple[str, str, int | None]:
        unit = shlex.quote(self.service.unit)
        out = self.transport.run(f"systemctl show -p {SHOW_PROPS} -- {unit}", timeout=15).stdout
        state = parse_systemctl_show(out, self.service.unit)
        return state.active_state, state.sub_state, state.n_restarts

    def _assert_unit_alive(self) -> None:
        active, sub, restarts = self._unit_state()
        if active in ("failed", "inactive") or sub == "auto-restart":
            raise _PhaseFailed(f"the unit stopped: ActiveState={active} SubState={sub}")
        if self.restarts_at_start is not None and restarts is not None and restarts > self.restarts_at_start:
            raise _PhaseFailed(f"the unit restarted {restarts - self.restarts_at_start} time(s) (crash)")

    def _check_unit_active(self) -> str | None:
        active, sub, restarts = self._unit_state()
        if self.restarts_at_start is None:
            self.restarts_at_start = restarts
        if active == "active" and sub == "running":
            return "active (running)"
        if active == "failed" or sub == "auto-restart":
            raise _PhaseFailed(f"the unit failed to start: ActiveState={active} SubState={sub}")
        return None

    def _check_port(self) -> str | None:
        self._assert_unit_alive()
        return f"127.0.0.1:{self.service.port} accepts connections" if self.transport.port_open(
            self.service.port, timeout=2) else None

    def _http_ok(self, path: str) -> str | None:
        self._assert_unit_alive()
        try:
            response = self.transport.http_get(self.service.port, path, timeout=30)
        except (ConnectError, RemoteCommandError):
            # Refused or cut off while the server loads or restarts: keep polling. A dead SSH
            # connection surfaces on the next unit check, which does not swallow errors.
            return None
        return f"{path} -> {response.status}" if response.status == 200 else None

    def _check_liveness(self) -> str | None:
        return self._http_ok("/health")

    def _check_readiness(self) -> str | None:
        return self._http_ok(self.health.readiness_path)

    def _get_json(self, *paths: str) -> dict[str, object]:
        for path in paths:
            response = self.transport.http_get(self.service.port, path, timeout=30)
            if response.status == 200:
                try:
                    data = json.loads(response.body)
                except ValueError:
                    raise _PhaseFailed(f"{path} returned invalid JSON") from None
                if isinstance(data, dict):
                    return data
                raise _PhaseFailed(f"{path} returned {type(data).__name__}, expected an object")
        raise _PhaseFailed(f"{' and '.join(paths)} did not return 200")

    def _check_model_listed(self) -> str | None:
        data = self._get_json("/v1/models")
        models = data.get("data")
        ids = [m.get("id") for m in models if isinstance(m, dict)] if isinstance(models, list) else []
        if self.service.served_model_name in ids:
            return f"serves {self.service.served_model_name}"
        raise _PhaseFailed(f"/v1/models lists {ids}, not {self.service.served_model_name!r}")

    def _check_config(self) -> str | None:
        info = self._get_json("/server_info", "/get_server_info")
        problems = config_mismatches(self.expected_args, info)
        if problems:
            raise _PhaseFailed("running configuration differs from the rendered one: " + "; ".join(problems))
        return "running configuration matches the rendered one"

    def phases(self) -> list[tuple[str, float, Callable[[], str | None]]]:
        h = self.health
        return [
            ("unit active", h.unit_active_timeout, self._check_unit_active),
            ("port open", h.port_open_timeout, self._check_port),
            ("liveness", h.liveness_timeout, self._check_liveness),
            ("readiness", h.readiness_timeout, self._check_readiness),
            ("model listed", 30.0, self._check_model_listed),
            ("config matches", 30.0, self._check_config),
        ]

    def run(self) -> GateFailure | None:
        """Run every phase in order; None when all passed, else the first failure."""
        start = self.clock()
        for name, timeout, check in self.phases():
            phase_start = self.clock()
            self.on_event(PhaseEvent(self.host, name, "running", 0.0))
            while True:
                elapsed = self.clock() - phase_start
                if self.cancel is not None and self.cancel.is_set():
                    self.on_event(PhaseEvent(self.host, name, "failed", elapsed, "stopped waiting (interrupted)"))
                    return GateFailure(phase=name, elapsed_s=elapsed, reason="interrupted: stopped waiting",
                                       journal="", cancelled=True)
                try:
                    detail = check()
                except _PhaseFailed as failed:
                    return self._fail(name, elapsed, failed.reason)
                if detail is not None:
                    self.on_event(PhaseEvent(self.host, name, "passed", self.clock() - phase_start, detail))
                    break
                if elapsed > timeout:
                    return self._fail(name, elapsed, f"not done after {timeout:.0f} s (phase timeout)")
                if self.clock() - start > self.health.total_timeout:
                    return self._fail(name, elapsed, f"total timeout of {self.health.total_timeout:.0f} s reached")
                time.sleep(POLL_S)
        return None

    def _fail(self, phase: str, elapsed: float, reason: str) -> GateFailure:
        unit = shlex.quote(self.service.unit)
        since = f" --since {shlex.quote(self.journal_since)}" if self.journal_since else ""
        journal = self.transport.run(
            f"journalctl -u {unit}{since} -n 30 --no-pager -o short-iso 2>&1 || true", timeout=15).stdout
        self.on_event(PhaseEvent(self.host, phase, "failed", elapsed, reason))
        return GateFailure(phase=phase, elapsed_s=elapsed, reason=reason, journal=journal)
