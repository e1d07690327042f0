"""What the Python op adds to draft_topk_lse's period over the C ABI (session 11, NOTES "v15 (session 11"), and which
k > 1 code a decoding round prefers (v9 or v13r) under the solo launch. One process, alternating passes.

Part 1 (issue #3 clue 1: the Python bench's 1x15 figures sit 0.3-0.5 µs above the C profiler's C ABI at the same graph
length). Each row changes ONE thing against the bench's own path ("op": draft_topk_lse_impl(x, k, "default") timed by
_timing.time_calls, which warms the GPU with bf16 GEMMs first):
  abi        the same launch through the C ABI with fixed output / workspace buffers (what the C profiler does);
  abi_hash   abi on the C profiler's inputs (its hash Box-Muller randn x 4 fill, ported bit for bit);
  op_hash    op on those inputs;
  op_fill    op, the GPU warmed by memory-bound fills (as the C profiler does) instead of GEMMs;
  abi_fill   abi, warmed by fills.
Also: the captured graph's nodes (DOT dump of a 4-call graph, op vs abi), the output addresses each captured op call
got, the SM clock after each warm-up, and the kernel list of one replay (torch.profiler / CUPTI).

Part 2 (clue 2): a round-like setting, the logits written by an lm_head GEMM ([15, H] x [H, V]^T, bf16, H = 1024:
its weight evicts L2 and its cuBLAS code the instruction caches) right before each call: per variant, a graph of 16
(GEMM, top-k) pairs minus a graph of 16 GEMMs, µs per call; the default vs DDTREE_TOPK_V4_OPT=s10 (session 10's default:
v13r, solo; the same as the default before session 11 and in libraries without "s10") vs =v9 (solo) vs
DDTREE_TOPK_V4_LAUNCH=pair.
abi_fill_side: abi_fill replayed and timed on a created stream (the C profiler's) instead of torch's default stream.
Usage: python engine/bench/bench_topk_pypath.py [--passes=3] [--ks=1,16,32,64] [--ks2=16,32] [--dump=DIR]
    [--only=part1|part2]"""

from __future__ import annotations

import ctypes
import os
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from _timing import device_name, print_table, scoped_env, time_calls

from ddtree_engine.ops._common import error_flags, ptr, stream_handle  # noqa: E402
from ddtree_engine.ops.draft_topk_lse import _DTYPES, _fns, draft_topk_lse_impl  # noqa: E402
from ddtree_engine.reference import draft_topk_lse as ref  # noqa: E402

L, V, SETS = 15, 163840, 16
M32 = 0xFFFFFFFF


def hash_normal(n: int, seed: int) -> torch.Tensor:
    """bench/profile/graph_timer.h fill_normal, in torch (uint32 arithmetic on int64, masked): 4 * randn, bf16."""
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    h = ((i * 0x9E3779B9) & M32) ^ seed
    h = h ^ (h >> 15)
    h = (h * 0x2C1B3C6D) & M32
    h = h ^ (h >> 12)
    g = ((h * 0x85EBCA6B) & M32) ^ ((seed * 0xC2B2AE35 + 0x27D4EB2F) & M32)
    g = g ^ (g >> 13)
    g = (g * 0x2C1B3C6D) & M32
    g = g ^ (g >> 16)
    u1 = ((h & 0xFFFFFF).float() + 0.5) / 16777216.0
    u2 = (g & 0xFFFFFF).float() / 16777216.0
    return (4.0 * torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(torch.pi * 2.0 * u2)).to(torch.bfloat16)


class Abi:
    """The C ABI call with fixed buffers (the C profiler's way)."""

    def __init__(self, k: int) -> None:
        size_fn, self.run = _fns()
        self.k = k
        self.nbytes = int(size_fn(1, L, V, k))  # type: ignore[operator]
        self.ws = torch.empty(self.nbytes, dtype=torch.uint8, device="cuda")
        self.lp = torch.empty((1, L, k), dtype=torch.float32, device="cuda")
        self.id = torch.empty((1, L, k), dtype=torch.int32, device="cuda")
        self.lse = torch.empty((1, L), dtype=torch.float32, device="cuda")
        self.flags = error_flags(torch.device("cuda", torch.cuda.current_device()))

    def __call__(self, x: torch.Tensor) -> None:
        status = self.run(ptr(x), _DTYPES[x.dtype], 1, L, V, L * V, V, self.k, ptr(self.lp), ptr(self.id),  # type: ignore[operator]
                          ptr(self.lse), ptr(self.ws), self.nbytes, ptr(self.flags),
                          stream_handle(x.device), 0)
        assert status == 0, status


def sm_clock() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001 - a missing NVML only loses the clock column
        return -1


_FILL = {}


