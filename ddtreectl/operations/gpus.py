"""`gpus` as an operation: sample a host's GPUs (one round trip) and decide idle / busy / unknown;
optionally poll until idle. Read-only: it changes nothing on the host."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.probes.gpu_sample import DEFAULT_GPU_TIMEOUT_S, DEFAULT_INTERVAL_S, DEFAULT_SAMPLES, sample_gpus
from ddtreectl.probes.gpu_verdict import HostVerdict, gpu_verdict
from ddtreectl.transport.base import Transport


@dataclass(frozen=True)
class SampleOptions:
    samples: int = DEFAULT_SAMPLES
    interval_s: float = DEFAULT_INTERVAL_S
    gpu_timeout_s: int = DEFAULT_GPU_TIMEOUT_S


@dataclass(frozen=True)
class GpuCheck:
    """A host's verdict and how long `--wait-idle` waited for it (0 without waiting)."""

    host: str
    verdict: HostVerdict
    waited_s: float = 0.0
    rounds: int = 1


def check_gpus(transport: Transport, inventory: Inventory, host: Host,
               options: SampleOptions = SampleOptions()) -> HostVerdict:
    """One sampling window on an open transport -> the host's verdict."""
    service = inventory.service_of(host)
    unit = service.unit if service else None
    samples = sample_gpus(transport, unit=unit, samples=options.samples, interval_s=options.interval_s,
                          gpu_timeout_s=options.gpu_timeout_s)
    return gpu_verdict(samples, unit=unit, expected_gpus=host.gpus)


def wait_idle(transport: Transport, inventory: Inventory, host: Host, options: SampleOptions, *,
              timeout_s: float, poll_s: float = 2.0,
              on_round: Callable[[HostVerdict], None] = lambda verdict: None,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> GpuCheck:
    """Sample until the verdict is idle or `timeout_s` has passed, or is unknown for good (no
    nvidia-smi); returns the last verdict either way."""
    verdict, waited, rounds = poll_until_idle(lambda: check_gpus(transport, inventory, host, options),
                                              timeout_s=timeout_s, poll_s=poll_s, on_round=on_round,
                                              clock=clock, sleep=sleep)
    return GpuCheck(host.name, verdict, waited, rounds)


def poll_until_idle(check: Callable[[], HostVerdict], *, timeout_s: float, poll_s: float,
                    on_round: Callable[[HostVerdict], None] = lambda verdict: None,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> tuple[HostVerdict, float, int]:
    """The polling loop of wait_idle: (last verdict, seconds waited, rounds).

    A round is a whole sampling window (samples x interval plus nvidia-smi's own time: ~2 s with the
    defaults), so the deadline is checked before a round starts, not after it ends: a round that
    started just before the deadline used to end up to one window past it (`gpus --wait-idle
    --timeout 5` returned after ~6.1 s). No round starts unless it can end by the deadline (judged by
    the longest round so far), and the last sleep is cut so that round ends at it. The first round
    always runs: a verdict needs one whole window, even when --timeout is shorter than that."""
    started = clock()
    rounds = 0
    longest = 0.0
    while True:
        began = clock()
        verdict = check()
        rounds += 1
        longest = max(longest, clock() - began)
        on_round(verdict)
        waited = clock() - started
        left = timeout_s - waited
        if verdict.idle or verdict.settled or left <= 0 or left < longest:
            return verdict, waited, rounds
        sleep(min(poll_s, left - longest))
