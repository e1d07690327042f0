"""Pure parts of mode/run/drain: lease parsing and expiry, durations, who may run, the drain reading
and loop (through a scripted transport; the real drain runs in tests/e2e/test_mode.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from ddtreectl.errors import ConnectError, GpusBusyError, LockHeldError
from ddtreectl.inventory.models import Host
from ddtreectl.operations.dev_run import check_run_allowed
from ddtreectl.operations.drain import drain, in_flight, reading_steps
from ddtreectl.operations.mode import HostMode
from ddtreectl.probes.mode_lease import ModeLease, mode_words, parse_duration, parse_lease
from ddtreectl.transport.base import HttpResponse

HOST = Host(name="h1", address="10.0.0.1")
NOW = 1_800_000_000


def dev_lease(holder: str = "alice@box", expires: int = NOW + 3600) -> ModeLease:
    lease = parse_lease(json.dumps({"mode": "dev", "holder": holder, "reason": "bench", "since": NOW - 60,
                                    "expires": expires, "unit": "x.service"}))
    assert lease is not None
    return lease


@pytest.mark.parametrize("text,seconds", [("8h", 28800), ("30m", 1800), ("90s", 90), ("1d", 86400),
                                          ("3600", 3600), ("1.5h", 5400), (" 2 min ", 120)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "8 hours", "-1h", "0", "h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_lease_parsing_expiry_and_words() -> None:
    assert parse_lease(None) is None and parse_lease("  \n") is None
    lease = dev_lease()
    assert (lease.mode, lease.holder, lease.unit, lease.expired(NOW)) == ("dev", "alice@box", "x.service", False)
    assert lease.expired(NOW + 3600) and lease.expired(NOW + 7200)
    assert "59 min left" in lease.describe(NOW + 60)
    assert "EXPIRED 1 h 00 min ago" in lease.describe(NOW + 7200)
    assert mode_words(lease, NOW + 7200).startswith("mode dev: EXPIRED alice@box until ")
    assert mode_words(None, NOW) == "mode prod"
    broken = parse_lease("{not json")
    assert broken is not None and broken.mode == "unknown" and "unreadable" in broken.describe(NOW)
    assert parse_lease('{"mode": "maintenance"}').mode == "unknown"  # type: ignore[union-attr]
    prod = parse_lease(json.dumps({"mode": "prod", "holder": "bob@box", "since": NOW}))
    assert prod is not None and not prod.expired(NOW + 10**9) and prod.to_json(NOW)["expired"] is False


def test_who_may_run() -> None:
    check_run_allowed(HostMode(dev_lease(), NOW, True), HOST, "alice@box")
    with pytest.raises(GpusBusyError, match="production mode"):
        check_run_allowed(HostMode(None, NOW, True), HOST, "alice@box")
    with pytest.raises(LockHeldError, match="alice@box") as held:
        check_run_allowed(HostMode(dev_lease(), NOW, True), HOST, "bob@box")
    assert held.value.exit_code == 8
    with pytest.raises(LockHeldError, match="your development lease expired"):
        check_run_allowed(HostMode(dev_lease(expires=NOW - 1), NOW, True), HOST, "alice@box")


METRICS = """# HELP sglang:num_running_reqs Requests decoding in a batch slot now.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="a"} 2
sglang:num_running_reqs{model_name="b"} 1.0
sglang:num_queue_reqs{model_name="a"} 4
sglang:num_running_reqs_other 9
sglang:prompt_tokens_total{model_name="a"} 100
"""


def test_in_flight_sums_running_and_queued_over_label_sets() -> None:
    assert in_flight(METRICS) == 7
    assert in_flight("sglang:num_queue_reqs 0\n") == 0
    assert in_flight("# nothing\nother_metric 3\n") is None


@dataclass
class MetricsTransport:
    """Answers /metrics from `readings` in turn (an int, or an exception to raise)."""

    readings: list[object]
    host_name: str = "h1"
    calls: list[str] = field(default_factory=list)

    def http_get(self, port: int, path: str, *, timeout: float) -> HttpResponse:
        self.calls.append(path)
        value = self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]
        if isinstance(value, Exception):
            raise value
        body = f"sglang:num_running_reqs 0\nsglang:num_queue_reqs {value}\n"
        return HttpResponse(200, body.encode(), {})


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_drain_waits_until_nothing_is_in_flight() -> None:
    clock, seen = Clock(), []
    result = drain(MetricsTransport([3, 2, 2, 0]), 30000, timeout_s=60, on_reading=seen.append,  # type: ignore[arg-type]
                   clock=clock.now, sleep=clock.sleep)
    assert result.measured and result.drained and seen == [3, 2, 2, 0] and result.waited_s == 1.5


def test_drain_progress_says_each_new_count_and_never_zero() -> None:
    """`mode dev` printed "0 request(s) in flight" and then the note "no request running or queued" (the
    same fact twice), and an unchanged count at every poll."""
    for readings, said in (([0], []), ([3, 2, 2, 0], ["3 request(s) in flight", "2 request(s) in flight"]),
                           ([2, 2, 5], ["2 request(s) in flight", "5 request(s) in flight"])):
        lines: list[str] = []
        clock = Clock()
        drain(MetricsTransport(readings), 30000, timeout_s=60, on_reading=reading_steps(lines.append),  # type: ignore[arg-type]
              clock=clock.now, sleep=clock.sleep)
        assert lines == said, (readings, lines)


def test_drain_is_bounded_and_says_what_was_left() -> None:
    clock = Clock()
    result = drain(MetricsTransport([5]), 30000, timeout_s=10, clock=clock.now, sleep=clock.sleep)  # type: ignore[arg-type]
    assert result.measured and not result.drained and result.in_flight == 5
    assert "5 request(s) still in flight after the 10 s drain timeout" == result.note


def test_drain_without_metrics_is_not_claimed() -> None:
    clock = Clock()
    closed = ConnectError("port closed", host="h1")
    result = drain(MetricsTransport([closed]), 30000, timeout_s=10, clock=clock.now, sleep=clock.sleep)  # type: ignore[arg-type]
    assert not result.measured and not result.drained and "not measured" in result.note
    gone = drain(MetricsTransport([2, closed]), 30000, timeout_s=10, clock=clock.now, sleep=clock.sleep)  # type: ignore[arg-type]
    assert gone.measured and not gone.drained and gone.in_flight == 2 and "stopped answering" in gone.note
