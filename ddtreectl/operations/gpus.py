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
    started = clock()
    rounds = 0
    while True:
        verdict = check_gpus(transport, inventory, host, options)
        rounds += 1
        on_round(verdict)
        waited = clock() - started
        if verdict.idle or verdict.settled or waited >= timeout_s:
            return GpuCheck(host.name, verdict, waited, rounds)
        sleep(min(poll_s, max(0.0, timeout_s - waited)))