def warm_fill(seconds: float = 0.1) -> None:
    """Memory-bound warm-up (the C profiler warms with 3,000 fills of its inputs): elementwise passes over 256 MB."""
    if "buf" not in _FILL:
        _FILL["buf"] = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
    b = _FILL["buf"]
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            b.mul_(1.0)
        torch.cuda.synchronize()


def time_fill(calls: list, side: bool = False) -> tuple[float, int]:
    """_timing.time_calls with the fill warm-up instead of GEMMs; also the SM clock right after the warm-up. side:
    replay and time on a created stream (as the C profiler does) instead of torch's default stream."""
    clk: list[int] = []
    t = time_calls(calls, warm=lambda: (warm_fill(0.1), clk.append(sm_clock())),
                   stream=torch.cuda.Stream() if side else None)
    return t, clk[0]


def graph_nodes(calls: list, path: Path) -> str:
    """Capture `calls` with the debug dump on; summarize the DOT (node kinds, edges)."""
    g = torch.cuda.CUDAGraph()
    g.enable_debug_mode()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.debug_dump(str(path))
    if not path.is_file():
        return "(no DOT file written)"
    text = path.read_text(errors="replace")
    kinds = Counter(re.findall(r"\b(KERNEL|MEMSET|MEMCPY|EVENT_RECORD|WAIT_EVENT|MEM_ALLOC|MEM_FREE|HOST|EMPTY)\b", text))
    names = Counter(re.findall(r"(draft_topk_lse\w*kernel|vectorized\w*|elementwise\w*|fill\w*)", text))
    edges = len(re.findall(r"->", text))
    prog = len(re.findall(r"(?i)programmatic", text))
    return f"kinds {dict(kinds)} edges {edges} 'programmatic' mentions {prog} kernels {dict(names)}"


def kernel_list(g_calls: list) -> str:
    """Kernels of one replay of a graph of g_calls, by name: count and mean device µs (CUPTI via torch.profiler)."""
    g = torch.cuda.CUDAGraph()
    for c in g_calls:
        c()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for c in g_calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    out = []
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA or getattr(e, "device_time_total", 0) > 0:
            out.append(f"{e.key[:60]} x{e.count} {getattr(e, 'device_time_total', 0) / max(e.count, 1):.2f}us")
    return "; ".join(out) or "(no device events)"


def part1(ks: list[int], passes: int, dump: Path | None) -> None:
    xs = [torch.randn(1, L, V, device="cuda").mul_(4).to(torch.bfloat16) for _ in range(SETS)]
    xh = [hash_normal(L * V, 17 * i + 1).view(1, L, V) for i in range(SETS)]
    print(f"inputs: randn std {xs[0].float().std():.3f} max {xs[0].float().max():.2f}; "
          f"hash std {xh[0].float().std():.3f} max {xh[0].float().max():.2f}")
    rows = []
    for k in ks:
        abi = Abi(k)
        for x in (xs[0], xh[0]):
            wlp, wid, wlse = ref(x, k)
            lp, idx, lse = draft_topk_lse_impl(x, k, "default")
            abi(x)
            torch.cuda.synchronize()
            assert torch.equal(idx, wid) and torch.allclose(lp, wlp, atol=4e-6, rtol=0), f"op != ref k={k}"
            assert torch.equal(abi.id, wid) and torch.allclose(abi.lp, wlp, atol=4e-6, rtol=0), f"abi != ref k={k}"
        variants = {
            "op": lambda: time_calls([lambda x=x: draft_topk_lse_impl(x, k, "default") for x in xs]),
            "abi": lambda: time_calls([lambda x=x: abi(x) for x in xs]),
            "abi_hash": lambda: time_calls([lambda x=x: abi(x) for x in xh]),
            "op_hash": lambda: time_calls([lambda x=x: draft_topk_lse_impl(x, k, "default") for x in xh]),
            "op_fill": lambda: time_fill([lambda x=x: draft_topk_lse_impl(x, k, "default") for x in xs]),
            "abi_fill": lambda: time_fill([lambda x=x: abi(x) for x in xs]),
            "abi_fill_side": lambda: time_fill([lambda x=x: abi(x) for x in xs], side=True),
        }
        got: dict[str, list[float]] = {n: [] for n in variants}
        clocks: dict[str, list[int]] = {"gemm": [], "fill": []}
        for _ in range(passes):
            for name, fn in variants.items():
                r = fn()
                if isinstance(r, tuple):
                    got[name].append(r[0])
                    clocks["fill"].append(r[1])
                else:
                    got[name].append(r)
                    if name == "op":
                        clocks["gemm"].append(sm_clock())  # after the replays (time_calls hides its warm-up)

        def torch_f32(x: torch.Tensor) -> None:
            xf = x.float()
            v, _ = torch.topk(xf, k, dim=-1)
            v - torch.logsumexp(xf, dim=-1, keepdim=True)

        t_f32 = time_calls([lambda x=x: torch_f32(x) for x in xs])
        med = {n: statistics.median(v) for n, v in got.items()}
        rows.append([k, t_f32] + [med[n] for n in variants] + [t_f32 / med["op"], t_f32 / med["abi"]])
        print(f"K={k} passes: " + "; ".join(f"{n} " + " ".join(f"{t:.2f}" for t in v) for n, v in got.items())
              + f"; SM MHz after gemm-warm runs {clocks['gemm']}, after fill warm-ups {clocks['fill']}")
        if k == ks[-1] or k == 16:
            addrs: list[int] = []

            def op_rec(x: torch.Tensor) -> None:
                addrs.append(draft_topk_lse_impl(x, k, "default")[0].data_ptr())

            for c in [lambda x=x: op_rec(x) for x in xs[:4]]:
                c()
            addrs.clear()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for x in xs:
                    op_rec(x)
            base = min(addrs)
            print(f"K={k} op top_lp addresses in one capture (offsets from the lowest, KB): "
                  + " ".join(str((a - base) >> 10) for a in addrs) + f"; distinct {len(set(addrs))} of {len(addrs)}")
            if dump is not None:  # the DOT dump failed on the device in the first call (no file written)
                print(f"K={k} graph op : " + graph_nodes([lambda x=x: draft_topk_lse_impl(x, k, "default")
                                                          for x in xs[:4]], dump / f"op_k{k}.dot"))
                print(f"K={k} graph abi: " + graph_nodes([lambda x=x: abi(x) for x in xs[:4]], dump / f"abi_k{k}.dot"))
            try:
                print(f"K={k} kernels op : " + kernel_list([lambda x=x: draft_topk_lse_impl(x, k, "default")
                                                             for x in xs]))
                print(f"K={k} kernels abi: " + kernel_list([lambda x=x: abi(x) for x in xs]))
            except Exception as exc:  # noqa: BLE001 - the profiler is a look, not the measurement
                print(f"K={k} kernel list failed: {exc!r}")
    print_table("Part 1: 1x15x163840, µs per call (16 calls per graph over 16 input sets; medians of passes)",
                ["K", "torch f32"] + list(variants) + ["x f32 op", "x f32 abi"], rows)


