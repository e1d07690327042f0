"""Issue #3 clue 1 (session 12, NOTES "v16 (session 12"): is the Python bench's 0.3-0.6 µs per call over the C profiler
at 1x15 x 163,840 the kernel, the GPU's state, or the timing method? One process, alternating passes; each row changes
ONE thing against the bench's own method (draft_topk_lse_impl(x, k, "default"), a graph of 16 calls over 16 randn x 4
input sets, GEMM warm-up, event / replay / event with no fence = "plain16"):
  fenced16   each replay behind a 100 µs GPU spin (_timing.fence_us: the host's launch latency outside the events);
  plain64 / fenced64   the same with 64 calls per graph (a per-replay cost shrinks 4x per call);
  fenced16_fill        fenced16 after the memory-bound fill warm-up (bench_topk_pypath.warm_fill) instead of GEMMs;
and the torch f32 peer (float -> topk -> logsumexp) plain16 and fenced16. NVML state (SM clock MHz, clock event
reasons, temperature, power) is read right after each warm-up and after each row's replays. bench/profile/
topk_abi_timing.cu times the C ABI the same ways (plain / fenced, 16 / 64 calls) in its own process.
--mode=warm (the second call): ours and the peer, fenced16, after each of _timing.warm_gpu's warm-ups ("gemm": the
bench's 4096^3 GEMMs, "mem": elementwise passes, "lmhead": a drafter lm_head GEMM at V = 163,840, as a round runs it).
Usage: python engine/bench/bench_topk_timing.py [--passes=3] [--ks=1,16,32,64] [--mode=method|warm]"""

from __future__ import annotations

import statistics
import sys

import torch

from _timing import device_name, print_table, save_json, time_calls, warm_gpu
from bench_topk_pypath import warm_fill

from ddtree_engine.ops.draft_topk_lse import draft_topk_lse_impl  # noqa: E402
from ddtree_engine.reference import draft_topk_lse as ref  # noqa: E402

L, V, SETS = 15, 163840, 16


def nvml_state() -> str:
    """'MHz/reasons/C/W' of GPU 0 now (reasons: NVML clock event bits in hex), or '-' without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        mhz = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        try:
            reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        except AttributeError:
            reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        temp = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        watts = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
        return f"{mhz}/{reasons:#x}/{temp}C/{watts:.0f}W"
    except Exception:  # noqa: BLE001 - a missing NVML only loses the state column
        return "-"


def check(x: torch.Tensor, k: int) -> None:
    """The op's output against the reference (ids exact, log-probs to 4e-6) before anything is timed."""
    want = ref(x, k)
    got = draft_topk_lse_impl(x, k, "default")
    assert torch.equal(got[1], want[1]) and torch.allclose(got[0], want[0], atol=4e-6, rtol=0), f"op != ref k={k}"


def peer_f32(x: torch.Tensor, k: int) -> None:
    """The benches' torch f32 peer: logits.float() -> topk -> logsumexp."""
    xf = x.float()
    torch.topk(xf, k, dim=-1)[0] - torch.logsumexp(xf, dim=-1, keepdim=True)


def main() -> None:
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    passes = int(opts.get("passes", "3"))
    ks = [int(v) for v in opts.get("ks", "1,16,32,64").split(",")]
    print(f"{device_name()}; NVML now {nvml_state()}")
    xs = [torch.randn(1, L, V, device="cuda").mul_(4).to(torch.bfloat16) for _ in range(SETS)]
    rows = []
    states: list[str] = []
    for k in ks:
        check(xs[0], k)
        ours16 = [lambda x=x: draft_topk_lse_impl(x, k, "default") for x in xs]  # noqa: B023
        peer16 = [lambda x=x: peer_f32(x, k) for x in xs]  # noqa: B023

        def warmed(kind: str):  # noqa: ANN202
            def warm() -> None:
                if kind == "fill":
                    warm_fill(0.1)
                else:
                    warm_gpu(0.1, kind)
                states.append(f"K{k} after {kind} warm {nvml_state()}")  # noqa: B023
            return warm

        if opts.get("mode", "method") == "warm":
            variants = {f"{who}_{kind}": (lambda c=c, kind=kind: time_calls(c, warm=warmed(kind), fence=100))
                        for kind in ("gemm", "mem", "lmhead") for who, c in (("ours", ours16), ("peer", peer16))}
        else:
            variants = {
                "plain16": lambda: time_calls(ours16, warm=warmed("gemm"), fence=0),
                "fenced16": lambda: time_calls(ours16, warm=warmed("gemm"), fence=100),
                "plain64": lambda: time_calls(ours16 * 4, warm=warmed("gemm"), fence=0),
                "fenced64": lambda: time_calls(ours16 * 4, warm=warmed("gemm"), fence=100),
                "fenced16_fill": lambda: time_calls(ours16, warm=warmed("fill"), fence=100),
                "peer_plain16": lambda: time_calls(peer16, warm=warmed("gemm"), fence=0),
                "peer_fenced16": lambda: time_calls(peer16, warm=warmed("gemm"), fence=100),
            }
        got: dict[str, list[float]] = {n: [] for n in variants}
        for _ in range(passes):
            for name, fn in variants.items():
                got[name].append(fn())
                states.append(f"K{k} after {name} replays {nvml_state()}")
        med = {n: statistics.median(v) for n, v in got.items()}
        pairs = [(p, o) for p, o in (("peer_plain16", "plain16"), ("peer_fenced16", "fenced16"), ("peer_gemm", "ours_gemm"),
                                     ("peer_mem", "ours_mem"), ("peer_lmhead", "ours_lmhead")) if p in med]
        rows.append([k] + [med[n] for n in variants] + [med[p] / med[o] for p, o in pairs])
        print(f"K={k} passes: " + "; ".join(f"{n} " + " ".join(f"{t:.2f}" for t in v) for n, v in got.items()))
    for s in states:
        print(s)
    print_table("1x15x163840: µs per call (medians of passes; 16 / 64 calls per graph; plain = no fence, fenced = each "
                "replay behind a 100 µs spin)", ["K"] + list(variants) + [f"x f32 {o}" for _, o in pairs], rows)
    save_json("bench_topk_timing", {"device": device_name(), "passes": passes, "rows": rows, "nvml": states})


if __name__ == "__main__":
    main()
