"""Bench tree_attention vs torch SDPA (boolean mask) and flex_attention (block mask), same process.

Every back end of the kernel that the device can run (mma.sync, wgmma, fa3) is timed in the same run
and printed side by side; "ours" is the default back end (what a caller gets without choosing).

Every path is timed as CUDA-graph replays (median over repeats, several calls per graph, input sets
rotated so small shapes are not timed out of L2 alone). The floor is max(bytes, FLOPs) with the copy
bandwidth and bf16 matmul rate measured in this run. torch paths get dense, pre-gathered K/V (their
best case); the kernel reads the paged cache. Usage:
    python engine/bench/bench_tree_attention.py [--json out.json] [--quick]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import statistics
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from ddtree_engine.ops import tree_attention  # noqa: E402

ta_ops = sys.modules["ddtree_engine.ops.tree_attention"]
from ddtree_engine.reference import tree_attention as _ref_fn  # noqa: E402,F401  (binds the name)

ref = sys.modules["ddtree_engine.reference.tree_attention"]
from _timing import capture_graph, copy_bandwidth, graph_time, scoped_env  # noqa: E402
from ddtree_engine import _lib  # noqa: E402
from _tree_attention_bench_ab import FA3_AB, alternate, print_ab, print_alt, print_alt_env  # noqa: E402


def measure_ceilings() -> tuple[float, float]:
    """(copy bytes/s counting read + write, bf16 matmul FLOP/s) on random data. The copy rate is
    _timing.copy_bandwidth's (the faster of a captured memcpy and an elementwise copy kernel): a captured
    `copy_` alone read 2.7 TB/s on the H200, against ~4.2 TB/s for the kernel, which made byte floors 1.5x
    too high (every shape of the table is FLOP-bound, so its ratios did not change)."""
    bw = copy_bandwidth(512 * 1024 * 1024)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t = graph_time(lambda: a @ b, calls=5, reps=10)
    return bw, 2 * 8192**3 / t


GEMM_N = 8192  # the matmul peer of the FLOP floor: one bf16 GEMM of GEMM_N^3


def matmul_peer() -> Callable[[], object]:
    a = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device="cuda")
    return lambda: a @ b


def interleaved_time(fn: Callable[[], object], fn_calls: int, peer: Callable[[], object], peer_calls: int,
                     reps: int = 15) -> tuple[float, float]:
    """(seconds per call of fn, seconds per call of peer), medians over `reps` rounds in which a graph of
    fn_calls calls of fn and a graph of peer_calls calls of peer replay back to back (fn, peer, fn, peer,
    ...). The two graphs are sized to about the same duration, so both run under the same duty cycle and
    power state: the H200 holds its 700 W cap by lowering the SM clock on long GEMM and fa3 runs
    (NOTES, "Clock probe"), and a peer timed in a separate burst reads 710-814 TFLOP/s between calls."""
    ga, gb = capture_graph(fn, fn_calls), capture_graph(peer, peer_calls)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    ta, tb = [], []
    for _ in range(reps):
        ev[0].record()
        ga.replay()
        ev[1].record()
        gb.replay()
        ev[2].record()
        ev[2].synchronize()
        ta.append(ev[0].elapsed_time(ev[1]) / 1e3 / fn_calls)
        tb.append(ev[1].elapsed_time(ev[2]) / 1e3 / peer_calls)
    return statistics.median(ta), statistics.median(tb)


_LIBS: dict[str, object] = {}


@contextlib.contextmanager
def other_library(path: str) -> Iterator[None]:
    """Route the ops' C calls to another build of libddtree (e.g. main's previous kernel) for the block, so
    that two builds are timed in one process on the same inputs (--ab-lib). ctypes loads each library
    RTLD_LOCAL: both sets of kernels live side by side in the one CUDA context."""
    import ctypes

    lib = _LIBS.get(path)
    if lib is None:
        lib = ctypes.CDLL(path)
        for name, res, args in (("ddtree_last_error", ctypes.c_char_p, []),
                                ("ddtree_status_string", ctypes.c_char_p, [ctypes.c_int]),
                                ("ddtree_build_info", ctypes.c_char_p, []),
                                ("ddtree_check_device", ctypes.c_int, [])):
            getattr(lib, name).restype = res
            getattr(lib, name).argtypes = args
        _LIBS[path] = lib
    saved = (_lib._lib, _lib._lib_path, dict(_lib._functions))
    _lib._lib, _lib._lib_path = lib, Path(path)
    _lib._functions.clear()
    try:
        yield
    finally:
        _lib._lib, _lib._lib_path = saved[0], saved[1]
        _lib._functions.clear()
        _lib._functions.update(saved[2])


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (outputs of the same inputs; a sanity check, the tests do correctness)."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


def ddtree_like_parents(n: int, gen: torch.Generator, max_depth: int = 15) -> list[int]:
    """Random tree with depth <= max_depth, wide near the root like a DDTree."""
    par, depth = [-1], [0]
    for i in range(1, n):
        while True:
            p = int(torch.randint(max(0, i - 24), i, (1,), generator=gen)) if torch.rand(1, generator=gen) < 0.6 \
                else int(torch.randint(0, i, (1,), generator=gen))
            if depth[p] < max_depth:
                break
        par.append(p)
        depth.append(depth[p] + 1)
    return par


def run_shape(hq: int, hkv: int, n: int, ctx: int, bw: float, rate: float, impls: list[str], *,
              use_flex: bool = True, use_sdpa: bool = True, page: int = 16, d: int = 128,
              ab: bool = False, ab_libs: dict[str, str] | None = None,
              peer: Callable[[], object] | None = None, ab_rounds: int = 0, model_pred: str | None = None,
              inputs_ready: bool = False) -> dict:
    gen = torch.Generator().manual_seed(hq * 1000 + n + ctx)
    parents = torch.tensor([ddtree_like_parents(n, gen)])
    anc = ref.anc_from_parents(parents).cuda()
    vis_tree = ref.unpack_bits(anc[0].cpu(), n).cuda()
    length = ctx + n
    pages = math.ceil(length / page)
    kv_bytes = length * hkv * d * 2 * 2
    sets = max(1, min(4, math.ceil(256e6 / kv_bytes)))
    dev = "cuda"
    qs, kcs, vcs, bts, kds, vds = [], [], [], [], [], []
    for _ in range(sets):
        q = torch.randn(n, hq, d, dtype=torch.bfloat16, device=dev)
        kc = torch.randn(pages + 1, page, hkv, d, dtype=torch.bfloat16, device=dev)
        vc = torch.randn_like(kc)
        bt = torch.randperm(pages + 1, device=dev)[:pages].to(torch.int32).view(1, -1)
        slots = torch.arange(length, device=dev)
        kd = kc[bt[0].long()[slots // page], slots % page]  # [L, Hkv, D]
        vd = vc[bt[0].long()[slots // page], slots % page]
        qs.append(q), kcs.append(kc), vcs.append(vc), bts.append(bt)
        kds.append(kd.permute(1, 0, 2).unsqueeze(0).contiguous())  # [1, Hkv, L, D]
        vds.append(vd.permute(1, 0, 2).unsqueeze(0).contiguous())
    indptr = torch.tensor([0, n], dtype=torch.int32, device=dev)
    ctx_t = torch.tensor([ctx], dtype=torch.int32, device=dev)
    scale = 1.0 / math.sqrt(d)
    mask = torch.cat([torch.ones(n, ctx, dtype=torch.bool, device=dev), vis_tree], 1)  # [N, L]

    i_ours = [0]

    # --model-predecessor: before each call, the kernel a model layer runs right before attention (the tree's K
    # rows written into the paged cache by index_copy_; here the values already there, so outputs don't move).
    # Then the fa3 grid follows a torch kernel, which never triggers PDL dependents early, instead of the
    # previous call's merge kernel: what v18's launch overlap is worth inside a layer (times include the copy).
    tree_slots = [bts[j][0].long()[torch.arange(ctx, length, device=dev) // page] * page
                  + torch.arange(ctx, length, device=dev) % page for j in range(sets)]
    tree_k = [kcs[j].view(-1, hkv, d)[tree_slots[j]].clone() for j in range(sets)]
    # --model-predecessor qkv_prep: the model's real fused predecessor (session 10), a PDL kernel that triggers its
    # dependents at entry: qkv_prep of a QKV row [q | the tree's K rows | its V rows] with cos = 1, sin = 0 (RoPE
    # is then x exactly), so it writes q (a fresh tensor, what attention then reads) and the cache rows already
    # there: outputs don't move. Both ours and SDPA read that q (times include qkv_prep), and ours passes
    # inputs_ready=True as the model does (qkv_prep writes none of qo_indptr, ctx_len, block table, anc).
    if model_pred == "qkv_prep":
        from ddtree_engine.ops import qkv_prep

        qkv_rows = [torch.cat([qs[j].reshape(n, -1), tree_k[j].reshape(n, -1),
                               vcs[j].view(-1, hkv, d)[tree_slots[j]].reshape(n, -1)], 1).contiguous()
                    for j in range(sets)]
        rope_cos = torch.ones(n, d, dtype=torch.bfloat16, device=dev)
        rope_sin = torch.zeros(n, d, dtype=torch.bfloat16, device=dev)
        inputs_ready = True

    def layer_q(i: int) -> torch.Tensor:
        """q of call i after the model predecessor, if any, has run."""
        if model_pred == "qkv_prep":
            return qkv_prep(qkv_rows[i], rope_cos, rope_sin, tree_slots[i], kcs[i], vcs[i])
        if model_pred == "index_copy":
            kcs[i].view(-1, hkv, d).index_copy_(0, tree_slots[i], tree_k[i])
        return qs[i]

    def ours():
        i = i_ours[0] = (i_ours[0] + 1) % sets
        return tree_attention(layer_q(i), kcs[i], vcs[i], indptr, bts[i], ctx_t, anc, scale,
                              inputs_ready=inputs_ready)

    row = {"hq": hq, "hkv": hkv, "n": n, "ctx": ctx}
    flops = 4.0 * n * length * d * hq
    bytes_ = kv_bytes + 2 * n * hq * d * 2
    row["floor_us"] = max(bytes_ / bw, flops / rate) * 1e6
    default = ta_ops.impl_for(d)
    outs = {}
    for name in dict.fromkeys([*impls, default]):  # the default is always timed (it is "ours")
        ta_ops.set_impl(name)
        row[f"{name}_us"] = graph_time(ours) * 1e6
        outs[name] = tree_attention(qs[0], kcs[0], vcs[0], indptr, bts[0], ctx_t, anc, scale)[0]
    ta_ops.set_impl("auto")
    if peer is not None:
        # v11 floor methodology: the matmul peer timed interleaved with the default back end, both graphs
        # of about equal length, so the FLOP rate is read under the same power state as the kernel.
        t_ours = row[f"{default}_us"] * 1e-6
        t_gemm = 2 * GEMM_N**3 / rate
        fn_calls = max(10, math.ceil(t_gemm / t_ours))
        peer_calls = max(1, round(fn_calls * t_ours / t_gemm))
        t_il, t_peer = interleaved_time(ours, fn_calls, peer, peer_calls)
        row["rate_il"] = 2 * GEMM_N**3 / t_peer
        row["ours_il_us"] = t_il * 1e6
        row["floor_il_us"] = max(bytes_ / bw, flops / row["rate_il"]) * 1e6
        row["il_calls"] = [fn_calls, peer_calls]
    for name, path in (ab_libs or {}).items():
        # The same inputs through another build of the library (e.g. main's kernel), same process.
        with other_library(path):
            row[f"{name}_us"] = graph_time(ours) * 1e6
            o_ab = tree_attention(qs[0], kcs[0], vcs[0], indptr, bts[0], ctx_t, anc, scale)[0]
        row[f"{name}_bits_equal"] = bool(torch.equal(o_ab.view(torch.int16), outs[default].view(torch.int16)))
        row[f"{name}_rel_diff"] = rel_diff(o_ab, outs[default])
    def ours_us() -> float:
        return graph_time(ours) * 1e6

    if ab_libs and ab_rounds > 0:
        # This build and each --ab-lib build timed in alternation, ab_rounds rounds, medians: the card's power
        # state drifts within a shape's timings (NOTES v11), and alternation spreads the drift over all builds.
        libs = {"this": contextlib.nullcontext, **{n: (lambda p=p: other_library(p)) for n, p in ab_libs.items()}}
        for name, us in alternate(libs, ours_us, ab_rounds).items():
            row[f"alt_{name}_us"] = us
    if ab and default == "fa3":
        # The default back end again with each launch switch of fa3 v10 flipped (the launcher's per-call
        # environment switches: fused merge on, lazy mask wait off, balanced chunks), same inputs and process.
        for name, env in FA3_AB.items():
            with scoped_env(env):
                row[f"{name}_us"] = graph_time(ours) * 1e6
                o_ab = tree_attention(qs[0], kcs[0], vcs[0], indptr, bts[0], ctx_t, anc, scale)[0]
                row[f"{name}_bits_equal"] = bool(torch.equal(o_ab.view(torch.int16), outs[default].view(torch.int16)))
                row[f"{name}_rel_diff"] = rel_diff(o_ab, outs[default])
        if ab_rounds > 0:
            # The default and each switch timed in alternation, ab_rounds rounds, medians (as for --ab-lib:
            # the power state drifts within a shape's timings, alternation spreads it over every variant).
            envs = {"fa3": contextlib.nullcontext, **{n: (lambda e=e: scoped_env(e)) for n, e in FA3_AB.items()}}
            for name, us in alternate(envs, ours_us, ab_rounds).items():
                row[f"altenv_{name}_us"] = us
    row["default_impl"] = default
    row["ours_us"] = row[f"{default}_us"]
    o_ours = outs[default]
    for name in outs:
        if name != default:
            row[f"rel_diff_{name}_vs_{default}"] = rel_diff(outs[name], o_ours)

    qd = [q.permute(1, 0, 2).unsqueeze(0) for q in qs]  # [1, Hq, N, D] (strided view is fine for SDPA)
    i_sdpa = [0]

    def sdpa():
        i = i_sdpa[0] = (i_sdpa[0] + 1) % sets
        q_i = layer_q(i).permute(1, 0, 2).unsqueeze(0) if model_pred == "qkv_prep" else qd[i]
        return torch.nn.functional.scaled_dot_product_attention(
            q_i, kds[i], vds[i], attn_mask=mask, scale=scale, enable_gqa=True)

    try:
        if not use_sdpa:
            raise RuntimeError("skipped in this pass")
        o_sdpa = torch.nn.functional.scaled_dot_product_attention(  # input set 0, as o_ours
            qd[0], kds[0], vds[0], attn_mask=mask, scale=scale, enable_gqa=True)
        row["sdpa_us"] = graph_time(sdpa) * 1e6
        row["rel_diff_vs_sdpa"] = rel_diff(o_ours, o_sdpa[0].permute(1, 0, 2))
    except Exception as exc:  # noqa: BLE001 - report, keep going
        row["sdpa_us"] = None
        row["sdpa_error"] = f"{type(exc).__name__}: {exc}"[:200]

    if not use_flex:
        row["flex_us"] = None
        row["flex_error"] = "skipped (--no-flex)"
        return row
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
        vis = vis_tree

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx < ctx) | vis[q_idx, (kv_idx - ctx).clamp(min=0)]

        bm = create_block_mask(mask_mod, 1, 1, n, length, device=dev)
        i_flex = [0]

        def flex_call():
            i = i_flex[0] = (i_flex[0] + 1) % sets
            return flex(qd[i], kds[i], vds[i], block_mask=bm, scale=scale, enable_gqa=True)

        t0 = time.time()
        o_flex = flex(qd[0], kds[0], vds[0], block_mask=bm, scale=scale, enable_gqa=True)  # input set 0
        torch.cuda.synchronize()
        row["flex_compile_s"] = round(time.time() - t0, 1)
        row["flex_us"] = graph_time(flex_call) * 1e6
        row["rel_diff_vs_flex"] = rel_diff(o_ours, o_flex[0].permute(1, 0, 2))
    except Exception as exc:  # noqa: BLE001
        row["flex_us"] = None
        row["flex_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return row


def print_table(rows: list[dict], impls: list[str]) -> None:
    """One line per shape: every back end's time and its ratio to the floor, then the torch peers as
    speed-ups of each back end (peer time / back-end time: > 1 means ours is faster)."""
    cols = ["Hq/Hkv", "N", "C", "floor µs"] + [f"{i} µs" for i in impls] + [f"{i}/floor" for i in impls]
    cols += ["SDPA mask µs"] + [f"SDPA/{i}" for i in impls] + ["flex µs"] + [f"flex/{i}" for i in impls]
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        cells = [f"{r['hq']}/{r['hkv']}", str(r["n"]), f"{r['ctx'] // 1024}k", f"{r['floor_us']:.1f}"]
        cells += [f"{r[f'{i}_us']:.1f}" for i in impls]
        cells += [f"{r[f'{i}_us'] / r['floor_us']:.2f}" for i in impls]
        for peer in ("sdpa", "flex"):
            t = r.get(f"{peer}_us")
            cells.append(f"{t:.1f}" if t else ("failed" if peer == "sdpa" else "n/a"))
            cells += [f"{t / r[f'{i}_us']:.2f}x" if t else "-" for i in impls]
        print("| " + " | ".join(cells) + " |", flush=True)
    if any("rate_il" in r for r in rows):
        print("\nFloor with the matmul peer interleaved with the default back end (same power state; see "
              "interleaved_time):\n\n| Hq/Hkv | N | C | matmul TFLOP/s (il) | floor µs (il) | ours µs (il) | "
              "ours/floor (il) | ours/floor (burst rate) | graphs (calls ours / GEMMs) |\n|" + "---|" * 9)
        for r in rows:
            if "rate_il" not in r:
                continue
            print(f"| {r['hq']}/{r['hkv']} | {r['n']} | {r['ctx'] // 1024}k | {r['rate_il'] / 1e12:.0f} | "
                  f"{r['floor_il_us']:.1f} | {r['ours_il_us']:.1f} | {r['ours_il_us'] / r['floor_il_us']:.2f} | "
                  f"{r['ours_us'] / r['floor_us']:.2f} | {r['il_calls'][0]} / {r['il_calls'][1]} |", flush=True)


_PROBE = r"""
import sys, torch
sys.path.insert(0, {python!r})
import ddtree_engine.ops
from ddtree_engine.ops import tree_attention
from ddtree_engine.reference import tree_attention as _r
ref = sys.modules["ddtree_engine.reference.tree_attention"]
ops = sys.modules["ddtree_engine.ops.tree_attention"]
torch.manual_seed(0)
n, ctx, page, hq, hkv, d = 96, 3000, 16, 8, 1, 128
par = torch.tensor([[-1] + [max(0, i - 1 - (i % 3)) for i in range(1, n)]])
anc = ref.anc_from_parents(par).cuda()
pages = (ctx + n + page - 1) // page
kc = torch.randn(pages, page, hkv, d, dtype=torch.bfloat16, device="cuda")
vc = torch.randn_like(kc)
bt = torch.arange(pages, dtype=torch.int32, device="cuda").view(1, -1)
q = torch.randn(n, hq, d, dtype=torch.bfloat16, device="cuda")
args = (q, kc, vc, torch.tensor([0, n], dtype=torch.int32, device="cuda"), bt,
        torch.tensor([ctx], dtype=torch.int32, device="cuda"), anc, d ** -0.5)
