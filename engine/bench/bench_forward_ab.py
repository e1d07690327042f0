"""The fast path's target forward against the pre-session-9 fast mode (DDTREE_MODEL_FAST=0: the exact path's
layer functions in act_dtype, unfused) in ONE process, on the same weights: CUDA-graph replay medians of
forward_tree at tree shapes B x N, interleaved, and the two paths' logits against each other.

    PYTHONPATH=engine/python python3 engine/bench/bench_forward_ab.py --presets toy qwen3-0.6b

--ab logits (session 10): the same fused model with fp32 logits (the lm_head GEMM writing fp32, torch.mm out_dtype)
against bf16 logits (logits_dtype = act_dtype: the GEMM writing bf16), each captured into its own graph; prints the
times and how often the greedy token (argmax, ties to the lower id) of the bf16 logits differs from the fp32 one's,
and how many rows have a tie at the top in bf16.

--ab qkv_prep (session 10): the same fused model with the layer's RoPE + K/V cache write + q as one qkv_prep launch
(the default since session 10) against the torch sequence (DDTREE_QKV_PREP=0: flip/mul/addcmul RoPE, two
index_copy_, a q copy), each captured into its own graph; prints the times, the ratio, and the logits' difference.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_e2e import PRESETS, _graph, _time_batch  # noqa: E402
from ddtree_engine.backend import default_backend  # noqa: E402
from ddtree_engine.decode import chain_anc  # noqa: E402
from ddtree_engine.model import ModelConfig, TinyTransformer, random_weights  # noqa: E402
from ddtree_engine.paged_kv import PagedKVCache  # noqa: E402


def build(preset: str, fast: bool) -> TinyTransformer:
    p = PRESETS[preset]
    cfg = ModelConfig(**p["cfg"])  # type: ignore[arg-type]
    act: torch.dtype = p["act"]  # type: ignore[assignment]
    w = random_weights(cfg, 0) if act == torch.float32 else random_weights(cfg, 0, device="cuda", dtype=act)
    os.environ["DDTREE_MODEL_FAST"] = "1" if fast else "0"  # read at construction
    try:
        return TinyTransformer(cfg, w, device="cuda", exact=False, act_dtype=act, kv_dtype=torch.bfloat16)
    finally:
        os.environ.pop("DDTREE_MODEL_FAST", None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="+", default=["toy", "qwen3-0.6b"], choices=sorted(PRESETS))
    ap.add_argument("--shapes", nargs="+", default=["1x17", "8x65"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ab", choices=["fast", "logits", "qkv_prep"], default="fast",
                    help="fast: fused vs unfused forward; logits: fp32 vs act-dtype logits of the fused forward; "
                         "qkv_prep: the fused forward with and without the qkv_prep op")
    args = ap.parse_args()
    be = default_backend("cuda")
    for preset in args.presets:
        if args.ab == "fast":
            models = {"fused": build(preset, True), "unfused": build(preset, False)}
            assert models["fused"].fast and not models["unfused"].fast
            dtypes = {"fused": None, "unfused": None}
        elif args.ab == "logits":
            m = build(preset, True)
            models = {"fp32 logits": m, "bf16 logits": m}
            dtypes = {"fp32 logits": torch.float32, "bf16 logits": m.act_dtype}
        else:
            m = build(preset, True)
            m.qkv_prep = True
            assert m._fused_qkv_prep(be) is not None, f"{preset}: the fast path would not use qkv_prep"
            models = {"qkv_prep": m, "torch qkv": m}
            dtypes = {"qkv_prep": None, "torch qkv": None}
        prep = {"qkv_prep": True, "torch qkv": False}
        cfg = next(iter(models.values())).cfg
        for shape in args.shapes:
            B, N = map(int, shape.split("x"))
            cache = PagedKVCache(n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, slots=B,
                                 max_slot_tokens=128 + N, dtype=torch.bfloat16, device="cuda")
            g = torch.Generator(device="cuda").manual_seed(B * 1000 + N)
            for k in cache.k + cache.v:  # random committed K/V (never time on zeros)
                k.normal_(generator=g)
            tokens = torch.randint(0, cfg.vocab_size, (B, N), device="cuda", dtype=torch.int32, generator=g)
            ctx = torch.full((B,), 128, device="cuda", dtype=torch.int32)
            pos = (ctx[:, None] + torch.arange(N, device="cuda", dtype=torch.int32)[None]).contiguous()
            anc = chain_anc(N, "cuda").expand(B, -1, -1).contiguous()
            outs, graphs = {}, {}
            for name, m in models.items():
                if dtypes[name] is not None:
                    m.logits_dtype = dtypes[name]  # read when the forward runs / is captured
                if name in prep:
                    m.qkv_prep = prep[name]  # read when the forward runs / is captured
                with torch.inference_mode():
                    outs[name] = m.forward_tree(be, cache.k, cache.v, cache.block_table, tokens, pos, ctx, anc)[0]
                graphs[name] = _graph(lambda m=m: m.forward_tree(be, cache.k, cache.v, cache.block_table, tokens,
                                                                 pos, ctx, anc))
            times: dict[str, list[float]] = {n: [] for n in graphs}
            reps = 20 if preset == "toy" else 5
            for _ in range(args.rounds):
                for name, gr in graphs.items():
                    gr.replay()  # type: ignore[attr-defined]
                    times[name].append(_time_batch(gr, reps))
            if args.ab == "logits":
                (na, nb), (xa, xb) = list(times), list(outs.values())
                ta, tb = (statistics.median(times[n]) * 1e6 for n in (na, nb))
                top2 = xb.float().topk(2, dim=-1).values
                ties = int((top2[..., 0] == top2[..., 1]).sum())
                differ = int((xa.argmax(-1) != xb.argmax(-1)).sum())
                print(f"{preset} B {B} x N {N}: {na} {ta:8.1f} us, {nb} {tb:8.1f} us -> {nb}/{na} {tb / ta:.3f}x; "
                      f"greedy token differs in {differ} of {B * N} rows, bf16 top-1 tied in {ties} "
                      f"(logits dtypes {xa.dtype} / {xb.dtype})", flush=True)
                del graphs, cache
                continue
            if args.ab == "qkv_prep":
                xa, xb = outs["qkv_prep"].double(), outs["torch qkv"].double()
                rel = float((xa - xb).norm() / xb.norm())
                agree = float((xa.argmax(-1) == xb.argmax(-1)).float().mean())
                ta, tb = (statistics.median(times[n]) * 1e6 for n in ("qkv_prep", "torch qkv"))
                print(f"{preset} B {B} x N {N}: qkv_prep {ta:8.1f} us, torch qkv {tb:8.1f} us -> "
                      f"torch/qkv_prep {tb / ta:.3f}x ({(tb - ta) / cfg.n_layers:.2f} us per layer); logits "
                      f"relative {rel:.2e}, argmax agreement {agree:.3f}", flush=True)
                del graphs, cache
                continue
            a, b = outs["fused"].double(), outs["unfused"].double()
            rel = float((a - b).norm() / b.norm())
            agree = float((outs["fused"].argmax(-1) == outs["unfused"].argmax(-1)).float().mean())
            tf, tu = (statistics.median(times[n]) * 1e6 for n in ("fused", "unfused"))
            print(f"{preset} B {B} x N {N}: fused {tf:8.1f} us, unfused (DDTREE_MODEL_FAST=0) {tu:8.1f} us -> "
                  f"unfused/fused {tu / tf:.2f}x; logits fused vs unfused: relative {rel:.2e}, argmax agreement "
                  f"{agree:.3f}", flush=True)
            del graphs, cache
        del models
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
