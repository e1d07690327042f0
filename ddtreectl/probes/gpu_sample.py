"""The GPU sampler probe: ONE shell script per host (scripts/gpus.sh) samples nvidia-smi several
times, names every process it saw (user, command, cgroup) and reads the serving/dev unit states.

`parse_gpu_samples` is pure (tested on fixtures); `sample_gpus` is the one round trip.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ddtreectl.errors import RemoteCommandError
from ddtreectl.probes.facts import GpuState
from ddtreectl.probes.gpu_holders import HOLDERS_SCRIPT
from ddtreectl.probes.gpu_holders import GpuHolder, parse_holders
from ddtreectl.probes.parse import Section, gpu_state, split_sections
from ddtreectl.probes.status import load_script
from ddtreectl.transport.base import Transport

DEFAULT_SAMPLES = 3
DEFAULT_INTERVAL_S = 1.0
DEFAULT_GPU_TIMEOUT_S = 10


@dataclass(frozen=True)
class UnitStates:
    """The serving unit's `systemctl is-active` word and the active ddtree-dev-* units.

    `known` is False where systemd could not be asked (no systemctl, not booted with systemd)."""

    known: bool
    serving: str | None = None  # None: the host runs no service profile
    dev_units: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuSamples:
    """What one run of the sampler saw on a host."""

    samples: tuple[GpuState, ...]
    holders: tuple[GpuHolder, ...]
    units: UnitStates
    interval_s: float


def gpus_command(samples: int, interval_s: float, gpu_timeout_s: int, unit: str | None) -> str:
    """`sh -c SCRIPT ddtree-gpus SAMPLES INTERVAL TIMEOUT UNIT`, every part quoted."""
    script = load_script("gpus.sh").replace("@@HOLDERS_FUNCTION@@", HOLDERS_SCRIPT.strip("\n"))
    parts = ["sh", "-c", script, "ddtree-gpus", str(max(1, samples)), f"{max(0.0, interval_s):g}",
             str(max(1, int(gpu_timeout_s))), unit or ""]
    return " ".join(shlex.quote(p) for p in parts)


def parse_units(section: Section | None, unit: str | None) -> UnitStates:
    if section is None or section.missing or section.rc != 0:
        return UnitStates(known=False, serving=None)
    serving: str | None = None
    dev: list[str] = []
    for line in section.body.splitlines():
        tag, _, value = line.strip().partition(" ")
        if tag == "serving":
            serving = value.strip() or "unknown"
        elif tag == "dev" and value.strip():
            dev.append(value.strip())
    if unit and serving is None:
        serving = "unknown"
    return UnitStates(known=True, serving=serving if unit else None, dev_units=tuple(dev))


def parse_gpu_samples(text: str, *, unit: str | None, interval_s: float = DEFAULT_INTERVAL_S) -> GpuSamples:
    """GpuSamples from the sampler's output. Raises ValueError when it holds no sample at all."""
    gpus: dict[str, Section] = {}
    apps: dict[str, Section] = {}
    other: dict[str, Section] = {}
    for section in split_sections(text):
        if section.name == "gpus":
            gpus[section.arg] = section
        elif section.name == "apps":
            apps[section.arg] = section
        else:
            other.setdefault(section.name, section)
    if not gpus:
        raise ValueError("no @@ddtree-begin gpus section in the sampler output")
    samples = tuple(gpu_state(gpus[key], apps.get(key)) for key in sorted(gpus, key=_index))
    holders_section = other.get("holders")
    holders = tuple(parse_holders(holders_section.body)) if holders_section else ()
    return GpuSamples(samples=samples, holders=holders, units=parse_units(other.get("units"), unit),
                      interval_s=interval_s)


def _index(key: str) -> int:
    return int(key) if key.isdigit() else 0


def sample_gpus(transport: Transport, *, unit: str | None, samples: int = DEFAULT_SAMPLES,
                interval_s: float = DEFAULT_INTERVAL_S,
                gpu_timeout_s: int = DEFAULT_GPU_TIMEOUT_S) -> GpuSamples:
    """Run the sampler on an open transport (one round trip) and parse it."""
    command = gpus_command(samples, interval_s, gpu_timeout_s, unit)
    bound = samples * (interval_s + 2 * gpu_timeout_s + 4) + 30
    result = transport.run(command, timeout=bound)
    try:
        return parse_gpu_samples(result.stdout, unit=unit, interval_s=interval_s)
    except ValueError:
        said = (result.stderr or result.stdout).strip().splitlines()
        raise RemoteCommandError(
            f"GPU sampler failed (exit {result.exit_code}): {said[-1] if said else 'no output'}",
            hint="check that /bin/sh works for the SSH user (`ssh HOST sh -c true`)",
            host=transport.host_name,
        ) from None
