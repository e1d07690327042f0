"""Who holds a host's GPUs: for each compute process nvidia-smi lists, its user, command line and
whether it belongs to the host's service unit (its cgroup), in one round trip.

A PID that nvidia-smi shows but /proc does not (another PID namespace) stays "unknown", never
"the service's" and never "nobody's".
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ddtreectl.transport.base import Transport

HOLDERS_SCRIPT = r"""
for pid in "$@"; do
  if [ -r "/proc/$pid/cgroup" ]; then
    cg=$(tr '\n' ' ' < "/proc/$pid/cgroup")
    user=$(stat -c %U "/proc/$pid" 2>/dev/null || echo '?')
    cmd=$(tr '\0\n\t' '   ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-300)  # one line: `python -c` scripts hold newlines
    printf 'PID\t%s\t%s\t%s\t%s\n' "$pid" "$user" "$cg" "$cmd"
  else
    printf 'PID\t%s\t?\t?\t?\n' "$pid"
  fi
done
"""


@dataclass(frozen=True)
class GpuHolder:
    pid: int
    user: str  # "?" when the process is not visible
    cgroup: str
    command: str
    visible: bool

    def belongs_to(self, unit: str | None) -> bool:
        """Whether the process runs inside the given systemd unit's cgroup."""
        return bool(unit) and self.visible and f"/{unit}" in self.cgroup

    def describe(self) -> str:
        if not self.visible:
            return f"pid {self.pid} (not visible from the host's PID namespace)"
        return f"pid {self.pid} ({self.user}): {self.command.strip() or '?'}"


def parse_holders(output: str) -> list[GpuHolder]:
    holders = []
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) == 5 and parts[0] == "PID" and parts[1].isdigit():
            visible = parts[2] != "?" or parts[3] != "?"
            holders.append(GpuHolder(int(parts[1]), parts[2], parts[3].strip(), parts[4], visible))
    return holders


def gpu_holders(transport: Transport, pids: list[int]) -> list[GpuHolder]:
    """Describe the given PIDs on the host (one round trip; no-op for an empty list)."""
    if not pids:
        return []
    args = " ".join(shlex.quote(str(p)) for p in sorted(set(pids)))
    result = transport.run(f"sh -c {shlex.quote(HOLDERS_SCRIPT)} ddtree-holders {args}", timeout=15)
    return parse_holders(result.stdout)
