"""nvidia-smi parsing on fixtures of its real output formats (see fixtures/README.md)."""

from __future__ import annotations

from ddtreectl.probes.facts import GpuInfo, GpuState
from ddtreectl.probes.parse import Section, gpu_state, parse_compute_apps, parse_gpus
from ddtreectl.probes.words import gpu_summary

from tests.probes.fixtures import fixture


def section(name: str, body: str, rc: int | None = 0, missing: bool = False, ms: int = 25) -> Section:
    return Section(name=name, arg="", body=body, rc=rc, ms=ms, missing=missing)


def test_rtx_pro_6000_eight_gpus_serving() -> None:
    gpus = parse_gpus(fixture("nvidia-smi-gpus-rtxpro6000-8x-serving.txt"))
    assert len(gpus) == 8
    assert gpus[0] == GpuInfo(
        index=0, uuid="GPU-5a0b7c3e-1f42-9d6e-7c11-2e8f4b9a0c01",
        name="NVIDIA RTX PRO 6000 Blackwell Server Edition", memory_used_mib=89214,
        memory_total_mib=97887, utilization_pct=97, persistence_mode=True, compute_cap="12.0")
    assert [g.index for g in gpus] == list(range(8))
    apps = parse_compute_apps(fixture("nvidia-smi-apps-rtxpro6000-8x-serving.txt"))
    assert [a.process_name for a in apps] == [f"sglang::scheduler_TP{i}" for i in range(8)]
    assert apps[7].pid == 41880 and apps[7].used_memory_mib == 89196
    state = gpu_state(section("gpus", fixture("nvidia-smi-gpus-rtxpro6000-8x-serving.txt")),
                      section("apps", fixture("nvidia-smi-apps-rtxpro6000-8x-serving.txt")))
    assert state.status == "ok" and state.apps_known and state.detail == ""
    assert all(state.busy(g) is True for g in state.gpus)
    assert gpu_summary(state) == "8/8 busy · 697/765 GiB"


def test_seven_idle_gpus_persistence_off() -> None:
    state = gpu_state(section("gpus", fixture("nvidia-smi-gpus-rtxpro6000-7of8-idle-pm-off.txt")),
                      section("apps", ""))
    assert state.status == "ok" and len(state.gpus) == 7
    assert all(g.persistence_mode is False for g in state.gpus)
    assert [state.busy(g) for g in state.gpus] == [False] * 7
    assert gpu_summary(state) == "0/7 busy · 0.0/669 GiB"


def test_h200() -> None:
    (gpu,) = parse_gpus(fixture("nvidia-smi-gpus-h200-1x.txt"))
    assert (gpu.name, gpu.memory_total_mib, gpu.compute_cap, gpu.persistence_mode) == (
        "NVIDIA H200", 143771, "9.0", True)


def test_na_and_not_supported_are_unknown_never_zero() -> None:
    gb10, h100, a10g = parse_gpus(fixture("nvidia-smi-gpus-na-fields.txt"))
    assert gb10.memory_used_mib is None and gb10.memory_total_mib is None
    assert gb10.utilization_pct == 3 and gb10.compute_cap == "12.1"
    assert h100.utilization_pct is None and h100.memory_used_mib == 13
    assert a10g.persistence_mode is None
    apps = parse_compute_apps(fixture("nvidia-smi-apps-na-memory.txt"))
    assert apps[0].used_memory_mib is None and apps[0].pid == 2211
    assert apps[1].process_name == "python -c import torch, time" and apps[1].used_memory_mib == 1204
    state = gpu_state(section("gpus", fixture("nvidia-smi-gpus-na-fields.txt")),
                      section("apps", fixture("nvidia-smi-apps-na-memory.txt")))
    # GB10 and H100 have processes: busy. A10G: every signal known and idle.
    assert [state.busy(g) for g in state.gpus] == [True, True, False]
    no_apps = gpu_state(section("gpus", fixture("nvidia-smi-gpus-na-fields.txt")), section("apps", ""))
    # Without processes, GB10's unknown memory and H100's unknown utilization stay unknown.
    assert [no_apps.busy(g) for g in no_apps.gpus] == [True, None, False]
    assert gpu_summary(no_apps) == "1/3 busy (1 unknown)"


def test_apps_query_failing_makes_every_gpu_unknown_not_idle() -> None:
    state = gpu_state(section("gpus", fixture("nvidia-smi-gpus-h200-1x.txt")),
                      section("apps", "Unable to determine the device handle for gpu 0000:1B:00.0", rc=15))
    assert state.status == "ok" and not state.apps_known
    assert state.busy(state.gpus[0]) is None
    assert "compute-apps query failed" in state.detail


def test_no_devices() -> None:
    state = gpu_state(section("gpus", fixture("nvidia-smi-no-devices.txt"), rc=6),
                      section("apps", fixture("nvidia-smi-no-devices.txt"), rc=6))
    assert state.status == "no-devices" and state.gpus == () and not state.apps_known
    assert gpu_summary(state) == "no GPUs"


def test_driver_not_loaded_and_nvml_mismatch_are_errors_with_their_words() -> None:
    state = gpu_state(section("gpus", fixture("nvidia-smi-no-driver.txt"), rc=9), None)
    assert state.status == "error"
    assert state.detail.startswith("NVIDIA-SMI has failed because it couldn't communicate")
    state = gpu_state(section("gpus", fixture("nvidia-smi-nvml-mismatch.txt"), rc=18), None)
    assert (state.status, state.detail) == ("error", "Failed to initialize NVML: Driver/library version mismatch")
    assert gpu_summary(state) == "unknown (error)"


def test_missing_binary_and_timeout() -> None:
    assert gpu_state(section("gpus", "", rc=127, missing=True), None).status == "missing"
    state = gpu_state(section("gpus", "", rc=124, ms=10002), section("apps", "", rc=124))
    assert state.status == "timeout" and "did not answer" in state.detail
    assert gpu_state(None, None) == GpuState(status="not-run", detail="the probe output has no GPU section")


def test_stray_lines_are_reported_not_silently_dropped() -> None:
    text = fixture("nvidia-smi-gpus-h200-1x.txt") + "WARNING: infoROM is corrupted at gpu 0000:1B:00.0\n"
    state = gpu_state(section("gpus", text), section("apps", ""))
    assert state.status == "ok" and len(state.gpus) == 1
    assert state.detail == "unexpected nvidia-smi output: WARNING: infoROM is corrupted at gpu 0000:1B:00.0"


def test_garbage_with_exit_zero_is_an_error() -> None:
    state = gpu_state(section("gpus", "Segmentation fault\n"), section("apps", ""))
    assert (state.status, state.detail, state.gpus) == ("error", "Segmentation fault", ())
