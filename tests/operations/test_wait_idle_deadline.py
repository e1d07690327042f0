"""`gpus --wait-idle --timeout S` (and `mode HOST dev --idle-timeout S`, which waits the same way) ends
by its deadline. The loop is driven with a simulated clock: each sampling round "takes" its window
on that clock, so the test checks where the rounds fall, never how long anything really took."""

from __future__ import annotations

import pytest

from ddtreectl.operations.gpus import poll_until_idle
from ddtreectl.probes.gpu_verdict import HostVerdict

BUSY = HostVerdict(verdict="busy", reasons=("GPU 0: 20993 MiB of 143771 MiB used",), signals=("memory",),
                   gpus=(), processes=(), samples=3, interval_s=1.0, nvidia_smi_ms=25)


class SimulatedHost:
    """A clock, a sleep that advances it, and a GPU check whose round takes `round_s` on it."""

    def __init__(self, round_s: float, idle_at: float | None = None) -> None:
        self.now = 1000.0
        self.round_s = round_s
        self.idle_at = idle_at
        self.round_ends: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds

    def check(self) -> HostVerdict:
        start = self.now
        self.now += self.round_s
        self.round_ends.append(self.now - 1000.0)
        if self.idle_at is not None and start - 1000.0 >= self.idle_at:
            return HostVerdict(verdict="idle", reasons=(), signals=(), gpus=(), processes=(), samples=3,
                               interval_s=1.0, nvidia_smi_ms=25)
        return BUSY


# 2.04 s: the window measured for the defaults (3 samples 1 s apart) on a local host; 0.05 s: --samples 1.
@pytest.mark.parametrize("round_s,timeout_s", [(2.04, 5.0), (2.04, 4.5), (2.04, 10.0), (2.04, 60.0), (0.05, 5.0),
                                                (0.05, 33.3), (7.3, 10.0), (7.3, 33.3)])
def test_a_busy_host_is_given_up_on_by_the_deadline_not_one_window_past_it(round_s: float, timeout_s: float) -> None:
    host = SimulatedHost(round_s)
    verdict, waited, rounds = poll_until_idle(host.check, timeout_s=timeout_s, poll_s=2.0,
                                              clock=host.clock, sleep=host.sleep)
    assert verdict.verdict == "busy" and rounds == len(host.round_ends)
    assert waited == pytest.approx(host.round_ends[-1])
    assert waited <= timeout_s + 1e-9  # before: 6.08 s for --timeout 5 (the next window ran past it)
    assert waited > timeout_s - max(round_s, 2.0)  # and it did not give up more than a round/poll early
    gaps = [b - a - round_s for a, b in zip(host.round_ends, host.round_ends[1:])]
    assert all(-1e-9 <= g <= 2.0 + 1e-9 for g in gaps)  # polls at most every poll_s between rounds


def test_the_first_round_always_runs_whole() -> None:
    """A verdict needs one whole window, even when --timeout is shorter than it."""
    host = SimulatedHost(2.04)
    verdict, waited, rounds = poll_until_idle(host.check, timeout_s=1.0, poll_s=2.0, clock=host.clock,
                                              sleep=host.sleep)
    assert (verdict.verdict, rounds) == ("busy", 1) and waited == pytest.approx(2.04)
    host = SimulatedHost(0.0)
    assert poll_until_idle(host.check, timeout_s=0.0, poll_s=2.0, clock=host.clock, sleep=host.sleep)[2] == 1


def test_it_returns_on_the_first_idle_round() -> None:
    host = SimulatedHost(2.04, idle_at=5.0)
    verdict, waited, rounds = poll_until_idle(host.check, timeout_s=60.0, poll_s=2.0, clock=host.clock,
                                              sleep=host.sleep)
    assert verdict.idle and rounds == 3 and waited == pytest.approx(host.round_ends[-1])
