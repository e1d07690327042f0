"""The idle-GPU verdict: a pure function over parsed samples (tested on fixtures of nvidia-smi output).

Idle means ALL of (shared/ops-notes.md, "GPUs"): no compute process on any GPU, memory.used at or
below max(512 MiB, 1% of the total) on every GPU, utilization 0 in every sample, and neither the
serving unit nor a ddtree-dev-* unit active. A signal that could not be read makes the verdict
"unknown", never "idle": `[N/A]` fields, nvidia-smi missing, failing or too slow, fewer GPUs than the
inventory expects, a process whose owner we cannot see. A signal that fires makes it "busy".
A host the inventory declares GPU-less (`gpus: 0`) needs no nvidia-smi: when it has none (or it finds
no devices) the verdict rests on the units alone, `no_gpus` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ddtreectl.probes.facts import GpuInfo
from ddtreectl.probes.gpu_holders import GpuHolder
from ddtreectl.probes.gpu_sample import GpuSamples

Verdict = Literal["idle", "busy", "unknown"]
Signal = Literal["processes", "memory", "utilization", "unit"]
MEMORY_FLOOR_MIB = 512


def memory_threshold_mib(total_mib: int) -> int:
    """Memory a GPU may show used and still count as idle (driver and context leftovers)."""
    return max(MEMORY_FLOOR_MIB, total_mib // 100)


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU, with who runs it."""

    pid: int | None
    gpu_uuid: str
    process_name: str
    used_memory_mib: int | None
    user: str  # "?" when not visible from the host's PID namespace
    command: str
    visible: bool
    is_service: bool  # runs inside the host's serving unit (its cgroup)

    def describe(self) -> str:
        who = "the service" if self.is_service else (self.user if self.visible else "owner not visible")
        memory = f", {self.used_memory_mib} MiB" if self.used_memory_mib is not None else ""
        return f"pid {self.pid if self.pid is not None else '?'} ({who}{memory}): " \
               f"{(self.command or self.process_name).strip() or '?'}"


@dataclass(frozen=True)
class GpuReport:
    """One GPU over the sampling window."""

    index: int | None
    uuid: str
    name: str
    memory_used_mib: int | None  # the highest reading over the samples (None: some read [N/A])
    memory_total_mib: int | None
    utilization_pct: tuple[int | None, ...]  # one per sample
    persistence_mode: bool | None
    processes: tuple[GpuProcess, ...]
    verdict: Verdict
    signals: tuple[Signal, ...]  # which busy signals fired
    unknowns: tuple[str, ...]  # which signals could not be read, in words


@dataclass(frozen=True)
class HostVerdict:
    """The host's verdict and why."""

    verdict: Verdict
    reasons: tuple[str, ...]  # one sentence per signal that fired or could not be read
    signals: tuple[Signal, ...]
    gpus: tuple[GpuReport, ...]
    processes: tuple[GpuProcess, ...]
    samples: int  # nvidia-smi readings taken (0 when it is not installed)
    interval_s: float
    nvidia_smi_ms: int | None  # slowest nvidia-smi query of the window
    # Unknown in a way sampling again cannot change (nvidia-smi is not installed, or it lists another GPU
    # count than the inventory declares and nothing else is unknown): waiting is pointless.
    settled: bool = False
    # nvidia-smi was not found in any sample, whatever else made the verdict (an active unit is busy).
    nvidia_smi_missing: bool = False
    # The inventory declares no GPUs (`gpus: 0`) and the host has none to read (no nvidia-smi, or it
    # found no devices): there is nothing to sample, which is the expected state, not an unknown one.
    no_gpus: bool = False
    # nvidia-smi listed another GPU count than the inventory declares ("" when it matched or was not read):
    # unknown whatever the units do, so `mode dev` refuses it before it stops production.
    miscount: str = ""

    @property
    def idle(self) -> bool:
        return self.verdict == "idle"

    def foreign_processes(self) -> tuple[GpuProcess, ...]:
        """Processes on the GPUs that are not the serving unit's (development work, strays)."""
        return tuple(p for p in self.processes if not p.is_service)


def _processes(samples: GpuSamples, unit: str | None) -> tuple[GpuProcess, ...]:
    by_pid: dict[int, GpuHolder] = {h.pid: h for h in samples.holders}
    seen: dict[tuple[int | None, str], GpuProcess] = {}
    for state in samples.samples:
        for app in state.apps:
            holder = by_pid.get(app.pid) if app.pid is not None else None
            visible = holder is not None and holder.visible
            proc = GpuProcess(
                pid=app.pid, gpu_uuid=app.gpu_uuid, process_name=app.process_name,
                used_memory_mib=app.used_memory_mib,
                user=holder.user if holder is not None and visible else "?",
                command=holder.command if holder is not None and visible else app.process_name,
                visible=visible, is_service=bool(holder is not None and holder.belongs_to(unit)))
            seen.setdefault((app.pid, app.gpu_uuid), proc)
    return tuple(seen.values())


