"""Drain a serving host before it is stopped: wait until the server reports no request running or
queued (`sglang:num_running_reqs + sglang:num_queue_reqs == 0` on /metrics, SGLang's names, which the
reference server uses too), bounded by a timeout.

SGLang has no endpoint that stops admitting work, so the drain waits for a quiet moment; `systemctl
stop` then sends SIGTERM, on which the reference server refuses new requests and finishes running
ones (SGLang stops at once). Without /metrics (not enabled, port closed) nothing can be measured:
the result says so instead of claiming a drain.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable

from ddtreectl.errors import ConnectError, RemoteCommandError
from ddtreectl.transport.base import Transport

DRAIN_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def in_flight(metrics_text: str) -> int | None:
    """Running + queued requests from Prometheus text (summed over label sets, e.g. per model);
    None when neither gauge is present."""
    total = 0.0
    seen = False
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match or match.group(1) not in DRAIN_METRICS:
            continue
        try:
            total += float(match.group(3))
        except ValueError:
            continue
        seen = True
    return int(total) if seen else None


@dataclass(frozen=True)
class DrainResult:
    measured: bool  # /metrics answered with the drain gauges at least once
    drained: bool  # the last reading was 0
    in_flight: int | None  # last reading
    waited_s: float
    note: str

    def to_json(self) -> dict[str, object]:
        return {"measured": self.measured, "drained": self.drained, "in_flight": self.in_flight,
                "waited_s": round(self.waited_s, 3), "note": self.note}


def reading_steps(on_step: Callable[[str], None]) -> Callable[[int], None]:
    """`drain`'s on_reading as progress lines: a count only when it changed. A reading of 0 is the
    drain's end, which its note says ("no request running or queued"); printing "0 request(s) in
    flight" before it said the same fact twice, and an unchanged count every poll filled the screen."""
    said: list[int] = []

    def on_reading(n: int) -> None:
        if n and (not said or said[-1] != n):
            said.append(n)
            on_step(f"{n} request(s) in flight")
    return on_reading


def drain(transport: Transport, port: int, *, timeout_s: float, poll_s: float = 0.5,
          on_reading: Callable[[int], None] = lambda n: None,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> DrainResult:
    """Poll /metrics through the transport until nothing is in flight or `timeout_s` passes."""
    started = clock()
    last: int | None = None
    measured = False
    while True:
        try:
            response = transport.http_get(port, "/metrics", timeout=10)
            reading = in_flight(response.body.decode("utf-8", "replace")) if response.status == 200 else None
        except (ConnectError, RemoteCommandError):
            reading = None
        waited = clock() - started
        if reading is None and not measured:
            return DrainResult(False, False, None, waited,
                               f"no drain metrics on port {port} (/metrics absent or port closed): not measured")
        if reading is None:
            return DrainResult(True, False, last, waited, "the server stopped answering /metrics while draining")
        measured, last = True, reading
        on_reading(reading)
        if reading == 0:
            return DrainResult(True, True, 0, waited, "no request running or queued")
        if waited >= timeout_s:
            return DrainResult(True, False, last, waited,
                               f"{last} request(s) still in flight after the {timeout_s:g} s drain timeout")
        sleep(poll_s)
