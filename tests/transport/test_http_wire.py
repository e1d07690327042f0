"""The minimal HTTP/1.1 reader shared by the local and SSH transports."""

from __future__ import annotations

import pytest

from ddtreectl.errors import RemoteCommandError
from ddtreectl.transport import http_wire


def test_request_is_http11_with_connection_close() -> None:
    req = http_wire.build_request(30000, "/health?x=1")
    assert req.startswith(b"GET /health?x=1 HTTP/1.1\r\nHost: 127.0.0.1:30000\r\n")
    assert b"Connection: close\r\n" in req and req.endswith(b"\r\n\r\n")


@pytest.mark.parametrize("path", ["health", "/a b", "/x\r\nEvil: 1"])
def test_bad_paths_rejected(path: str) -> None:
    with pytest.raises(ValueError):
        http_wire.build_request(80, path)


def test_content_length_body() -> None:
    raw = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello"
    assert http_wire.response_complete(raw)
    assert not http_wire.response_complete(raw[:-1])
    resp = http_wire.parse_response(raw, what="t")
    assert (resp.status, resp.body, resp.headers["x-a"]) == (503, b"hello", "b")


def test_chunked_body() -> None:
    raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"4\r\nWiki\r\n6;ext=1\r\npedia \r\n0\r\n\r\n")
    assert http_wire.response_complete(raw)
    assert http_wire.parse_response(raw, what="t").body == b"Wikipedia "


def test_body_until_eof_without_length() -> None:
    raw = b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nall of it"
    assert not http_wire.response_complete(raw)  # only EOF ends it
    assert http_wire.parse_response(raw, what="t").body == b"all of it"


@pytest.mark.parametrize("raw", [b"", b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 200 OK\r\n"])
def test_not_http_is_a_remote_error(raw: bytes) -> None:
    with pytest.raises(RemoteCommandError, match="t:"):
        http_wire.parse_response(raw, what="t")