ops.set_impl({impl!r})
o, lse = tree_attention(*args, kv_chunk=1024)
torch.cuda.synchronize()
o_ref, _ = ref.tree_attention(*[a.cpu() if torch.is_tensor(a) else a for a in args])
err = float((o.float().cpu() - o_ref).abs().max() / o_ref.abs().max())
print(f"probe {impl}: max rel err {{err:.2e}}")
sys.exit(0 if err < 2e-2 else 1)
"""


def probe(impl: str) -> bool:
    """Run one small case on back end `impl` in a child process (a hang or a trap there cannot take
    this process's CUDA context down) and check it against the reference."""
    import subprocess

    code = _PROBE.format(python=str(Path(__file__).resolve().parents[1] / "python"), impl=impl)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        print(f"probe {impl}: timed out; not timing it", flush=True)
        return False
    out = (proc.stdout + proc.stderr).strip().splitlines()
    print(out[-1] if out else f"probe {impl}: no output", flush=True)
    return proc.returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="only the 4k-context shapes")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--impls", default="", help="comma list of back ends to time (default: all available)")
    ap.add_argument("--ab", action="store_true", help="also time the default fa3 back end with each launch "
                    "switch flipped (fused merge on, lazy mask wait off, balanced chunks; the launcher's per-call "
                    "environment switches)")
    ap.add_argument("--ab-only", default="", help="comma list of --ab switches to time (default: all of FA3_AB)")
    ap.add_argument("--ab-lib", action="append", default=[], metavar="NAME=PATH",
                    help="also time the default back end of another libddtree build (e.g. main's) on the same "
                    "inputs in this process, and check its bits against this build's (repeatable)")
    ap.add_argument("--ab-rounds", type=int, default=None, help="also time this build and the --ab-lib builds (and, "
                    "with --ab, the default and each --ab switch) in alternation, this many rounds, and print the "
                    "medians (default 3 with --ab or --ab-lib, else 0)")
    ap.add_argument("--shapes", default="", help="comma list of shapes to run, e.g. 8/1x512x4k,64/8x512x64k "
                    "(default: all)")
    ap.add_argument("--interleaved-floor", action="store_true", help="also time the matmul peer interleaved "
                    "with the default back end per shape (same power state) and print the floor from that rate")
    ap.add_argument("--flex-nodes", default="", help="comma list of node counts to run flex_attention at "
                    "(default: all; it has never compiled at 64 nodes here, and each attempt is slow)")
    ap.add_argument("--model-predecessor", nargs="?", const="index_copy", default=None,
                    choices=["index_copy", "qkv_prep"],
                    help="time each call of ours after a model layer's kernel before attention (times include it): "
                    "index_copy (the default when no value is given) = an index_copy_ of the tree's K rows into the "
                    "cache, ours only; qkv_prep = the fused qkv_prep op writing q and the tree's K/V rows, before "
                    "ours (with inputs_ready=True) and before SDPA")
    ap.add_argument("--inputs-ready", action="store_true", help="call ours with inputs_ready=True (fa3 reads "
                    "qo_indptr, ctx_len, the block table and the bitset before its PDL wait; true here: no call of "
                    "ours writes them)")
    ap.add_argument("--flex-hq", default="", help="comma list of query-head counts to run flex_attention at "
                    "(default: all)")
    args = ap.parse_args()
    torch.manual_seed(0)
    bw, rate = measure_ceilings()
    impl = os.environ.get("DDTREE_TREE_ATTENTION_IMPL", "default (wgmma on sm_90a builds)")
    impls = args.impls.split(",") if args.impls else ta_ops.available_impls(128)
    impls = [i for i in impls if ta_ops.impl_available(i, 128)]
    # The fa3 back end is new: time it only if a small case in a child process comes out right.
    impls = [i for i in impls if i != "fa3" or probe(i)]
    print(f"device {torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s;"
          f" env impl {impl}, default back end {ta_ops.impl_for(128)}; timing back ends {impls}", flush=True)
    shapes = [(hq, hkv, n, ctx) for hq, hkv in ((8, 1), (64, 8)) for n in (64, 512)
              for ctx in ((4096,) if args.quick else (4096, 65536))]
    if args.shapes:
        shapes = [sh for sh in shapes if f"{sh[0]}/{sh[1]}x{sh[2]}x{sh[3] // 1024}k" in args.shapes.split(",")]

    def save(rows: list[dict]) -> None:
        if args.json:
            args.json.write_text(json.dumps({"copy_Bps": bw, "bf16_flops": rate, "impl": impl, "rows": rows},
                                            indent=1))

    # Pass 1: kernel + SDPA (fast). Pass 2: flex_attention, whose compiles are slow, shape by shape.
    ab_libs = dict(x.split("=", 1) for x in args.ab_lib)
    if args.ab_rounds is None:  # A/B columns are read from alternating rounds only (session 12's final run)
        args.ab_rounds = 3 if (args.ab or ab_libs) else 0
    if args.ab_only:
        for name in [n for n in FA3_AB if n not in args.ab_only.split(",")]:
            del FA3_AB[name]
    peer = matmul_peer() if args.interleaved_floor else None
    rows = []
    for hq, hkv, n, ctx in shapes:
        rows.append(run_shape(hq, hkv, n, ctx, bw, rate, impls, use_flex=False, ab=args.ab, ab_libs=ab_libs,
                              peer=peer, ab_rounds=args.ab_rounds, model_pred=args.model_predecessor,
                              inputs_ready=args.inputs_ready))
        print(json.dumps(rows[-1]), flush=True)
    save(rows)
    print_table(rows, impls)
    if args.ab or ab_libs:
        print_ab(rows, ab_libs)
        print_alt(rows, ab_libs)
        print_alt_env(rows)
    if args.no_flex:
        return
    # N=512 first: flex compiled there in earlier measurements; N=64 may fail to compile (inductor).
    flex_nodes = {int(x) for x in args.flex_nodes.split(",") if x}
    flex_hq = {int(x) for x in args.flex_hq.split(",") if x}
    for k in sorted(range(len(shapes)), key=lambda i: -shapes[i][2]):
        hq, hkv, n, ctx = shapes[k]
        if (flex_nodes and n not in flex_nodes) or (flex_hq and hq not in flex_hq):
            rows[k]["flex_error"] = "skipped (--flex-nodes / --flex-hq)"
            continue
        row = run_shape(hq, hkv, n, ctx, bw, rate, impls, use_flex=True, use_sdpa=False)
        for key in ("sdpa_us", "sdpa_error", "rel_diff_vs_sdpa", "rate_il", "ours_il_us", "floor_il_us", "il_calls"):
            if key in rows[k]:
                row[key] = rows[k][key]
        row.pop("sdpa_error", None) if row.get("sdpa_us") else None
        for key, val in rows[k].items():  # pass 1's A/B and interleaved-floor fields
            row.setdefault(key, val)
        for name in impls:
            row[f"{name}_us_pass1"] = rows[k][f"{name}_us"]
        rows[k] = row
        print(json.dumps(row), flush=True)
        save(rows)
    print_table(rows, impls)


if __name__ == "__main__":
    main()