def part2(ks: list[int], passes: int, hidden: int = 1024) -> None:
    w = torch.randn(V, hidden, device="cuda", dtype=torch.bfloat16).mul_(hidden ** -0.5 * 4)
    hs = [torch.randn(L, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    sides = {"default": {}, "s10": {"DDTREE_TOPK_V4_OPT": "s10"}, "v9": {"DDTREE_TOPK_V4_OPT": "v9"},
             "pair": {"DDTREE_TOPK_V4_LAUNCH": "pair"}}
    rows = []
    for k in ks:
        x = (hs[0] @ w.t()).view(1, L, V)
        wlp, wid, _ = ref(x, k)
        for name, env in sides.items():
            with scoped_env(env):
                lp, idx, _ = draft_topk_lse_impl(x, k, "default")
            assert torch.equal(idx, wid) and torch.allclose(lp, wlp, atol=4e-6, rtol=0), f"{name} != ref k={k}"
        gemm = []
        got: dict[str, list[float]] = {n: [] for n in sides}
        for _ in range(passes):
            gemm.append(time_calls([lambda h=h: h @ w.t() for h in hs]))
            for name, env in sides.items():
                with scoped_env(env):
                    t = time_calls([lambda h=h: draft_topk_lse_impl((h @ w.t()).view(1, L, V), k, "default")
                                    for h in hs])
                got[name].append(t)
        g = statistics.median(gemm)
        med = {n: statistics.median(v) - g for n, v in got.items()}
        rows.append([k, g] + [med[n] for n in sides]
                    + [" ".join(f"{t - gg:.2f}" for t, gg in zip(got[n], gemm)) for n in sides])
    print_table(f"Part 2: after an lm_head GEMM (H = {hidden}), µs per call = (GEMM + top-k) - GEMM, medians",
                ["K", "GEMM"] + list(sides) + [f"{n} passes" for n in sides], rows)


def main() -> None:
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    passes = int(opts.get("passes", "3"))
    ks = [int(v) for v in opts.get("ks", "1,16,32,64").split(",")]
    dump = Path(opts["dump"]) if "dump" in opts else None
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
    print(f"{device_name()}; lib {os.environ.get('DDTREE_LIB')}")
    if "part2" not in opts.get("only", ""):
        part1(ks, passes, dump)
    if "part1" not in opts.get("only", ""):
        part2([int(v) for v in opts.get("ks2", "16,32").split(",")], passes)


if __name__ == "__main__":
    main()
