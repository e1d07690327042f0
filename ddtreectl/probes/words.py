"""Facts in words: the service's condition and a GPU summary, as an operator would say them.

The service mapping is the answer to "it did not come back after the restart: failed? not enabled?
disabled on purpose?" (shared/ops-notes.md), so every systemd state lands on a distinct `kind`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ddtreectl.probes.facts import GpuState, ServiceHealth, ServiceState

ServiceKind = Literal[
    "running", "starting", "restarting", "reloading", "stopping", "failed", "stopped-enabled",
    "stopped-disabled", "stopped-static", "masked", "not-installed", "broken", "unknown",
]

_ENABLED = {"enabled", "enabled-runtime", "linked", "linked-runtime", "alias"}
_STATIC = {"static", "indirect", "generated", "transient"}


@dataclass(frozen=True)
class ServiceCondition:
    kind: ServiceKind
    words: str


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _signal_name(number: int) -> str:
    import signal

    try:
        return f" ({signal.Signals(number).name})"
    except ValueError:
        return ""


def _exit_words(state: ServiceState) -> str:
    """`exit status 3, 2 restarts` — what a failed unit last did and how often systemd retried."""
    parts = []
    if state.result and state.result != "success":
        parts.append(f"result {state.result}")
    if state.result == "exit-code" and state.exec_main_status == 0:
        # A main process that exits 0 never makes `exit-code`: a helper command failed (or the main
        # process never ran), and "exit status 0" read as a contradiction.
        parts.append("an ExecStartPre/ExecStartPost/ExecStop command failed, not the main process")
    elif state.exec_main_status is not None and state.result in ("signal", "core-dump"):
        # systemd's ExecMainStatus is then the signal's number, not an exit status ("exit status 9"
        # read as if the server had exited 9 after `kill -9`).
        parts.append(f"killed by signal {state.exec_main_status}{_signal_name(state.exec_main_status)}")
    elif state.exec_main_status is not None:
        parts.append(f"exit status {state.exec_main_status}")
    if state.n_restarts is not None:
        parts.append(_plural(state.n_restarts, "restart"))
    return ", ".join(parts)


def service_condition(state: ServiceState) -> ServiceCondition:
    """Map `systemctl show` properties to one kind and a sentence."""
    if not state.known:
        return ServiceCondition("unknown", f"unknown: {state.detail or 'systemd did not answer'}")
    load, active, sub = state.load_state, state.active_state, state.sub_state
    if load == "not-found":
        return ServiceCondition("not-installed", f"not installed (no {state.unit})")
    if load == "masked" or state.unit_file_state.startswith("masked"):
        return ServiceCondition("masked", "masked: cannot be started until `systemctl unmask`")
    if load in ("bad-setting", "error"):
        return ServiceCondition("broken", f"unit file invalid (LoadState={load})")
    if active == "active":
        if sub in ("running", "exited", "listening", "waiting", ""):
            since = f" ({sub})" if sub not in ("running", "") else ""
            return ServiceCondition("running", f"running{since}")
        return ServiceCondition("running", f"active ({sub})")
    if active == "reloading":
        return ServiceCondition("reloading", "running, reloading")
    if active == "activating":
        if sub == "auto-restart":
            return ServiceCondition(
                "restarting", f"restarting after a failure ({_exit_words(state)})")
        return ServiceCondition("starting", f"starting ({sub or 'activating'})")
    if active == "deactivating":
        return ServiceCondition("stopping", f"stopping ({sub or 'deactivating'})")
    if active == "failed":
        return ServiceCondition("failed", f"failed ({_exit_words(state)})")
    if active == "inactive":
        last = f"; last run: {_exit_words(state)}" if state.result not in ("", "success") else ""
        if state.unit_file_state in _ENABLED:
            return ServiceCondition("stopped-enabled", f"stopped but enabled (starts at boot){last}")
        if state.unit_file_state == "disabled":
            return ServiceCondition(
                "stopped-disabled", f"stopped and disabled (will not start at boot){last}")
        if state.unit_file_state in _STATIC:
            return ServiceCondition(
                "stopped-static",
                f"stopped ({state.unit_file_state}: starts only when another unit pulls it in){last}")
        return ServiceCondition("stopped-disabled", f"stopped (unit file state "
                                f"{state.unit_file_state or 'unknown'}){last}")
    return ServiceCondition("unknown", f"unknown state ActiveState={active} SubState={sub}")


def health_words(health: ServiceHealth | None) -> str | None:
    """Whether a running unit serves yet, in words (None: not asked). systemd says "running" from the
    moment the server process starts; the model may load for minutes after that."""
    if health is None:
        return None
    if health.serving:
        return "serving"
    if health.listening is False:
        return f"not serving yet: port {health.port} not open (loading?)"
    if not health.asked:
        return "serving unknown: no curl or python3 on the host to ask /health"
    if health.http_status == 503:
        return "not serving yet: /health answers 503 (loading)"
    if health.http_status is None:
        return (f"not serving: no answer from 127.0.0.1:{health.port}/health "
                "(refused, or none within 5 s, or the --timeout)")
    return f"not serving: /health answers {health.http_status}"


def gpu_summary(state: GpuState) -> str:
    """`3/8 busy · 130/766 GiB` (or why there is no such figure)."""
    if state.status == "missing":
        return "no nvidia-smi"
    if state.status == "no-devices":
        return "no GPUs"
    if state.status in ("timeout", "error", "not-run") and not state.gpus:
        return f"unknown ({state.status})"
    busy = [state.busy(g) for g in state.gpus]
    n_busy = sum(1 for b in busy if b is True)
    unknown = sum(1 for b in busy if b is None)
    text = f"{n_busy}/{len(state.gpus)} busy"
    if unknown:
        text += f" ({unknown} unknown)"
    used = [g.memory_used_mib for g in state.gpus]
    total = [g.memory_total_mib for g in state.gpus]
    if all(u is not None for u in used) and all(t is not None for t in total):
        text += f" · {_gib(sum(u for u in used if u is not None))}/" \
                f"{_gib(sum(t for t in total if t is not None))} GiB"
    return text


def _gib(mib: int) -> str:
    return f"{mib / 1024:.0f}" if mib >= 10 * 1024 else f"{mib / 1024:.1f}"
