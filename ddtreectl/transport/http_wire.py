"""A minimal HTTP/1.1 GET over any byte stream (a local socket or an SSH direct-tcpip channel).

Health checks need one small request to 127.0.0.1 *as seen from the host*. Over SSH there is no
socket to hand to urllib, so both transports use this one implementation: the same request bytes
and the same parser, hence the same behaviour locally and remotely. `Connection: close` lets the
body end at EOF; Content-Length and chunked bodies are honoured too.
"""

from __future__ import annotations

import socket
import time
from typing import Protocol

from ddtreectl.errors import RemoteCommandError
from ddtreectl.transport.base import HttpResponse

MAX_RESPONSE_BYTES = 16 * 1024 * 1024  # health/metrics answers are small; bound a runaway stream


class Stream(Protocol):
    """What a socket and a Paramiko channel have in common for this exchange."""

    def sendall(self, data: bytes) -> object: ...

    def settimeout(self, timeout: float | None) -> object: ...

    def recv(self, size: int) -> bytes: ...


def exchange(stream: Stream, port: int, path: str, *, timeout: float, host: str) -> HttpResponse:
    """Send one GET on an open stream and read the answer until it is complete, EOF or the deadline.

    OSError while reading (a reset) is a RemoteCommandError, like a timeout: the caller decides
    whether to retry. The caller owns and closes the stream.
    """
    what = f"GET http://127.0.0.1:{port}{path} on {host}"
    deadline = time.monotonic() + timeout
    raw = bytearray()
    stream.sendall(build_request(port, path))
    while not response_complete(bytes(raw)):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RemoteCommandError(f"{what}: no complete answer within {timeout:g} s", host=host)
        stream.settimeout(remaining)
        try:
            data = stream.recv(65536)
        except socket.timeout:
            continue
        except OSError as exc:
            raise RemoteCommandError(f"{what}: {exc}", host=host) from None
        if not data:
            break
        raw += data
        if len(raw) > MAX_RESPONSE_BYTES:
            raise RemoteCommandError(f"{what}: answer larger than 16 MiB", host=host)
    return parse_response(bytes(raw), what=what)


def build_request(port: int, path: str) -> bytes:
    if not path.startswith("/") or any(c in path for c in "\r\n "):
        raise ValueError(f"HTTP path must start with '/' and contain no spaces/newlines: {path!r}")
    return (
        f"GET {path} HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "User-Agent: ddtreectl\r\n"
        "Accept: */*\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii")


def response_complete(raw: bytes) -> bool:
    """Whether `raw` already holds a whole response (so we need not wait for EOF)."""
    head_end = raw.find(b"\r\n\r\n")
    if head_end < 0:
        return False
    headers = _parse_headers(raw[:head_end])
    body = raw[head_end + 4 :]
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return body.endswith(b"0\r\n\r\n")
    length = headers.get("content-length")
    return length is not None and length.isdigit() and len(body) >= int(length)


def parse_response(raw: bytes, *, what: str) -> HttpResponse:
    """Parse a complete response; RemoteCommandError naming `what` if it is not HTTP."""
    head_end = raw.find(b"\r\n\r\n")
    if head_end < 0:
        raise RemoteCommandError(f"{what}: no complete HTTP header in {len(raw)} bytes of answer")
    status_line, _, _ = raw[:head_end].partition(b"\r\n")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise RemoteCommandError(f"{what}: not an HTTP response: {status_line[:80]!r}")
    headers = _parse_headers(raw[:head_end])
    body = raw[head_end + 4 :]
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(body, what=what)
    elif (length := headers.get("content-length", "")).isdigit():
        body = body[: int(length)]
    return HttpResponse(status=int(parts[1]), body=body, headers=headers)


def _parse_headers(head: bytes) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().decode("latin-1").lower()] = value.strip().decode("latin-1")
    return headers


def _dechunk(body: bytes, *, what: str) -> bytes:
    out = bytearray()
    pos = 0
    while True:
        line_end = body.find(b"\r\n", pos)
        if line_end < 0:
            raise RemoteCommandError(f"{what}: truncated chunked body")
        size_text = body[pos:line_end].split(b";")[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise RemoteCommandError(f"{what}: bad chunk size {size_text[:20]!r}") from None
        if size == 0:
            return bytes(out)
        start = line_end + 2
        out += body[start : start + size]
        pos = start + size + 2
