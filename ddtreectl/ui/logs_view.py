"""`logs --json`: the `ddtreectl.logs/1` document (README, "JSON output")."""

from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence

from ddtreectl.probes.journal import parse_journal_json
from ddtreectl.ui.json_doc import error_json

LOGS_SCHEMA = "ddtreectl.logs/1"


def logs_json(targets: Sequence[str], units: Mapping[str, str | None], journals: Mapping[str, tuple[str, str]],
              failures: Mapping[str, BaseException], exit_code: int,
              skipped: Collection[str] = ()) -> dict[str, Any]:
    """Every targeted host in order: its unit and entries, or its error (entries then null). A host
    skipped for having no service (reached through a group or `all`) is ok with no entries and says why."""
    hosts: list[dict[str, Any]] = []
    for name in targets:
        if name in skipped:
            hosts.append({"host": name, "ok": True, "unit": None, "error": None, "entries": [],
                          "skipped": "no service profile"})
            continue
        failure = failures.get(name)
        if failure is not None or name not in journals:
            hosts.append({"host": name, "ok": False, "unit": units.get(name), "entries": None,
                          "error": error_json(failure), "skipped": None})
            continue
        unit, text = journals[name]
        hosts.append({"host": name, "ok": True, "unit": unit, "error": None,
                      "entries": [e.to_json() for e in parse_journal_json(text)], "skipped": None})
    return {"schema": LOGS_SCHEMA, "exit_code": exit_code, "ok": exit_code == 0, "error": None, "hosts": hosts}
