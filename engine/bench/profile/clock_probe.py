"""Which clock limits a long kernel? Runs one op back to back for a few seconds and samples the GPU's
SM clock, power and clock-event reasons (`nvidia-smi -q -d PERFORMANCE,POWER,CLOCK`) while it runs.

Cases: fa3 tree attention at 64/8 heads x 512 nodes x 64k context (256 CTAs), the same at 8/1 heads x
512 x 4k (128 CTAs), and the 8192^3 bf16 matmul that sets the bench's FLOP floor. Written to answer
whether fa3's per-tile time grows with the number of busy SMs because of the clock (power) or of the
memory path (engine/bench/NOTES.md, tree_attention v9).
Usage (GPU): PYTHONPATH=engine/python python3 engine/bench/profile/clock_probe.py [--seconds 3]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_ops import attention  # noqa: E402


def matmul():
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn_like(a)
    return lambda: a @ b


def smi_lines() -> list[str]:
    out = subprocess.run(["nvidia-smi", "-q", "-d", "PERFORMANCE,POWER,CLOCK"], capture_output=True, text=True).stdout
    keep = ("Graphics", "SM  ", "SM :", "Power Draw", "Current Power Limit", "SW Power Cap", "HW Slowdown",
            "HW Thermal", "SW Thermal", "HW Power Brake", "Idle", "Applications Clocks Setting", "Sync Boost")
    return [ln.strip() for ln in out.splitlines() if any(k in ln for k in keep)]


def run_case(name: str, fn, seconds: float) -> None:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    samples: list[list[str]] = []
    stop = threading.Event()

    def sampler() -> None:
        time.sleep(seconds / 3)
        while not stop.is_set():
            samples.append(smi_lines())
            time.sleep(seconds / 4)

    th = threading.Thread(target=sampler)
    th.start()
    t0 = time.perf_counter()
    calls = 0
    start.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            fn()
        calls += 10
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    stop.set()
    th.join()
    print(f"== {name}: {calls} calls, {start.elapsed_time(end) * 1e3 / calls:.1f} us per call (back to back)")
    for i, s in enumerate(samples[:3]):
        print(f"  sample {i}: " + " | ".join(s))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    print("idle: " + " | ".join(smi_lines()))
    run_case("fa3 64/8 x 512 x 64k (256 CTAs)", attention(64, 8, 512, 65536), a.seconds)
    run_case("fa3 8/1 x 512 x 4k (128 CTAs)", attention(8, 1, 512, 4096), a.seconds)
    run_case("fa3 8/1 x 512 x 64k", attention(8, 1, 512, 65536), a.seconds)
    run_case("bf16 matmul 8192^3", matmul(), a.seconds)


if __name__ == "__main__":
    main()
