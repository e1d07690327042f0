"""Remove what crashed test runs left behind: `python3 -m tests.testbed.cleanup`.

Cleans every slot whose lock is free (a live fleet holds its slot's flock, so it is never touched):
kills leftover host cgroups (cgroup.kill), removes them bottom-up, deletes the slot's bridge and veths
and its work dir. .ci/run calls this at start and from its EXIT trap.
"""

from __future__ import annotations

import os
import sys

from tests.testbed.layout import BASE_DIR, CGROUP_PARENT, LINK_PREFIX, NUM_SLOTS, Slot, SlotLock, cgroup2_mount
from tests.testbed.resources import clean_slot


def main() -> int:
    if os.geteuid() != 0:
        print("testbed cleanup: not root, nothing to do")
        return 0
    cgroup_root = cgroup2_mount()
    ran_here = (BASE_DIR.exists() or any(n.startswith(LINK_PREFIX) for n in os.listdir("/sys/class/net"))
                or (cgroup_root is not None and (cgroup_root / CGROUP_PARENT).exists()))
    if not ran_here:
        return 0
    if cgroup_root is None:
        print("testbed cleanup: no cgroup2 mounted; cleaning links and work dirs only")
        cgroup_root = BASE_DIR / "no-cgroup2"  # a path that does not exist: no cgroup is touched
    status = 0
    for number in range(NUM_SLOTS):
        lock = SlotLock(number)
        if not lock.try_acquire():
            print(f"testbed cleanup: slot {number} is in use, skipped")
            continue
        try:
            slot = Slot(number, cgroup_root)
            for item in clean_slot(slot):
                print(f"testbed cleanup: slot {number}: removed {item}")
        except Exception as exc:  # report and go on with the other slots
            print(f"testbed cleanup: slot {number}: {exc}", file=sys.stderr)
            status = 1
        finally:
            lock.release()
    return status


if __name__ == "__main__":
    sys.exit(main())
