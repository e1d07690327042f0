"""LocalTransport: the `local` host, run on this machine without SSH.

Commands run as `/bin/sh -c COMMAND` in their own session (process group) so that a timeout kills
the whole tree — a shell's `sleep` grandchild included — not just the shell.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from typing import IO, Callable

from ddtreectl.errors import CommandTimeoutError
from ddtreectl.inventory.models import Host
from ddtreectl.transport import http_wire
from ddtreectl.transport.base import HttpResponse, PortClosedError, RunResult

KILL_GRACE_S = 2.0  # SIGTERM first, SIGKILL if the group is still there after this


class LineSplitter:
    """Turns a byte stream into complete text lines for `on_line` (shared by both transports)."""

    def __init__(self, on_line: Callable[[str], None] | None) -> None:
        self._on_line = on_line
        self._pending = b""

    def feed(self, data: bytes) -> None:
        if self._on_line is None:
            return
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            self._on_line(line.decode("utf-8", "replace"))

    def flush(self) -> None:
        if self._on_line is not None and self._pending:
            self._on_line(self._pending.decode("utf-8", "replace"))
        self._pending = b""


class LocalTransport:
    """Runs commands on this machine; same contract as SshTransport."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.host_name = host.name
        self.last_abandoned: str | None = None  # what became of the last command an exception abandoned

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        on_line: Callable[[str], None] | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> RunResult:
        limit = self.host.command_timeout if timeout is None else timeout
        started = time.monotonic()
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # own process group: the timeout kill reaches grandchildren
        )
        if stdin is not None:
            assert proc.stdin is not None
            # A thread, so a command that reads slowly cannot deadlock us against its output.
            threading.Thread(target=feed_stdin, args=(proc.stdin, stdin), daemon=True).start()
        try:
            return self._collect(proc, command, limit, started, on_line, on_tick)
        except BaseException:
            # on_line raised, or Ctrl-C: never leave the command running behind our back.
            if proc.returncode is None:
                _kill_group(proc)
                self.last_abandoned = "it was stopped on the host"  # as SshTransport words it
            raise

    def _collect(self, proc: "subprocess.Popen[bytes]", command: str, limit: float,
                 started: float, on_line: Callable[[str], None] | None,
                 on_tick: Callable[[], None] | None = None) -> RunResult:
        assert proc.stdout is not None and proc.stderr is not None
        out, err = bytearray(), bytearray()
        lines = LineSplitter(on_line)
        deadline = started + limit
        timed_out = CommandTimeoutError(
            f"command timed out after {limit:g} s (process group killed): {_short(command)}",
            hint="raise the timeout (command_timeout in the inventory) or check the host",
            host=self.host_name,
        )
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            while sel.get_map():
                if on_tick is not None:
                    on_tick()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    _kill_group(proc)
                    lines.flush()  # a last line without its newline was output too (`run --json` keeps it)
                    raise timed_out
                for key, _ in sel.select(min(remaining, 1.0)):
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    key.data.extend(data)
                    if key.data is out:
                        lines.feed(data)
        lines.flush()
        try:
            code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise timed_out from None
        finally:
            proc.stdout.close()
            proc.stderr.close()
        return RunResult(
            command=command,
            exit_code=code,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            duration_s=time.monotonic() - started,
        )

    def http_get(self, port: int, path: str, *, timeout: float) -> HttpResponse:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        except OSError as exc:
            raise PortClosedError(
                f"127.0.0.1:{port} not reachable: {exc.strerror or exc}",
                hint="is the service running and listening on that port?",
                host=self.host_name,
            ) from None
        with sock:
            return http_wire.exchange(sock, port, path, timeout=timeout, host=self.host_name)

    def port_open(self, port: int, *, timeout: float) -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=timeout).close()
        except OSError:
            return False
        return True

    def rsync_ssh_command(self) -> list[str] | None:
        return None

    def rsync_destination(self, path: str) -> str:
        return os.path.expanduser(path)

    def close(self) -> None:
        pass

    def __enter__(self) -> "LocalTransport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def feed_stdin(pipe: IO[bytes], data: bytes) -> None:
    """Write `data` to a child's stdin and close it (run in a thread; also the mux transport's)."""
    try:
        pipe.write(data)
    except BrokenPipeError:
        pass  # the command exited without reading all of it: its exit status says the rest
    finally:
        try:
            pipe.close()
        except BrokenPipeError:
            pass


def _kill_group(proc: "subprocess.Popen[bytes]") -> None:
    """SIGTERM the command's process group, then SIGKILL whatever is left after a grace period."""
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            # The shell is gone; members of its group may still be alive (they ignored TERM).
            os.killpg(proc.pid, 0)
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            break
    for stream in (proc.stdout, proc.stderr, proc.stdin):
        if stream is not None:
            stream.close()


def _short(command: str) -> str:
    return command if len(command) <= 120 else command[:117] + "..."
