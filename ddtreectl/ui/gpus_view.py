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


def _memory(used: int | None, total: int | None) -> str:
    """"87.1/95.6 GiB": one unit said once leaves the processes column room for a whole command."""
    if used is not None and total is not None and used >= 1024 and total >= 1024:
        return f"{used / 1024:.1f}/{total / 1024:.1f} GiB"
    return f"{_mib(used)} / {_mib(total)}"


def _process(p: GpuProcess) -> str:
    """"41873 (?) sglang::scheduler_TP0": pid, owner (the service; a user; ? not visible) and command on one
    line at 80 columns. The memory is the GPU's (its column); --json has each process's."""
    who = "service" if p.is_service else (p.user if p.visible and p.user else "?")
    return f"{p.pid if p.pid is not None else '?'} ({who}) {(p.command or p.process_name).strip() or '?'}"


def _gpu_list(labels: Sequence[str]) -> str:
    """"GPUs 0-7", "GPU 3", "GPUs 0, 2, 5": runs of consecutive indexes collapsed."""
    if len(labels) == 1:
        return f"GPU {labels[0]}"
    if all(label.isdigit() for label in labels):
        numbers = sorted(int(label) for label in labels)
        runs: list[list[int]] = []
        for n in numbers:
            if runs and n == runs[-1][-1] + 1:
                runs[-1].append(n)
            else:
                runs.append([n])
        labels = [f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs]
    return "GPUs " + ", ".join(labels)


def _notes(v: HostVerdict) -> list[str]:
    """The reasons the table does not already show. Each GPU's processes, memory and utilization are
    its row; listing them again below (4 lines per busy GPU: 32 on an 8-GPU server) buried the host-level
    reasons. What a GPU could not read is said once for all the GPUs it concerns."""
    # Built from the report's fields, not by parsing the reason texts, except to leave out those
    # (gpu_verdict labels every per-GPU reason "GPU <index or uuid>: ").
    labels = [str(g.index if g.index is not None else g.uuid) for g in v.gpus]
    # A row with processes explains its GPU; one busy by memory alone keeps its line (used vs allowed).
    explained = tuple(f"GPU {label}: " for label, g in zip(labels, v.gpus) if g.processes)
    unread = tuple(f"GPU {label}: unknown: " for label in labels)
    notes = [r for r in v.reasons if not r.startswith(explained + unread)]
    texts: dict[str, list[str]] = {}
    for label, g in zip(labels, v.gpus):
        for text in g.unknowns:
            texts.setdefault(text, []).append(label)
    return notes + [f"{_gpu_list(gpus)}: unknown: {text}" for text, gpus in texts.items()]


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
            procs = "\n".join(escape(_process(p)) for p in g.processes) or "-"
            table.add_row(str(g.index if g.index is not None else "?"), *([] if len(names) == 1 else [escape(g.name)]),
                          _memory(g.memory_used_mib, g.memory_total_mib), util,
                          f"[{_STYLE[g.verdict]}]{g.verdict}[/{_STYLE[g.verdict]}]", procs)
        out.print(table)
    for reason in _notes(v) if v.gpus else v.reasons:
        out.print(f"  [yellow]{escape(reason)}[/yellow]")
