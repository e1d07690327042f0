"""Names, addresses and paths of one fleet "slot", and the flock that owns it.

Several pytest runs share this machine, so every resource a fleet creates (bridge, veths, cgroups,
work dir, subnets) carries its slot number, and a slot is owned by whoever holds its flock. Cleanup of
leftovers only ever touches slots whose lock is free, so it can never hit a fleet that is alive.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

NUM_SLOTS = 8
BASE_DIR = Path("/var/tmp/ddtreectl-testbed")
LOCK_DIR = BASE_DIR / "locks"
CGROUP_PARENT = "ddtreectl-testbed"
LINK_PREFIX = "ddtb"


def cgroup2_mount() -> Path | None:
    """Where the cgroup2 hierarchy is mounted: /sys/fs/cgroup (pure v2) or .../unified (hybrid)."""
    found = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # "36 25 0:31 / /sys/fs/cgroup/unified rw,... - cgroup2 cgroup2 rw"
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            found.add(Path(left.split(" ")[4]))
    for candidate in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if candidate in found:
            return candidate  # pure v2 first: a cgroup2 on /sys/fs/cgroup hides .../unified
    return None


@dataclass(frozen=True)
class Slot:
    """Everything a fleet in slot `number` may create. Nothing outside these names is ever touched."""

    number: int
    cgroup_root: Path  # the cgroup2 mount point

    @property
    def bridge(self) -> str:
        return f"{LINK_PREFIX}{self.number}"

    def veth(self, index: int) -> str:
        """Root-side veth name of host `index` (<= 15 chars, slot-prefixed)."""
        name = f"{LINK_PREFIX}{self.number}h{index}"
        assert len(name) <= 15, name
        return name

    @property
    def cgroup(self) -> Path:
        """Parent cgroup of this slot's hosts; each host gets a child cgroup below it."""
        return self.cgroup_root / CGROUP_PARENT / f"slot{self.number}"

    @property
    def workdir(self) -> Path:
        return BASE_DIR / f"slot{self.number}"

    @property
    def gateway(self) -> str:
        return f"10.{200 + self.number}.0.1"

    @property
    def vlan_gateway(self) -> str:
        """The bridge's address in the second ("new VLAN") subnet."""
        return f"10.{220 + self.number}.0.1"

    def host_address(self, index: int) -> str:
        return _in_subnet(200 + self.number, index)

    def vlan_address(self, index: int) -> str:
        return _in_subnet(220 + self.number, index)


def _in_subnet(second_octet: int, index: int) -> str:
    """index 0.. -> 10.X.1.1, 10.X.1.2, ... 10.X.1.254, 10.X.2.1, ... (never .0.N: gateways live there)."""
    if not 0 <= index < 254 * 250:
        raise ValueError(f"address index {index} out of range")
    return f"10.{second_octet}.{1 + index // 254}.{1 + index % 254}"


class SlotLock:
    """An flock on slots' lock files; held for the fleet's lifetime (the fd is close-on-exec)."""

    def __init__(self, number: int) -> None:
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        self.number = number
        self.path = LOCK_DIR / f"slot{number}.lock"
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def acquire_free_slot(wait: float = 300) -> tuple[SlotLock, int]:
    """Lock the first free slot, waiting up to `wait` s for one; RuntimeError if all stay busy."""
    deadline = time.monotonic() + wait
    while True:
        for number in range(NUM_SLOTS):
            lock = SlotLock(number)
            if lock.try_acquire():
                return lock, number
        if time.monotonic() > deadline:
            raise RuntimeError(f"all {NUM_SLOTS} testbed slots stayed in use for {wait}s (locks in {LOCK_DIR})")
        time.sleep(1)
