"""Showing GPU verdicts: a table per host (who uses each GPU), or `ddtreectl.gpus/1` JSON."""

from __future__ import annotations

from typing import Any, Sequence

from rich.markup import escape
from rich.table import Table

from ddtreectl.operations.gpus import GpuCheck
from ddtreectl.probes.gpu_verdict import GpuProcess, HostVerdict
from ddtreectl.ui import console
from ddtreectl.ui.json_doc import error_json

SCHEMA = "ddtreectl.gpus/1"
_STYLE = {"idle": "green", "busy": "bold red", "unknown": "magenta"}


def process_json(p: GpuProcess) -> dict[str, Any]:
    return {"pid": p.pid, "gpu_uuid": p.gpu_uuid, "user": p.user if p.visible else None,
            "command": p.command if p.visible else None, "process_name": p.process_name,
            "used_memory_mib": p.used_memory_mib, "visible": p.visible, "service": p.is_service}


def verdict_json(v: HostVerdict) -> dict[str, Any]:
    return {
        "verdict": v.verdict, "signals": list(v.signals), "reasons": list(v.reasons),
        "samples": v.samples, "interval_s": v.interval_s, "nvidia_smi_ms": v.nvidia_smi_ms,
        "nvidia_smi_missing": v.nvidia_smi_missing, "no_gpus": v.no_gpus,
        "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name, "verdict": g.verdict,
                  "signals": list(g.signals), "unknowns": list(g.unknowns),
                  "memory_used_mib": g.memory_used_mib, "memory_total_mib": g.memory_total_mib,
                  "utilization_pct": list(g.utilization_pct), "persistence_mode": g.persistence_mode,
                  "processes": [process_json(p) for p in g.processes]} for g in v.gpus],
        "processes": [process_json(p) for p in v.processes],
    }


# An answered host's fields beyond name/host/ok/verdict/error (verdict_json's and the wait's).
_ANSWERED = ("signals", "reasons", "samples", "interval_s", "nvidia_smi_ms", "nvidia_smi_missing", "no_gpus",
             "gpus", "processes", "waited_s", "rounds")


def gpus_json(targets: Sequence[str], checks: Sequence[GpuCheck], errors: Sequence[tuple[str, BaseException]],
              exit_code: int) -> dict[str, Any]:
    """`ddtreectl.gpus/1`: every targeted host in target order; `ok` is an idle verdict."""
    entries: dict[str, dict[str, Any]] = {
        c.host: {"name": c.host, "host": c.host, "ok": c.verdict.idle, **verdict_json(c.verdict),
                 "waited_s": round(c.waited_s, 3), "rounds": c.rounds, "error": None} for c in checks}
    for name, err in errors:
        # The same keys as an answered host (README "JSON output"): what only the host could say is null.
        entries[name] = {"name": name, "host": name, "ok": False, "verdict": "unknown",
                         **dict.fromkeys(_ANSWERED), "error": error_json(err)}
    return {"schema": SCHEMA, "exit_code": exit_code, "ok": exit_code == 0, "error": None,
            "hosts": [entries[n] for n in [*targets, *(n for n in entries if n not in targets)] if n in entries]}


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value} MiB"


def sampled(v: HostVerdict) -> str:
    """How the verdict was sampled. Without nvidia-smi the sampler stops at its first query (more
    samples cannot install it), so the line says that rather than "1 sample(s)" whatever --samples said."""
    if v.no_gpus:
        found = "nvidia-smi is not installed" if v.nvidia_smi_missing else "nvidia-smi found no devices"
        return f"no GPUs, as the inventory says (gpus: 0; {found})"
    if v.nvidia_smi_missing:
        return "not sampled: nvidia-smi is not installed"
    return f"{v.samples} sample{'' if v.samples == 1 else 's'}" + (
        f", {v.interval_s:g} s apart" if v.samples > 1 else "")


def show_check(check: GpuCheck) -> None:
    out = console.stdout()
    v = check.verdict
    waited = f" after waiting {check.waited_s:.0f} s" if check.rounds > 1 else ""
    signals = f" ({', '.join(v.signals)})" if v.signals else ""
    out.print(f"[bold]{escape(check.host)}[/bold]: [{_STYLE[v.verdict]}]{v.verdict.upper()}{signals}"
              f"[/{_STYLE[v.verdict]}]{waited} — {escape(sampled(v))}")
    if v.gpus:
        # One model on every GPU (the usual host) is named once above the table: a name column of
        # "NVIDIA RTX PRO 6000 Blackwell Server Edition" on every row left the processes column, at
        # 80 columns, so narrow that each command was cut ("sglang::sched…").
        names = {g.name for g in v.gpus}
        if len(names) == 1:
            out.print(f"  {len(v.gpus)} × {escape(v.gpus[0].name)}")
        columns = ("GPU", "memory", "util %", "verdict", "processes") if len(names) == 1 else (
            "GPU", "name", "memory", "util %", "verdict", "processes")
        table = Table(header_style="bold", pad_edge=False, show_edge=False)
        for column in columns:
            table.add_column(column, no_wrap=column in ("GPU", "memory", "util %", "verdict"))
        for g in v.gpus:
            util = "/".join("?" if u is None else str(u) for u in g.utilization_pct)
            procs = "\n".join(escape(p.describe()) for p in g.processes) or "-"
            table.add_row(str(g.index if g.index is not None else "?"), *([] if len(names) == 1 else [escape(g.name)]),
                          f"{_mib(g.memory_used_mib)} / {_mib(g.memory_total_mib)}", util,
                          f"[{_STYLE[g.verdict]}]{g.verdict}[/{_STYLE[g.verdict]}]", procs)
        out.print(table)
    for reason in v.reasons:
        out.print(f"  [yellow]{escape(reason)}[/yellow]")
