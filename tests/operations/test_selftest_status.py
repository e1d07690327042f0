"""The self-test's exit status reaches deploy even when nothing more can be written next to the release.

The status used to travel through `../.selftest-rc`, which a full disk refuses; the script then exited
with an empty or made-up status. A directory in the file's place makes that write fail the same way,
and a stand-in `ddtree-selftest` (a shell script) runs through the real local transport.
"""

from __future__ import annotations

from pathlib import Path

from ddtreectl.inventory.models import Host
from ddtreectl.operations.build import run_selftest
from ddtreectl.transport.local import LocalTransport


def stage(root: Path, release: str, exit_code: int) -> Path:
    build = root / "releases" / f".incoming-{release}" / "build"
    build.mkdir(parents=True)
    selftest = build / "ddtree-selftest"
    selftest.write_text(f"#!/bin/sh\necho 'check one: {'ok' if exit_code == 0 else 'FAIL'}'\nexit {exit_code}\n")
    selftest.chmod(0o755)
    return build.parent


def run(root: Path, release: str) -> tuple[str, bool, str]:
    host = Host(name="here", address="127.0.0.1", transport="local", remote_root=str(root))
    with LocalTransport(host) as t:
        out = run_selftest(t, str(root), release, has_gpu=True, expected_gpus=1, timeout=30)
    return out.verdict, out.ok, out.tail


def test_a_failing_selftest_reports_its_own_exit_status(tmp_path: Path) -> None:
    inc = stage(tmp_path, "r7", 7)
    (inc / ".selftest-rc").mkdir()  # no status file can be written there
    verdict, ok, tail = run(tmp_path, "r7")
    assert (verdict, ok) == ("failed (exit 7)", False)
    assert "check one: FAIL" in tail
    assert "check one: FAIL" in (inc / "selftest.log").read_text()


def test_a_passing_selftest_passes_and_keeps_its_log(tmp_path: Path) -> None:
    inc = stage(tmp_path, "r0", 0)
    (inc / ".selftest-rc").mkdir()
    verdict, ok, _ = run(tmp_path, "r0")
    assert (verdict, ok) == ("passed", True)
    assert (inc / "selftest.log").read_text() == "check one: ok\n"


def test_a_release_without_a_build_is_exit_3(tmp_path: Path) -> None:
    (tmp_path / "releases" / ".incoming-rx").mkdir(parents=True)
    verdict, ok, _ = run(tmp_path, "rx")
    assert (verdict, ok) == ("failed (exit 3)", False)
