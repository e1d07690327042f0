"""The service-state-in-words table: every systemd situation lands on its own kind and sentence."""

from __future__ import annotations

import pytest

from ddtreectl.probes.facts import ServiceState
from ddtreectl.probes.words import service_condition

U = "sglang-k26-ddtree.service"


def state(load: str = "loaded", active: str = "inactive", sub: str = "dead", file: str = "enabled",
          result: str = "success", status: int | None = 0, restarts: int | None = 0) -> ServiceState:
    return ServiceState(unit=U, known=True, load_state=load, active_state=active, sub_state=sub,
                        unit_file_state=file, result=result, exec_main_status=status,
                        n_restarts=restarts)


TABLE = [
    (state(active="active", sub="running"), "running", "running"),
    (state(active="active", sub="exited", file="static"), "running", "running (exited)"),
    (state(active="activating", sub="start"), "starting", "starting (start)"),
    (state(active="activating", sub="auto-restart", result="exit-code", status=1, restarts=4),
     "restarting", "restarting after a failure (result exit-code, exit status 1, 4 restarts)"),
    (state(active="reloading", sub="reload"), "reloading", "running, reloading"),
    (state(active="deactivating", sub="stop-sigterm"), "stopping", "stopping (stop-sigterm)"),
    (state(active="failed", sub="failed", result="exit-code", status=3, restarts=0),
     "failed", "failed (result exit-code, exit status 3, 0 restarts)"),
    # as read on a test host whose unit's ExecStartPre=/bin/false (ExecMainStatus=0, MainPID=0)
    (state(active="failed", sub="failed", result="exit-code", status=0, restarts=3),
     "failed", "failed (result exit-code, an ExecStartPre/ExecStartPost/ExecStop command failed, not the main "
     "process, 3 restarts)"),
    (state(active="failed", sub="failed", result="start-limit-hit", status=1, restarts=5),
     "failed", "failed (result start-limit-hit, exit status 1, 5 restarts)"),
    (state(active="failed", sub="failed", result="signal", status=9, restarts=1),
     "failed", "failed (result signal, killed by signal 9 (SIGKILL), 1 restart)"),  # not "exit status 9"
    (state(active="failed", sub="failed", result="core-dump", status=11, restarts=0),
     "failed", "failed (result core-dump, killed by signal 11 (SIGSEGV), 0 restarts)"),
    (state(file="enabled"), "stopped-enabled", "stopped but enabled (starts at boot)"),
    (state(file="disabled"), "stopped-disabled", "stopped and disabled (will not start at boot)"),
    (state(file="disabled", result="exit-code", status=3),
     "stopped-disabled",
     "stopped and disabled (will not start at boot); last run: result exit-code, exit status 3, 0 restarts"),
    (state(file="static"), "stopped-static",
     "stopped (static: starts only when another unit pulls it in)"),
    (state(load="masked", file="masked"), "masked", "masked: cannot be started until `systemctl unmask`"),
    (state(load="loaded", file="masked-runtime"), "masked",
     "masked: cannot be started until `systemctl unmask`"),
    (state(load="not-found", file=""), "not-installed", f"not installed (no {U})"),
    (state(load="bad-setting"), "broken", "unit file invalid (LoadState=bad-setting)"),
    (ServiceState(unit=U, known=False, detail="systemd is not running (PID 1 is bash)"),
     "unknown", "unknown: systemd is not running (PID 1 is bash)"),
]


@pytest.mark.parametrize(("svc", "kind", "words"), TABLE, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(TABLE)])
def test_service_condition(svc: ServiceState, kind: str, words: str) -> None:
    condition = service_condition(svc)
    assert (condition.kind, condition.words) == (kind, words)


def test_the_kinds_the_operator_must_tell_apart_are_distinct() -> None:
    kinds = {service_condition(s).kind for s, _, _ in TABLE}
    assert {"running", "starting", "failed", "stopped-enabled", "stopped-disabled", "masked",
            "not-installed"} <= kinds


def test_whether_a_running_unit_serves_yet_in_words() -> None:
    """systemd says "running" from the moment the server process starts; what /health says decides."""
    from ddtreectl.probes.facts import ServiceHealth
    from ddtreectl.probes.words import health_words

    assert health_words(None) is None  # not asked
    assert health_words(ServiceHealth(30000, True, 200, True)) == "serving"
    assert health_words(ServiceHealth(30000, False, None, False)) == "not serving yet: port 30000 not open (loading?)"
    assert health_words(ServiceHealth(30000, True, 503, True)) == "not serving yet: /health answers 503 (loading)"
    assert health_words(ServiceHealth(30000, True, 500, True)) == "not serving: /health answers 500"
    assert health_words(ServiceHealth(30000, True, None, True)) == \
        "not serving: no answer from 127.0.0.1:30000/health (refused, or none within 5 s, or the --timeout)"
    assert health_words(ServiceHealth(30000, None, None, False)) == \
        "serving unknown: no curl or python3 on the host to ask /health"
