"""The idle-GPU verdict on fixtures of nvidia-smi output (fixtures/README.md says where each shape is
from), fed through the real sampler script with an `nvidia-smi` stand-in at the command boundary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ddtreectl.probes.gpu_holders import GpuHolder
from ddtreectl.probes.gpu_sample import GpuSamples, UnitStates, gpus_command, parse_gpu_samples
from ddtreectl.probes.gpu_verdict import HostVerdict, gpu_verdict, memory_threshold_mib
from ddtreectl.probes.parse import Section, gpu_state

from tests.probes.fixtures import FIXTURES, fixture

UNIT = "sglang-k26-ddtree.service"


def samples_of(gpus: list[str], apps: list[str], *, holders: tuple[GpuHolder, ...] = (),
               serving: str | None = None, dev_units: tuple[str, ...] = ()) -> GpuSamples:
    """GpuSamples for one fixture pair per sample (pure: no script involved)."""
    states = tuple(gpu_state(Section("gpus", str(i), fixture(g), 0, 25, False),
                             Section("apps", str(i), fixture(a) if a else "", 0, None, False))
                   for i, (g, a) in enumerate(zip(gpus, apps)))
    return GpuSamples(states, holders, UnitStates(True, serving, dev_units), 1.0)


def test_idle_h200_three_samples() -> None:
    s = samples_of(["nvidia-smi-gpus-h200-1x.txt"] * 3, [""] * 3)
    v = gpu_verdict(s, unit=None, expected_gpus=1)
    assert v.verdict == "idle" and v.reasons == () and v.signals == ()
    assert v.gpus[0].utilization_pct == (0, 0, 0) and v.gpus[0].memory_used_mib == 0


def test_captured_h200_idle_busy_idle() -> None:
    """Real nvidia-smi output of the H200: idle, then a PyTorch process holding ~17 GB and computing,
    then idle after it exited. Busy must name all three signals; idle must have none."""
    def verdict(phase: str, holders: tuple[GpuHolder, ...] = ()) -> HostVerdict:
        apps = f"nvidia-smi-apps-h200-captured-{phase}.txt"
        s = samples_of([f"nvidia-smi-gpus-h200-captured-{phase}.txt"] * 3, [apps] * 3, holders=holders)
        return gpu_verdict(s, unit=UNIT, expected_gpus=1)

    before, after = verdict("idle-before"), verdict("idle-after")
    assert before.verdict == "idle" and after.verdict == "idle"
    torch_proc = GpuHolder(1788, "root", "0::/", "python3 -c import torch ... ", True)
    busy = verdict("busy-torch", (torch_proc,))
    assert busy.verdict == "busy"
    assert set(busy.signals) == {"processes", "memory", "utilization"}
    assert [p.pid for p in busy.foreign_processes()] == [1788]


def test_idle_seven_gpus_is_unknown_when_eight_are_expected() -> None:
    s = samples_of(["nvidia-smi-gpus-rtxpro6000-7of8-idle-pm-off.txt"] * 2, [""] * 2)
    assert gpu_verdict(s, unit=None, expected_gpus=7).verdict == "idle"
    v = gpu_verdict(s, unit=None, expected_gpus=8)
    assert v.verdict == "unknown" and v.reasons == ("expected 8 GPUs, nvidia-smi listed 7",) and v.settled


def test_gpus_found_on_a_host_declared_gpu_less_are_unknown() -> None:
    """`gpus: 0` is a count like any other: idle GPUs on a host the inventory says has none read
    "idle" (status flagged the host, gpus did not); the inventory or the machine is not what it says."""
    s = samples_of(["nvidia-smi-gpus-rtxpro6000-7of8-idle-pm-off.txt"] * 2, [""] * 2)
    v = gpu_verdict(s, unit=None, expected_gpus=0)
    assert (v.verdict, v.reasons, v.no_gpus) == ("unknown", ("expected 0 GPUs, nvidia-smi listed 7",), False)
    assert v.settled  # sampling again cannot change the count: --wait-idle and mode dev do not wait for it


def test_busy_by_processes_only() -> None:
    holder = GpuHolder(30211, "alice", "0::/user.slice/user-1000.slice/session-4.scope",
                       "python3 bench.py --budget 64 ", True)
    s = samples_of(["nvidia-smi-gpus-h200-1x-context-only.txt"] * 3,
                   ["nvidia-smi-apps-h200-1x-context-only.txt"] * 3, holders=(holder,))
    v = gpu_verdict(s, unit=UNIT, expected_gpus=1)
    # 523 MiB is under the 1% threshold of an H200 and no kernel ran: only the process says busy.
    assert memory_threshold_mib(143771) == 1437
    assert v.verdict == "busy" and v.signals == ("processes",)
    assert v.reasons == ("GPU 0: pid 30211 (alice, 514 MiB): python3 bench.py --budget 64",)
    assert [p.pid for p in v.foreign_processes()] == [30211]


def test_the_service_own_processes_are_named_as_such() -> None:
    holders = tuple(GpuHolder(41873 + i, "root", f"0::/system.slice/{UNIT}", f"sglang::scheduler_TP{i}", True)
                    for i in range(8))
    s = samples_of(["nvidia-smi-gpus-rtxpro6000-8x-serving.txt"],
                   ["nvidia-smi-apps-rtxpro6000-8x-serving.txt"], holders=holders, serving="active")
    v = gpu_verdict(s, unit=UNIT, expected_gpus=8)
    assert v.verdict == "busy" and set(v.signals) == {"processes", "memory", "utilization", "unit"}
    assert all(p.is_service for p in v.processes) and v.foreign_processes() == ()
    assert "GPU 0: pid 41873 (the service, 89196 MiB): sglang::scheduler_TP0" in v.reasons
    assert f"{UNIT} is active" in v.reasons


def test_busy_by_memory_only() -> None:
    s = samples_of(["nvidia-smi-gpus-h200-1x-memory-no-process.txt"] * 3, [""] * 3)
    v = gpu_verdict(s, unit=None, expected_gpus=1)
    assert v.verdict == "busy" and v.signals == ("memory",)
    assert v.reasons == ("GPU 0: 20993 MiB of 143771 MiB used (idle allows 1437)",)


def test_na_memory_is_unknown_never_idle() -> None:
    s = samples_of(["nvidia-smi-gpus-na-fields.txt"] * 2, [""] * 2)
    v = gpu_verdict(s, unit=None, expected_gpus=3)
    by_index = {g.index: g for g in v.gpus}
    # GB10: memory [N/A] but utilization 3 % -> busy; H100: utilization [N/A] -> unknown; A10G idle.
    assert by_index[0].verdict == "busy" and by_index[0].signals == ("utilization",)
    assert by_index[0].unknowns == ("memory.used/total read [N/A]",)
    assert by_index[1].verdict == "unknown" and by_index[1].unknowns == ("utilization.gpu read [N/A]",)
    assert by_index[2].verdict == "idle"
    assert v.verdict == "busy"
    only_h100 = samples_of(["nvidia-smi-gpus-na-fields.txt"], [""])
    h100 = GpuSamples((only_h100.samples[0].__class__(
        status="ok", gpus=(only_h100.samples[0].gpus[1],), apps=(), apps_known=True),), (),
        UnitStates(True), 1.0)
    assert gpu_verdict(h100, unit=None, expected_gpus=1).verdict == "unknown"


def test_na_process_memory_still_counts_as_a_process() -> None:
    s = samples_of(["nvidia-smi-gpus-na-fields.txt"], ["nvidia-smi-apps-na-memory.txt"])
    v = gpu_verdict(s, unit=None, expected_gpus=3)
    assert v.verdict == "busy"
    hidden = [p for p in v.processes if not p.visible]
    assert {p.pid for p in hidden} == {2211, 977}
    assert "pid 2211 (owner not visible): /usr/bin/python3" in " ".join(v.reasons)


def test_eight_gpus_two_busy() -> None:
    s = samples_of(["nvidia-smi-gpus-rtxpro6000-8x-two-busy.txt"] * 3,
                   ["nvidia-smi-apps-rtxpro6000-8x-two-busy.txt"] * 3)
    v = gpu_verdict(s, unit=UNIT, expected_gpus=8)
    assert v.verdict == "busy"
    assert [g.index for g in v.gpus if g.verdict == "busy"] == [3, 5]
    assert [g.index for g in v.gpus if g.verdict == "idle"] == [0, 1, 2, 4, 6, 7]
    assert v.gpus[3].signals == ("processes", "memory", "utilization")
    assert [p.pid for p in v.foreign_processes()] == [52310, 52311]


def test_utilization_in_one_sample_of_three_is_busy() -> None:
    s = samples_of(["nvidia-smi-gpus-h200-1x.txt", "nvidia-smi-gpus-h200-1x.txt",
                    "nvidia-smi-gpus-h200-1x.txt"], [""] * 3)
    busy_one = s.samples[1].gpus[0].__class__(**{**s.samples[1].gpus[0].__dict__, "utilization_pct": 7})
    states = (s.samples[0], s.samples[1].__class__(**{**s.samples[1].__dict__, "gpus": (busy_one,)}), s.samples[2])
    v = gpu_verdict(GpuSamples(states, (), UnitStates(True), 1.0), unit=None, expected_gpus=1)
    assert v.verdict == "busy" and v.signals == ("utilization",) and v.gpus[0].utilization_pct == (0, 7, 0)


def test_active_units_make_idle_gpus_busy() -> None:
    s = samples_of(["nvidia-smi-gpus-h200-1x.txt"], [""], serving="activating")
    assert gpu_verdict(s, unit=UNIT, expected_gpus=1).reasons == (f"{UNIT} is activating",)
    s = samples_of(["nvidia-smi-gpus-h200-1x.txt"], [""], serving="inactive", dev_units=("ddtree-dev-bench.service",))
    v = gpu_verdict(s, unit=UNIT, expected_gpus=1)
    assert v.verdict == "busy" and v.signals == ("unit",)
    unknown_units = GpuSamples(s.samples, (), UnitStates(False), 1.0)
    assert gpu_verdict(unknown_units, unit=UNIT, expected_gpus=1).verdict == "unknown"
    assert gpu_verdict(unknown_units, unit=None, expected_gpus=1).verdict == "idle"


# --- through the real sampler script, nvidia-smi replaced at the command boundary -------------------

def stand_in(tmp_path: Path, gpus: str | None, apps: str = "", rc: int = 0, sleep: float = 0) -> dict[str, str]:
    """A PATH whose `nvidia-smi` prints fixture text (or none at all when `gpus` is None)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("sh", "date", "sleep", "cut", "sort", "timeout", "printf", "tr", "stat"):
        found = next((Path(d) / tool for d in ("/usr/bin", "/bin") if (Path(d) / tool).exists()), None)
        if found:
            (bin_dir / tool).symlink_to(found)
    if gpus is not None:
        (tmp_path / "gpus.txt").write_text(fixture(gpus))
        (tmp_path / "apps.txt").write_text(fixture(apps) if apps else "")
        script = bin_dir / "nvidia-smi"
        script.write_text(f"#!/bin/sh\nsleep {sleep}\ncase \"$1\" in --query-gpu=*) cat {tmp_path}/gpus.txt;; "
                          f"*) cat {tmp_path}/apps.txt;; esac\nexit {rc}\n")
        script.chmod(0o755)
    return {"PATH": str(bin_dir), "HOME": str(tmp_path)}


