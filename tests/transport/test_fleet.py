"""run_on_hosts: one global deadline, per-host outcomes, no waiting for stragglers."""

from __future__ import annotations

import subprocess
import sys
import threading

from ddtreectl.errors import ConnectError, ExitCode, HostKeyError
from ddtreectl.fleet import DeadlineExceededError, run_on_hosts
from ddtreectl.inventory.models import Host

HOSTS = [Host(name=f"h{i}", address=f"10.200.0.{i + 2}") for i in range(6)]


def test_all_ok_in_input_order() -> None:
    result = run_on_hosts(HOSTS, lambda h: h.name.upper(), deadline_s=30, max_workers=3)
    assert [r.value for r in result.results] == [h.name.upper() for h in HOSTS]
    assert result.exit_code() == ExitCode.OK and not result.failed
    assert result["h2"].ok and result["h2"].duration_s >= 0


def test_straggler_is_written_off_at_the_deadline_and_others_finish() -> None:
    release = threading.Event()  # never set during the run: h0 would block for 30 s

    def fn(host: Host) -> str:
        if host.name == "h0":
            release.wait(30)
        if host.name == "h1":
            raise ConnectError("connection refused", host=host.name)
        return "ok"

    try:
        result = run_on_hosts(HOSTS, fn, deadline_s=0.5)
        # We got here while h0 is still blocked: the fan-out did not wait for it.
        assert not release.is_set()
    finally:
        release.set()
    assert result["h0"].timed_out and isinstance(result["h0"].error, DeadlineExceededError)
    assert "0.5 s deadline" in str(result["h0"].error)
    # No option of the caller sets this deadline: the hint must not invent one (it said "raise
    # --deadline" for every command, an option only deploy has; status calls it --timeout).
    hint = result["h0"].error.hint or ""
    assert "--deadline" not in hint and "`ddtreectl set-ip h0 ADDRESS`" in hint
    assert isinstance(result["h1"].error, ConnectError) and not result["h1"].timed_out
    assert [r.host.name for r in result.ok] == ["h2", "h3", "h4", "h5"]
    assert result.exit_code() == ExitCode.PARTIAL


def test_hosts_queued_behind_busy_workers_are_reported_never_started() -> None:
    release = threading.Event()
    try:
        result = run_on_hosts(HOSTS[:3], lambda h: release.wait(30), deadline_s=0.3, max_workers=1)
    finally:
        release.set()
    assert all(r.timed_out for r in result.results)
    assert "never started" in str(result["h2"].error)
    assert "never started" not in str(result["h0"].error)


def test_host_key_refusal_outranks_partial_and_bugs_are_internal() -> None:
    def fn(host: Host) -> int:
        if host.name == "h0":
            raise HostKeyError("HOST KEY MISMATCH", host=host.name)
        if host.name == "h1":
            raise ConnectError("timed out", host=host.name)
        return 1

    assert run_on_hosts(HOSTS, fn, deadline_s=10).exit_code() == ExitCode.CONNECTION
    bug = run_on_hosts(HOSTS[:2], lambda h: 1 // (h.name == "h0"), deadline_s=10)
    assert isinstance(bug["h1"].error, ZeroDivisionError) and bug["h0"].value == 1
    assert bug.exit_code() == ExitCode.INTERNAL


def test_process_exit_does_not_wait_for_a_straggler() -> None:
    # A worker blocked for 30 s must not keep the interpreter alive after the result is in.
    code = (
        "import threading\n"
        "from ddtreectl.fleet import run_on_hosts\n"
        "from ddtreectl.inventory.models import Host\n"
        "block = threading.Event()\n"
        "r = run_on_hosts([Host(name='a', address='10.200.0.2')], lambda h: block.wait(30),"
        " deadline_s=0.2)\n"
        "print(r.results[0].timed_out)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


def test_the_deadline_hint_names_the_callers_option() -> None:
    release = threading.Event()
    try:
        result = run_on_hosts(HOSTS[:1], lambda h: release.wait(30), deadline_s=0.2, deadline_option="--timeout")
    finally:
        release.set()
    assert (result["h0"].error.hint or "").endswith("; raise --timeout to wait longer")  # type: ignore[union-attr]
