"""Run one function over many hosts in parallel under ONE global deadline.

A dead host costs its connect timeout once and never blocks the others; a host still running at
the deadline is reported as timed out and abandoned. Workers are daemon threads (not a
ThreadPoolExecutor, whose workers the interpreter joins at exit even after shutdown(wait=False)):
a straggler stuck in a 30 s TCP connect can neither delay the result nor the process exit.
Every host's outcome is collected; the caller decides the exit code (see FleetResult.exit_code).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Generic, Iterable, TypeVar

from ddtreectl.errors import (
    ConnectError,
    DdtreeError,
    ExitCode,
    HostKeyError,
    IdentityMismatchError,
    fan_out_exit_code,
)
from ddtreectl.inventory.models import Host

T = TypeVar("T")


class DeadlineExceededError(ConnectError):
    """The host gave no answer before the fan-out's global deadline."""


@dataclass(frozen=True)
class HostResult(Generic[T]):
    """One host's outcome: a value, or the error it raised (or DeadlineExceededError)."""

    host: Host
    value: T | None
    error: BaseException | None
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def timed_out(self) -> bool:
        return isinstance(self.error, DeadlineExceededError)

    @property
    def refused_identity(self) -> bool:
        """The host answered but its key (or machine identity) is not the one pinned for it."""
        return isinstance(self.error, (HostKeyError, IdentityMismatchError))


@dataclass(frozen=True)
class FleetResult(Generic[T]):
    """Every host's HostResult, in the order the hosts were given."""

    results: tuple[HostResult[T], ...]
    deadline_s: float

    @property
    def ok(self) -> list[HostResult[T]]:
        return [r for r in self.results if r.ok]

    @property
    def failed(self) -> list[HostResult[T]]:
        return [r for r in self.results if not r.ok]

    def __getitem__(self, name: str) -> HostResult[T]:
        for r in self.results:
            if r.host.name == name:
                return r
        raise KeyError(name)

    def exit_code(self) -> int:
        """0 when every host answered; 4 when any host's key/identity was refused (that needs a
        human, so it outranks everything); 1 when a failure was a bug, not a host; else the fan-out
        rule (errors.fan_out_exit_code): the code every failure shares, or 6 (some succeeded)."""
        failed = self.failed
        if any(r.refused_identity for r in failed):
            return int(ExitCode.CONNECTION)
        if any(not isinstance(r.error, DdtreeError) for r in failed):
            return int(ExitCode.INTERNAL)
        return fan_out_exit_code([int(r.error.exit_code) for r in failed if isinstance(r.error, DdtreeError)],
                                 len(self.results))


def run_on_hosts(
    hosts: Iterable[Host],
    fn: Callable[[Host], T],
    *,
    deadline_s: float,
    max_workers: int = 32,
    deadline_option: str | None = None,
) -> FleetResult[T]:
    """Call `fn(host)` for every host on up to `max_workers` daemon threads; return once all
    have finished or `deadline_s` has passed, whichever comes first.

    Exceptions never escape for one host: each is that host's `error` (a non-DdtreeError is
    kept too, so one host's surprise cannot hide the others' answers). KeyboardInterrupt in the
    caller's thread propagates; the abandoned workers die with the process.

    `deadline_option` is the command's option that sets the deadline (`--timeout`), named in the
    hint of a host written off by it; a command without one gets no "raise ..." advice.
    """
    host_list = list(hosts)
    started = time.monotonic()
    deadline = started + deadline_s
    done: dict[int, HostResult[T]] = {}
    lock = threading.Condition()
    next_index = 0

    def worker() -> None:
        nonlocal next_index
        while True:
            with lock:
                if next_index >= len(host_list) or time.monotonic() >= deadline:
                    return
                i = next_index
                next_index += 1
            host = host_list[i]
            t0 = time.monotonic()
            value: T | None = None
            error: BaseException | None = None
            try:
                value = fn(host)
            except BaseException as exc:  # noqa: BLE001 - recorded per host, see docstring
                error = exc
            with lock:
                if i not in done:  # the deadline may already have written this host off
                    done[i] = HostResult(host, value, error, time.monotonic() - t0)
                lock.notify_all()

    for n in range(min(max_workers, len(host_list))):
        threading.Thread(target=worker, name=f"fleet-{n}", daemon=True).start()

    with lock:
        while len(done) < len(host_list):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            lock.wait(remaining)
        now = time.monotonic()
        for i, host in enumerate(host_list):
            if i not in done:
                began = i < next_index
                done[i] = HostResult(
                    host, None,
                    DeadlineExceededError(
                        f"no answer within the {deadline_s:g} s deadline"
                        + ("" if began else " (never started: all workers were busy)"),
                        hint=f"the host may be down, slow, or at a new address (`ddtreectl set-ip {host.name} "
                             "ADDRESS`)" + (f"; raise {deadline_option} to wait longer" if deadline_option else ""),
                        host=host.name,
                    ),
                    now - started,
                )
    return FleetResult(tuple(done[i] for i in range(len(host_list))), deadline_s)
