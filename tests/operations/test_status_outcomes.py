"""How each per-host outcome of the fan-out becomes a status outcome and the command's exit code."""

from __future__ import annotations

from pathlib import Path

from ddtreectl.errors import ConnectError, ExitCode, HostKeyError, RemoteCommandError
from ddtreectl.fleet import DeadlineExceededError, HostResult
from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.operations.status import HostStatus, StatusReport, _host_status, gather_status

H = Host(name="h1", address="10.0.0.1")


def outcome_of(error: BaseException) -> HostStatus:
    return _host_status(HostResult(H, None, error, 0.1))


def test_errors_map_to_outcomes() -> None:
    assert outcome_of(ConnectError("cannot reach 10.0.0.1:22: connection refused", host="h1")).outcome == "unreachable"
    refused = outcome_of(HostKeyError("key mismatch: pinned SHA256:a, presented SHA256:b", hint="verify", host="h1"))
    assert (refused.outcome, refused.error, refused.hint) == (
        "refused", "key mismatch: pinned SHA256:a, presented SHA256:b", "verify")
    assert outcome_of(DeadlineExceededError("no answer within the 2 s deadline")).outcome == "timeout"
    assert outcome_of(RemoteCommandError("status probe failed (exit 127)")).outcome == "failed"
    bug = outcome_of(KeyError("boom"))
    assert bug.outcome == "failed" and bug.error.startswith("internal error: KeyError")
    assert isinstance(bug.exception, KeyError)


def report(*outcomes: str) -> StatusReport:
    """`bug` stands for a failure that was an exception in ddtreectl itself."""
    return StatusReport(tuple(
        HostStatus(H, "failed", error="internal error: KeyError") if o == "bug"
        else HostStatus(H, o) for o in outcomes), 10.0, 0.5)  # type: ignore[arg-type]


def test_exit_codes() -> None:
    assert report("ok", "ok").exit_code() == ExitCode.OK
    assert report("ok", "unreachable").exit_code() == ExitCode.PARTIAL
    assert report("ok", "timeout", "failed").exit_code() == ExitCode.PARTIAL
    # No host answered: the code their failures share, as a single-host command exits (README
    # "Exit codes"); `status HOST` on an unreachable host was 6 where every other command said 4.
    assert report("unreachable").exit_code() == ExitCode.CONNECTION
    assert report("timeout").exit_code() == ExitCode.CONNECTION
    assert report("unreachable", "timeout").exit_code() == ExitCode.CONNECTION
    assert report("failed").exit_code() == ExitCode.REMOTE
    assert report("unreachable", "failed").exit_code() == ExitCode.PARTIAL
    assert report("unreachable", "refused").exit_code() == ExitCode.CONNECTION
    assert report("ok", "bug").exit_code() == ExitCode.INTERNAL
    assert report("bug", "refused").exit_code() == ExitCode.CONNECTION


def test_a_swapped_machine_is_refused_even_with_the_right_key(tmp_path: Path) -> None:
    """A local host whose recorded machine-id is not this machine's: facts kept, outcome refused."""
    host = Host(name="here", address="127.0.0.1", transport="local", machine_id="0" * 32,
                remote_root=str(tmp_path))
    inventory = Inventory(path=tmp_path / "hosts.yaml", hosts={"here": host}, groups={}, services={})
    result = gather_status(inventory, [host], deadline_s=30)
    (status,) = result.hosts
    assert status.outcome == "refused" and status.facts is not None
    assert status.error.startswith(f"machine-id is {Path('/etc/machine-id').read_text().strip()}")
    assert result.exit_code() == ExitCode.CONNECTION