def run_sampler(env: dict[str, str], samples: int = 3, gpu_timeout: int = 10, unit: str | None = None) -> str:
    command = gpus_command(samples, 0.05, gpu_timeout, unit)
    return subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True,
                          timeout=60).stdout


def test_script_idle_and_busy_through_the_stand_in(tmp_path: Path) -> None:
    out = run_sampler(stand_in(tmp_path / "a", "nvidia-smi-gpus-h200-1x.txt"))
    s = parse_gpu_samples(out, unit=None)
    assert len(s.samples) == 3 and all(st.status == "ok" and st.apps_known for st in s.samples)
    assert gpu_verdict(s, unit=None, expected_gpus=1).verdict == "idle"
    out = run_sampler(stand_in(tmp_path / "b", "nvidia-smi-gpus-rtxpro6000-8x-two-busy.txt",
                               "nvidia-smi-apps-rtxpro6000-8x-two-busy.txt"))
    s = parse_gpu_samples(out, unit=None)
    # The script asked /proc about each PID it saw, once, whatever the sample count.
    assert sorted(h.pid for h in s.holders) == [52310, 52311]
    assert [g.index for g in gpu_verdict(s, unit=None, expected_gpus=8).gpus if g.verdict == "busy"] == [3, 5]


def test_script_names_a_real_process_holding_a_gpu(tmp_path: Path) -> None:
    """The holder lines come from /proc: a live process of ours is named with its user and command."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        d = tmp_path / "c"
        env = stand_in(d, "nvidia-smi-gpus-h200-1x-context-only.txt")
        line = (FIXTURES / "nvidia-smi-apps-h200-1x-context-only.txt").read_text().splitlines()[-1]
        (d / "apps.txt").write_text(line.replace("30211", str(sleeper.pid)) + "\n")
        v = gpu_verdict(parse_gpu_samples(run_sampler(env), unit=None), unit=None, expected_gpus=1)
        (proc,) = v.processes
        assert proc.visible and proc.pid == sleeper.pid and proc.command.strip() == "sleep 30"
        assert proc.user == os.getenv("USER", proc.user) or proc.user.isidentifier()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_script_nvidia_smi_absent_is_unknown(tmp_path: Path) -> None:
    """A host whose inventory declares GPUs and that has no nvidia-smi is a problem: never idle."""
    out = run_sampler(stand_in(tmp_path, None))
    s = parse_gpu_samples(out, unit=None)
    assert [st.status for st in s.samples] == ["missing"]  # one try: nothing changes between samples
    v = gpu_verdict(s, unit=None, expected_gpus=1)
    assert v.verdict == "unknown" and v.settled and not v.no_gpus
    assert v.reasons == ("GPU state unknown: nvidia-smi is not installed",)  # nothing sampled: no "1 of 1"
    assert v.samples == 0 and v.nvidia_smi_missing


@pytest.mark.parametrize("gpus_fixture", [None, "nvidia-smi-no-devices.txt"])
def test_a_host_declared_gpu_less_needs_no_nvidia_smi(tmp_path: Path, gpus_fixture: str | None) -> None:
    """`gpus: 0` in the inventory and no nvidia-smi (or one that finds no devices) is the declared
    state, not an unknown one: the verdict rests on the units (it said "unknown", exit 7, and `mode
    HOST dev` refused such a host). An active unit still makes it busy."""
    s = parse_gpu_samples(run_sampler(stand_in(tmp_path, gpus_fixture, rc=6 if gpus_fixture else 0)), unit=None)
    v = gpu_verdict(s, unit=None, expected_gpus=0)
    assert (v.verdict, v.reasons, v.no_gpus, v.settled) == ("idle", (), True, False), v
    assert v.nvidia_smi_missing == (gpus_fixture is None)
    serving = GpuSamples(s.samples, (), UnitStates(True, "active", ()), 1.0)
    busy = gpu_verdict(serving, unit=UNIT, expected_gpus=0)
    assert (busy.verdict, busy.signals, busy.reasons) == ("busy", ("unit",), (f"{UNIT} is active",))
    unreadable = GpuSamples(s.samples, (), UnitStates(False, None, ()), 1.0)
    assert gpu_verdict(unreadable, unit=UNIT, expected_gpus=0).verdict == "unknown"  # systemd not asked


@pytest.mark.parametrize("name,rc,words", [
    ("nvidia-smi-no-driver.txt", 9, "NVIDIA-SMI has failed"),
    ("nvidia-smi-nvml-mismatch.txt", 18, "Driver/library version mismatch"),
])
def test_script_nvidia_smi_failing_is_unknown(tmp_path: Path, name: str, rc: int, words: str) -> None:
    v = gpu_verdict(parse_gpu_samples(run_sampler(stand_in(tmp_path, name, rc=rc)), unit=None),
                    unit=None, expected_gpus=1)
    assert v.verdict == "unknown" and words in v.reasons[0]


def test_script_nvidia_smi_too_slow_is_unknown(tmp_path: Path) -> None:
    env = stand_in(tmp_path, "nvidia-smi-gpus-h200-1x.txt", sleep=5)
    v = gpu_verdict(parse_gpu_samples(run_sampler(env, samples=1, gpu_timeout=1), unit=None),
                    unit=None, expected_gpus=1)
    assert v.verdict == "unknown" and "did not answer in time" in v.reasons[0]
