"""Timing helpers shared by the engine benches (bench_*.py).

Every number is a median over graph replays with CUDA events; each graph holds several calls over
rotating input sets (together larger than L2, so the caches don't flatter anyone), each replay behind a
GPU spin so that the host's launch latency stays outside the events (fence_us); the byte floor uses
the device-to-device copy bandwidth measured in the same process."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


@contextlib.contextmanager
def scoped_env(env: dict[str, str]) -> Iterator[None]:
    """Set `env`'s variables for the block, then restore what was there before (unset ones unset again).
    The launchers read their per-call switches (e.g. DDTREE_TA_FA3_PDL) at every launch, so a bench can
    A/B them in one process."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_WARM: dict[str, torch.Tensor] = {}


def warm_kind() -> str:
    """The warm-up before timed replays (DDTREE_BENCH_WARM): "lmhead" (the default: a drafter lm_head, [15, 1024] x
    [1024, 163,840]^T bf16, back to back, the largest GEMM of a decoding round at that vocabulary), "mem" (elementwise
    passes over 256 MB, as the C profilers warm up) or "gemm" (back-to-back 4096^3 bf16 GEMMs, the method before
    session 12). Session 12 (NOTES "v16 (session 12"): the 4096^3 GEMMs leave the card under its software power cap
    (NVML clock-event reason 0x4, SM 1830-1965 MHz) for the replays that follow, which a round's small-M GEMMs do not
    (the lm_head warm-up: reason 0x0, 1980 MHz); ops and peers alike are timed after the same warm-up."""
    return os.environ.get("DDTREE_BENCH_WARM", "lmhead")


def warm_gpu(seconds: float = 0.3, kind: str | None = None) -> None:
    """Keep the GPU busy for a while so that its clocks are up before a measurement (an idle H200 sits
    at 345 MHz; the first run of this bench measured ours at idle clocks and torch's right after); `kind`
    (default warm_kind()) says with what."""
    kind = warm_kind() if kind is None else kind
    if kind == "mem":
        buf = _WARM.setdefault("mem", torch.empty(64 << 20, dtype=torch.float32, device="cuda"))
        step = lambda: buf.mul_(1.0)  # noqa: E731
    elif kind == "lmhead":
        w = _WARM.setdefault("w", torch.randn(163840, 1024, device="cuda", dtype=torch.bfloat16))
        h = _WARM.setdefault("h", torch.randn(15, 1024, device="cuda", dtype=torch.bfloat16))
        step = lambda: h @ w.t()  # noqa: E731
    else:
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

        def step() -> None:
            nonlocal a
            a = (a @ a).clamp_(-1, 1)

    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            step()
        torch.cuda.synchronize()


def fence_us() -> float:
    """The GPU spin queued before each timed replay (µs; DDTREE_BENCH_FENCE_US, default 100, 0 = none). Session 12
    (NOTES "v16 (session 12"): without it the start event fires as soon as the host records it, and the GPU then
    idles until the host's graph launch reaches it, which was timed as the calls' (H200, Python: 0.04-0.11 µs per
    call of the top-k at 16 calls per graph, ~1-2 µs per replay; C: 0.01-0.06). Behind the spin the host's event
    record and graph launch are already queued when the spin ends, so the events bracket the graph alone, as
    bench_e2e.py's fenced() replays do."""
    return float(os.environ.get("DDTREE_BENCH_FENCE_US", "100"))


def timed_replays(graph: torch.cuda.CUDAGraph, replays: int, fence: float | None = None) -> list[float]:
    """Milliseconds of `replays` single replays of `graph` on the current stream, each between two events and behind
    a fence of `fence` µs (None: fence_us()). One untimed replay first."""
    fence = fence_us() if fence is None else fence
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if fence > 0:
            torch.cuda._sleep(int(fence * 1980))  # cycles at the ~1.98 GHz SM clock; a slower clock only lengthens it
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def time_calls(calls: list[Callable[[], object]], replays: int = 30, warm: Callable[[], object] | None = None,
               stream: torch.cuda.Stream | None = None, fence: float | None = None) -> float:
    """Median microseconds per call: the calls are captured into one CUDA graph, replayed `replays` times
    right after the GPU was kept busy (warm_gpu; `warm` replaces it, e.g. for bench_topk_pypath.py's
    memory-bound warm-up), on torch's current stream (or `stream`), each replay behind a fence (fence_us(); `fence`
    replaces it, 0 = none)."""
    for call in calls:  # warm-up: library loading, allocator pools, cuBLAS handles outside the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    if warm is None:
        warm_gpu(0.1)
    else:
        warm()
    with torch.cuda.stream(stream if stream is not None else torch.cuda.current_stream()):
        times = timed_replays(graph, replays, fence)
    return statistics.median(t * 1000.0 / len(calls) for t in times)


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written: the faster of a
    captured memcpy (measured 2.7 TB/s on the H200 here, likely the copy engine) and an elementwise copy
    kernel (torch.mul by 1 into another buffer), so that the floor is the SMs' own best rate."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    warm_gpu(0.5)
    memcpy_us = time_calls([lambda: dst.copy_(src)] * 4, replays=20)
    kernel_us = time_calls([lambda: torch.mul(src, 1.0, out=dst)] * 4, replays=20)
    return 2 * nbytes / (min(memcpy_us, kernel_us) * 1e-6)


def print_table(title: str, header: list[str], rows: list[list[object]]) -> None:
    cells = [header] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def save_json(name: str, payload: dict[str, object]) -> None:
    out = os.environ.get("DDTREE_BENCH_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(payload, indent=1))


def device_name() -> str:
    return f"{torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))})"


def capture_graph(fn: Callable[[], object], calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls` calls of `fn`, replayed once (warmed up on a side stream first, as capture
    requires)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def graph_time(fn: Callable[[], object], calls: int = 10, reps: int = 15, fence: float | None = None) -> float:
    """Median seconds per call of `fn`, replaying a CUDA graph of `calls` calls `reps` times, each replay behind a
    fence (fence_us(); `fence` replaces it, 0 = none)."""
    g = capture_graph(fn, calls)
    return statistics.median(timed_replays(g, reps, fence)) / 1e3 / calls
