"""Shared fixtures. `testbed`: real systemd + sshd test hosts (tests/testbed/README.md)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest


def _testbed_unavailable() -> str | None:
    """Why real test hosts cannot run here, or None."""
    from tests.testbed.layout import cgroup2_mount

    if os.geteuid() != 0:
        return "testbed needs root"
    for tool in ("unshare", "setpriv", "nsenter", "ip", "ssh-keygen", "ssh"):
        if shutil.which(tool) is None:
            return f"testbed needs {tool} (apt-get install util-linux iproute2 openssh-client)"
    if not os.path.exists("/usr/sbin/sshd"):
        return "testbed needs /usr/sbin/sshd (apt-get install openssh-server; scripts/test does it)"
    if not os.path.exists("/lib/systemd/systemd"):
        return "testbed needs /lib/systemd/systemd (apt-get install systemd)"
    if cgroup2_mount() is None:
        return "testbed needs cgroup2 at /sys/fs/cgroup or /sys/fs/cgroup/unified"
    if not os.path.exists("/proc/self/ns/cgroup"):
        return "testbed needs cgroup namespaces"
    return None


@pytest.fixture(scope="session")
def testbed() -> Iterator[Any]:
    """A Fleet owning one slot (bridge, subnets, cgroups) for the whole session; torn down at exit."""
    reason = _testbed_unavailable()
    if reason:
        pytest.skip(reason)
    from tests.testbed import Fleet

    fleet = Fleet()
    try:
        yield fleet
    finally:
        fleet.close()


@pytest.fixture
def boot_hosts(testbed: Any) -> Iterator[Callable[..., list[Any]]]:
    """`boot_hosts(names, **kw)`: Fleet.boot, with every host shut down when the test ends."""
    booted: list[Any] = []

    def boot(names: list[str], **kwargs: Any) -> list[Any]:
        hosts = testbed.boot(names, **kwargs)
        booted.extend(hosts)
        return hosts

    yield boot
    testbed.shutdown_all(booted)


@pytest.fixture(autouse=True)
def ssh_control_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every test gets its own OpenSSH master directory (short: socket paths max out at 108 bytes),
    inherited by the ddtreectl processes it starts; masters left there are closed at teardown,
    so no test leaves a logged-in connection behind or reuses another test's."""
    import tempfile

    from ddtreectl.transport.control import ENV_CONTROL_DIR, close_all_masters

    directory = tempfile.mkdtemp(prefix="ddt-cm-", dir="/tmp")
    monkeypatch.setenv(ENV_CONTROL_DIR, directory)
    try:
        yield directory
    finally:
        close_all_masters(directory)
        shutil.rmtree(directory, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # a test that boots hosts is a testbed test, marked or not (`-m "not testbed"` must skip it)
    for item in items:
        if "testbed" in getattr(item, "fixturenames", ()) and item.get_closest_marker("testbed") is None:
            item.add_marker(pytest.mark.testbed)
