"""Real test hosts for ddtreectl's ops tests: systemd + sshd per host, in namespaces (see README.md)."""

from tests.testbed.fleet import BootError, Fleet
from tests.testbed.host import TestHost

__all__ = ["BootError", "Fleet", "TestHost"]