def _gpu_report(uuid: str, readings: list[GpuInfo], processes: tuple[GpuProcess, ...],
                sampled: int) -> GpuReport:
    first = readings[0]
    signals: list[Signal] = []
    unknowns: list[str] = []
    mine = tuple(p for p in processes if p.gpu_uuid == uuid)
    if mine:
        signals.append("processes")
        hidden = [p for p in mine if not p.visible]
        if hidden:
            unknowns.append(f"{len(hidden)} process(es) not visible from the host's PID namespace")
    used = [g.memory_used_mib for g in readings]
    total = first.memory_total_mib
    peak = None if any(u is None for u in used) else max(u for u in used if u is not None)
    if peak is None or total is None:
        unknowns.append("memory.used/total read [N/A]")
    elif peak > memory_threshold_mib(total):
        signals.append("memory")
    utils = tuple(g.utilization_pct for g in readings)
    if any(u is not None and u > 0 for u in utils):
        signals.append("utilization")
    elif any(u is None for u in utils):
        unknowns.append("utilization.gpu read [N/A]")
    if len(readings) < sampled:
        unknowns.append(f"present in {len(readings)} of {sampled} samples")
    verdict: Verdict = "busy" if signals else ("unknown" if unknowns else "idle")
    return GpuReport(index=first.index, uuid=uuid, name=first.name, memory_used_mib=peak,
                     memory_total_mib=total, utilization_pct=utils,
                     persistence_mode=first.persistence_mode, processes=mine, verdict=verdict,
                     signals=tuple(signals), unknowns=tuple(unknowns))


def gpu_verdict(samples: GpuSamples, *, unit: str | None, expected_gpus: int) -> HostVerdict:
    """Decide idle / busy / unknown for one host from its samples (pure)."""
    reasons: list[str] = []
    signals: list[Signal] = []
    unknown = False
    states = samples.samples
    # A missing nvidia-smi reads "ms=0": no query ran, so no time (None), not 0 ms.
    slowest = max((s.duration_ms for s in states if s.duration_ms is not None and s.status != "missing"),
                  default=None)
    failed = [s for s in states if s.status != "ok"]
    # A host declared GPU-less needs no nvidia-smi: "not installed" / "no devices" is what it should
    # say. A host that declares GPUs and cannot read them stays unknown below (never idle).
    no_gpus = expected_gpus == 0 and bool(states) and all(s.status in ("missing", "no-devices") for s in states)
    if failed and not no_gpus:
        unknown = True
        first = failed[0]
        words = {"missing": "nvidia-smi is not installed",
                 "timeout": "nvidia-smi did not answer in time",
                 "no-devices": "nvidia-smi found no devices",
                 "not-run": "nvidia-smi was not run"}.get(first.status, "nvidia-smi failed")
        detail = f": {first.detail}" if first.detail and first.status not in ("missing",) else ""
        # Without nvidia-smi nothing was sampled (`samples: 0`): a count of "1 of 1 samples" said
        # the opposite of the JSON and of the header line ("not sampled").
        count = "" if first.status == "missing" else f" ({len(failed)} of {len(states)} samples)"
        reasons.append(f"GPU state unknown: {words}{detail}{count}")
    ok_states = [s for s in states if s.status == "ok"]
    if any(not s.apps_known for s in ok_states):
        unknown = True
        reasons.append("GPU state unknown: the compute-apps query failed")
    processes = _processes(samples, unit)
    readings: dict[str, list[GpuInfo]] = {}
    for state in ok_states:
        for gpu in state.gpus:
            readings.setdefault(gpu.uuid, []).append(gpu)
    reports = tuple(_gpu_report(uuid, found, processes, len(ok_states)) for uuid, found in readings.items())
    counts = {len(s.gpus) for s in ok_states}
    # `gpus: 0` is a count too: a host declared GPU-less whose nvidia-smi lists GPUs is misdeclared (the
    # inventory or the machine is not what it says), the same doubt as a missing GPU (status flags both).
    miscount = ""
    if ok_states and counts != {expected_gpus}:
        unknown = True
        miscount = f"expected {expected_gpus} GPUs, nvidia-smi listed " + " / ".join(str(c) for c in sorted(counts))
        reasons.append(miscount)
    for report in reports:
        label = f"GPU {report.index if report.index is not None else report.uuid}"
        for signal in report.signals:
            if signal not in signals:
                signals.append(signal)
        if "processes" in report.signals:
            reasons.append(f"{label}: " + "; ".join(p.describe() for p in report.processes))
        if "memory" in report.signals:
            reasons.append(f"{label}: {report.memory_used_mib} MiB of {report.memory_total_mib} MiB used "
                           f"(idle allows {memory_threshold_mib(report.memory_total_mib or 0)})")
        if "utilization" in report.signals:
            reasons.append(f"{label}: utilization "
                           + "/".join("?" if u is None else str(u) for u in report.utilization_pct) + " %")
        if report.unknowns:
            if not report.signals:
                unknown = True
            reasons.append(f"{label}: unknown: " + "; ".join(report.unknowns))
    units = samples.units
    if unit:
        if not units.known:
            unknown = True
            reasons.append(f"{unit}: state unknown (systemd could not be asked)")
        elif units.serving in ("active", "activating", "reloading", "deactivating"):
            signals.append("unit")
            reasons.append(f"{unit} is {units.serving}")
    if units.dev_units:
        if "unit" not in signals:
            signals.append("unit")
        reasons.append("development unit(s) active: " + ", ".join(units.dev_units))
    verdict: Verdict = "busy" if signals else ("unknown" if unknown else "idle")
    missing = bool(states) and all(s.status == "missing" for s in states)
    return HostVerdict(verdict=verdict, reasons=tuple(reasons), signals=tuple(signals), gpus=reports,
                       # Without nvidia-smi the sampler stops at its first query: no reading was taken.
                       processes=processes, samples=0 if missing else len(states), interval_s=samples.interval_s,
                       # Sampling again cannot install nvidia-smi, nor make the GPU count match the
                       # inventory's (a GPU off the bus needs a reboot; a wrong `gpus:` an edit).
                       nvidia_smi_ms=slowest, settled=verdict == "unknown" and (missing or reasons == [miscount]),
                       nvidia_smi_missing=missing, miscount=miscount,
                       no_gpus=no_gpus)
