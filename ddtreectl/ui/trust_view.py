"""Showing what `trust` recorded, and above all what it replaced (a key, a machine-id, GPUs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape

from ddtreectl.operations.trust import TrustOutcome, describe_gpu_change
from ddtreectl.ui import console, json_doc

SCHEMA = "ddtreectl.trust/1"


def trust_json(outcome: TrustOutcome, inventory: Path) -> dict[str, Any]:
    replaced_gpus = bool(outcome.gpus_removed or outcome.gpus_added)
    return {
        "schema": SCHEMA, "exit_code": 0, "ok": True, "error": None, "host": outcome.host,
        "inventory": str(inventory), "changed": outcome.changed,
        "key": {"type": outcome.key.key_type, "fingerprint": outcome.key.fingerprint},
        "machine_id": outcome.machine_id, "gpu_uuids": list(outcome.gpu_uuids),
        # What --replace overwrote: null when nothing of that kind was replaced.
        "replaced": {
            "key_fingerprint": outcome.key_replaced,
            "machine_id": outcome.machine_id_replaced,
            "gpu_uuids": {"removed": list(outcome.gpus_removed), "added": list(outcome.gpus_added)}
            if replaced_gpus else None,
        },
        "warnings": list(outcome.warnings),
    }


def show(outcome: TrustOutcome, inventory: Path, *, as_json: bool) -> None:
    if as_json:
        json_doc.emit(trust_json(outcome, inventory))
        return
    err, out, host = console.stderr(), console.stdout(), escape(outcome.host)
    for warning in outcome.warnings:
        err.print(f"[yellow]warning: {host}: {escape(warning)}[/yellow]")
    if outcome.machine_id_replaced:
        err.print(f"[yellow]{host}: REPLACED machine-id {escape(outcome.machine_id_replaced)} -> "
                  f"{escape(outcome.machine_id)}[/yellow]")
    if outcome.gpus_removed or outcome.gpus_added:
        err.print(f"[yellow]{host}: REPLACED GPU UUIDs: "
                  f"{escape(describe_gpu_change(outcome.gpus_removed, outcome.gpus_added))}[/yellow]")
    gpus = f"{len(outcome.gpu_uuids)} GPU UUID(s)" if outcome.gpu_uuids else "no GPUs"
    if outcome.changed:
        out.print(f"{host}: pinned {escape(outcome.key.describe())}, machine-id {escape(outcome.machine_id)}, "
                  f"{gpus} -> {escape(str(inventory))}", soft_wrap=True)
    else:
        out.print(f"{host}: already trusted ({escape(outcome.key.describe())}); inventory unchanged", soft_wrap=True)
