"""LocalTransport: real /bin/sh subprocesses, real sockets."""

from __future__ import annotations

import http.server
import os
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from ddtreectl.errors import RemoteCommandError
from ddtreectl.inventory.models import Host
from ddtreectl.transport import connect
from ddtreectl.transport.base import PortClosedError
from ddtreectl.transport.local import LocalTransport

HOST = Host(name="local", address="127.0.0.1", transport="local", command_timeout=20.0)


@pytest.fixture
def local() -> Iterator[LocalTransport]:
    t = connect(HOST)
    assert isinstance(t, LocalTransport)
    with t:
        yield t


def test_exit_codes_and_streams(local: LocalTransport) -> None:
    r = local.run("printf 'a\\nb'; printf oops >&2; exit 7")
    assert (r.exit_code, r.stdout, r.stderr, r.ok) == (7, "a\nb", "oops", False)
    assert local.run("true").ok


def test_runs_posix_sh_with_quoted_parts(local: LocalTransport) -> None:
    r = local.run("set -- 'it''s' \"a b\"; echo $#; echo \"$2\"")
    assert r.stdout == "2\na b\n"


def test_stdin_bytes_reach_the_command(local: LocalTransport) -> None:
    data = os.urandom(300_000)  # larger than a pipe buffer: needs the writer thread
    r = local.run("sha256sum | cut -d' ' -f1", stdin=data)
    import hashlib
    assert r.stdout.strip() == hashlib.sha256(data).hexdigest()


def test_no_stdin_means_eof(local: LocalTransport) -> None:
    assert local.run("cat", timeout=5).stdout == ""


def test_on_line_streams_before_exit(local: LocalTransport) -> None:
    seen: list[tuple[str, bool]] = []
    marker = Path(f"/tmp/ddtreectl-local-test-{os.getpid()}")
    marker.unlink(missing_ok=True)

    def on_line(line: str) -> None:
        # The command waits for this file: the first line must arrive while it is still running.
        seen.append((line, marker.exists()))
        marker.touch()

    r = local.run(f"echo first; while [ ! -e {marker} ]; do sleep 0.01; done; printf 'second\\nthird'",
                  on_line=on_line, timeout=10)
    marker.unlink(missing_ok=True)
    assert seen == [("first", False), ("second", True), ("third", True)]
    assert r.stdout == "first\nsecond\nthird"


def test_timeout_kills_the_whole_process_group(local: LocalTransport, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    # The grandchild ignores SIGTERM: only the group SIGKILL after the grace period ends it.
    with pytest.raises(RemoteCommandError, match="timed out after 0.5 s") as err:
        local.run(f"sh -c 'trap \"\" TERM; echo $$ > {pidfile}; sleep 60' & wait", timeout=0.5)
    assert err.value.host == "local"
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = f"path={self.path} conn={self.headers['Connection']}".encode()
        self.send_response(200 if self.path == "/health" else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_http_get_and_port_open(local: LocalTransport) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        resp = local.http_get(port, "/health", timeout=5)
        assert (resp.status, resp.body) == (200, b"path=/health conn=close")
        assert local.http_get(port, "/health_generate", timeout=5).status == 503
        assert local.port_open(port, timeout=2)
    finally:
        server.shutdown()
        server.server_close()
    assert not local.port_open(port, timeout=2)
    with pytest.raises(PortClosedError, match=f"127.0.0.1:{port} not reachable"):
        local.http_get(port, "/health", timeout=2)


def test_rsync_helpers_are_local(local: LocalTransport) -> None:
    assert local.rsync_ssh_command() is None
    assert local.rsync_destination("~/x") == os.path.expanduser("~/x")


def test_a_failing_on_line_callback_does_not_leave_the_command_running(
    local: LocalTransport, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"

    def on_line(line: str) -> None:
        raise ValueError(f"consumer gave up at {line!r}")

    with pytest.raises(ValueError, match="consumer gave up at 'started'"):
        local.run(f"sh -c 'echo $$ > {pidfile}; exec sleep 60' & sleep 0.2; echo started; wait",
                  on_line=on_line, timeout=30)
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


class Cancelled(Exception):
    pass


def test_on_tick_stops_a_quiet_command(local: LocalTransport, tmp_path: Path) -> None:
    """A command that prints nothing (a long compile step) is still abandoned when on_tick raises,
    and its process group dies: the file it would create afterwards never appears."""
    pidfile, late = tmp_path / "pid", tmp_path / "late"
    ticks: list[float] = []

    def on_tick() -> None:
        ticks.append(time.monotonic())
        if pidfile.exists() and len(ticks) >= 2:
            raise Cancelled

    with pytest.raises(Cancelled):
        local.run(f"echo $$ > {pidfile}; sleep 3; touch {late}", on_tick=on_tick, timeout=60)
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    time.sleep(3.5)
    assert not late.exists()
