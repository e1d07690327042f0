"""`journalctl -o json` lines -> JournalEntry (real output shapes: tests/e2e/test_logs_run_json.py
reads a real journal, including a message that is not UTF-8)."""

from __future__ import annotations

import json

from ddtreectl.probes.journal import parse_journal_json


def test_fields_bytes_and_junk() -> None:
    lines = [
        json.dumps({"__REALTIME_TIMESTAMP": "1795996800123456", "PRIORITY": "3", "SYSLOG_IDENTIFIER": "python3",
                    "_PID": "4242", "MESSAGE": "Traceback (most recent call last):"}),
        json.dumps({"__REALTIME_TIMESTAMP": "1795996800200000", "MESSAGE": [98, 97, 100, 32, 255]}),
        json.dumps({"__REALTIME_TIMESTAMP": "1795996800300000", "MESSAGE": None}),  # a blob over the size limit
        "[1, 2]", "not json", '{"__REALTIME_TIMESTAMP": "17959968',  # a cut-off last line
    ]
    first, second, third = parse_journal_json("\n".join(lines) + "\n")
    assert first.to_json() == {"time": "2026-11-30T00:00:00.123456Z", "unix_us": 1795996800123456, "priority": 3,
                               "identifier": "python3", "pid": 4242, "message": "Traceback (most recent call last):"}
    assert (second.message, second.priority, second.pid, second.identifier) == ("bad \ufffd", None, None, None)
    assert third.message == "" and third.time == "2026-11-30T00:00:00.300000Z"
    assert parse_journal_json("") == []
