"""End-to-end DDTree vs autoregressive decoding (GPU, all five kernels, CUDA graphs).

    PYTHONPATH=engine/python python3 engine/bench/bench_e2e.py [--preset toy|qwen3-0.6b|qwen3-1.7b] [--batch 1 8]
        [--budgets 16 64] [--agree 0.8] [--cupti]

--preset picks the target (PRESETS in _e2e_models.py: the 2-layer toy, or Qwen3-0.6B / 1.7B shapes with bf16 weights drawn on
the GPU); without it the model args give the shape (fp32 linears, bf16 K/V). On the GPU the distilled drafter is
TinyDrafter at the target's width trained by `distill_drafter_batched`; the process also measures the copy rate and
prints each forward's time against its weight-byte floor; --cupti adds the CUPTI round profile of every DDTree row.

For each batch size: budget-0 decoding through the same engine (the AR peer, one target forward per
token), then DDTree at each budget with a drafter that agrees with the target's greedy continuation at a
seeded fraction of positions (NoisyOracleDrafter; a random-weight drafter would never agree with a
random-weight target), and with the engine's TinyDrafter distilled on the target's own outputs
(`distill_drafter`). Prints tokens/s, the ratio to AR measured in the same run, the mean acceptance
length (new tokens per request-round), and the share of a round spent outside the two model forwards
(drafter + target): round time minus the time of one graph holding the drafter call and the target forward
back to back on the same static inputs (so the seams between kernels count on both sides), medians of
interleaved batches of replays timed with CUDA events. The older figure, round minus separately captured
drafter and target graphs, is printed beside it. --finish fused split compares the round tails (A/B);
--variants s5 s6 compares the session-5 engine kernels with session 6's small-vocabulary ones (the small-row
draft_topk_lse and the one-CTA tree_accept inside round_finish), each captured into its own graph in this
process (the library reads both switches on every call).
--logits fp32 act (session 10) runs each batch twice in one process: the target's logits and the noisy drafter's
in fp32 (session 9's configuration) and in the model's act_dtype (bf16 presets: the lm_head GEMMs write bf16,
tree_accept and draft_topk_lse read bf16), each with its own AR peer (same logits dtype).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ROUND_REPS = 20  # each replay of the whole round commits up to L + 1 tokens: leave room in the context

from ddtree_engine.backend import OpBackend, cuda_backend, default_backend, mixed_backend
from ddtree_engine.decode import DDTreeEngine, Request
from ddtree_engine.drafter import NoisyOracleDrafter, TinyDrafter, distill_drafter, distill_drafter_batched
from ddtree_engine.model import TinyTransformer

from _e2e_models import PRESETS, add_model_args, build_model, model_config  # noqa: F401 (PRESETS: bench_forward_ab.py)
from _e2e_variants import VARIANTS, set_variant


def _graph(fn: object) -> object:
    """A replayable form of fn: a CUDA graph on GPU; fn itself on CPU (smoke runs of this script)."""
    if not torch.cuda.is_available():
        return type("Eager", (), {"replay": staticmethod(lambda: fn())})()  # type: ignore[operator]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(s):
        for _ in range(2):
            fn()  # type: ignore[operator]
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(g):
        fn()  # type: ignore[operator]
    return g


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time_replay(g: object, reps: int = 200) -> float:
    for _ in range(3):
        g.replay()  # type: ignore[attr-defined]
    _sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        g.replay()  # type: ignore[attr-defined]
    _sync()
    return (time.perf_counter() - t0) / reps


def _time_batch(g: object, reps: int) -> float:
    """Seconds per replay over `reps` back-to-back replays (CUDA events on GPU: GPU time, not host time)."""
    if not torch.cuda.is_available():
        return _time_replay(g, reps)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()  # type: ignore[attr-defined]
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / reps


STATE = ("ctx_len", "root", "hidden", "out_len", "active", "live_budget")


def sleep_us(us: float) -> None:
    torch.cuda._sleep(int(us * 1980))  # ~1.98 GHz SM clock: cycles for `us` microseconds (approximate)


def fenced(graphs: dict[str, object], restore: dict[str, int], snap: dict[str, torch.Tensor], eng: DDTreeEngine,
           samples: int) -> dict[str, list[float]]:
    """GPU µs of single replays, each behind a ~60 µs sleep kernel (the host's graph launch overlaps the sleep, so
    the events bracket the graph alone); the graphs alternate replay by replay, so a drift of the clocks reaches
    every graph alike. `restore[name]` = r > 0: copy the snapshot state back before every r-th replay of name (1: every
    replay of the round sees the state the models graph sees)."""
    ev = {k: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(samples)]
          for k in graphs}
    for i in range(samples):
        for name, g in graphs.items():
            if restore.get(name) and i % restore[name] == 0:
                for k, v in snap.items():
                    getattr(eng, k).copy_(v)
            sleep_us(60)
            a, b = ev[name][i]
            a.record()
            g.replay()  # type: ignore[attr-defined]
            b.record()
    torch.cuda.synchronize()
    return {k: [a.elapsed_time(b) * 1e3 for a, b in v] for k, v in ev.items()}


def overhead_share(eng: DDTreeEngine, batches: int = 7) -> dict[str, float]:
    """Seconds per replay (medians over `batches` interleaved batches of ROUND_REPS replays, fewer for rounds
    over 0.5 ms) of: the round's
    graph; the drafter call and the target forward, each captured alone; and `models`, the drafter call
    followed by the target forward in ONE graph (the round with the engine ops taken out, seams included).
    Every slot active mid-generation; the state is restored before each batch of rounds, so every batch
    replays the same rounds. On CUDA also `paired_other` / `paired_round` (session 11): the median over 21 pairs of
    single round and models replays, alternating, each behind a sleep kernel (`fenced`), the round's state restored
    before every replay: no batch-start launch on one side only, no context growth inside a batch, and a clock drift
    between batches cancels in each pair's difference."""
    be, m = eng.be, eng.model
    budget = eng.budget.clone()
    drafts = eng.drafter.draft(eng.root, eng.hidden, eng.ctx_len)
    top_lp, top_id, _ = be.draft_topk_lse(drafts, eng.K)
    tree = be.build_tree(top_lp, top_id, eng.root, eng.ctx_len, budget, eng.n_max)
    ctx = eng.ctx_len.clone()  # the target-only graphs must not move the real context

    def draft() -> None:
        eng.drafter.draft(eng.root, eng.hidden, eng.ctx_len)

    def target() -> None:
        m.forward_tree(be, eng.cache.k, eng.cache.v, eng.cache.block_table, tree.node_token, tree.positions,
                       ctx, tree.anc)

    def models() -> None:
        draft()
        target()

    eng.max_new.fill_(1 << 30)
    snap = {k: getattr(eng, k).clone() for k in STATE}
    with torch.inference_mode():
        graphs = {"drafter": _graph(draft), "target": _graph(target), "models": _graph(models),
                  "round": eng._graph or _graph(eng._round)}
        times: dict[str, list[float]] = {k: [] for k in graphs}
        # Long rounds (large models: 5-25 ms) need fewer replays for the same precision; the small model
        # (~0.4 ms) keeps ROUND_REPS replays x `batches`.
        graphs["round"].replay()  # type: ignore[attr-defined]
        probe = _time_batch(graphs["round"], 1)
        for k, v in snap.items():
            getattr(eng, k).copy_(v)
        reps = max(3, min(ROUND_REPS, int(0.01 / max(probe, 1e-6))))
        batches = batches if probe < 2e-3 else min(batches, 3)
        for _ in range(batches):
            for name, g in graphs.items():
                if name == "round":
                    for k, v in snap.items():
                        getattr(eng, k).copy_(v)
                for _ in range(2):
                    g.replay()  # type: ignore[attr-defined]
                _sync()
                times[name].append(_time_batch(g, reps))
        out = {k: statistics.median(v) for k, v in times.items()}
        if torch.cuda.is_available():  # session 11: the paired figure (see fenced)
            f = fenced({"round": graphs["round"], "models": graphs["models"]}, {"round": 1}, snap, eng, 21)
            out["paired_other"] = statistics.median(r - m for r, m in zip(f["round"], f["models"])) * 1e-6
            out["paired_round"] = statistics.median(f["round"]) * 1e-6
    for k, v in snap.items():
        getattr(eng, k).copy_(v)
    return out


def leaf_stats(eng: DDTreeEngine, rounds: int = 2) -> str:
    """Session 13: the share of the round trees' rows that are leaves (rows the leaf mode of tree_accept does not
    read) and of walks ending on a leaf (the rows its second pass reads), over `rounds` eager rounds."""
    import dataclasses

    base, seen = eng.be, []

    def spy(logits: torch.Tensor, node_token: torch.Tensor, first_child: torch.Tensor, *a: object, **k: object):
        out = base.tree_accept(logits, node_token, first_child, *a, **k)
        seen.append((first_child.clone(), a[1].clone(), out.accept_nodes.clone(), out.accept_len.clone()))
        return out

    if eng.fused_finish:
        return "leaf stats: n/a (fused round tail)"
    eng.be = dataclasses.replace(base, tree_accept=spy)
    try:
        with torch.inference_mode():
            for _ in range(rounds):
                eng._round()
    finally:
        eng.be = base
    rows = leaves = walks = on_leaf = 0
    for fc, num, an, al in seen:
        idx = torch.arange(fc.shape[1], device=fc.device)[None]
        leaf = (fc == -1) & (idx > 0) & (idx < num[:, None].long())
        rows += int(num.sum())
        leaves += int(leaf.sum())
        end = an.gather(1, (al.long() - 1).clamp(min=0)[:, None])
        on_leaf += int(leaf.gather(1, end.long().clamp(min=0)).sum())
        walks += fc.shape[0]
    return (f"leaf stats over {len(seen)} rounds: leaf rows {leaves}/{rows} ({leaves / max(rows, 1):.1%}), "
            f"walks ending on a leaf {on_leaf}/{walks} ({on_leaf / max(walks, 1):.1%})")


def run(model: TinyTransformer, prompts: list[list[int]], tokens: int, budget: int, drafter: object,
        refs: list[list[int]], backend: OpBackend) -> tuple[list[list[int]], float, float, DDTreeEngine]:
    """Decode `tokens` new tokens for every prompt at once (one slot each). tok/s counts the decoding rounds
    only: every prompt is admitted (prefilled) first, then the clock runs over the rounds, each with its host
    read of the new tokens (what a server does per round), until every request is done."""
    L = drafter.block_len  # type: ignore[attr-defined]
    eng = DDTreeEngine(model, drafter, backend, slots=len(prompts), max_budget=budget,  # type: ignore[arg-type]
                       max_context=max(len(p) for p in prompts) + 2 * tokens + (ROUND_REPS + 8) * (L + 1))
    if DEV == "cuda" and backend.graph_safe:
        eng.capture_graph()

    def admit_all(n: int) -> None:
        for s, p in enumerate(prompts[:n]):
            if refs:
                drafter.set_reference(s, p + refs[s])  # type: ignore[attr-defined]
            eng.admit(s, Request(p, tokens, budget=budget))

    admit_all(1)  # warm-up (prefill paths, allocator)
    while not eng.idle():
        eng.step()
    admit_all(len(prompts))
    _sync()
    out: list[list[int]] = [[] for _ in prompts]
    lens: list[int] = []
    t0 = time.perf_counter()
    while not eng.idle():
        r = eng.step()
        for slot, toks in r.new_tokens.items():
            out[slot] += toks
            lens.append(len(toks))
    wall = time.perf_counter() - t0
    return out, sum(map(len, out)) / wall, sum(lens) / len(lens), eng


def round_time(eng: DDTreeEngine, batches: int = 5) -> float:
    """Seconds per replay of eng's captured round, every slot active (state restored per batch): the AR
    peer's round, which overhead_share does not take (it has no drafter call)."""
    eng.max_new.fill_(1 << 30)
    snap = {k: getattr(eng, k).clone() for k in STATE}
    ts = []
    with torch.inference_mode():
        for _ in range(batches):
            for k, v in snap.items():
                getattr(eng, k).copy_(v)
            eng._graph.replay()  # type: ignore[union-attr]
            _sync()
            ts.append(_time_batch(eng._graph, 10))
    for k, v in snap.items():
        getattr(eng, k).copy_(v)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--budgets", type=int, nargs="+", default=[7, 16, 64])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--agree", type=float, default=0.8)
    ap.add_argument("--block", type=int, default=16, help="drafter block size (L = block - 1)")
    ap.add_argument("--distill-steps", type=int, default=400, help="training steps of the distilled drafter")
    ap.add_argument("--distill-seqs", type=int, default=128,
                    help="prompts decoded at once (budget-0 engine) for the distilled drafter's data (GPU)")
    ap.add_argument("--distill-tokens", type=int, default=128, help="greedy tokens per distillation prompt (GPU)")
    add_model_args(ap)
    ap.add_argument("--finish", nargs="+", default=[""], choices=["", "fused", "split"],
                    help="round tail: fused (round_finish, one launch), split (tree_accept + kv_commit + "
                         "round_update + the budget mask: the session-4 path), or '' (the engine's default); "
                         "several: an A/B in one run")
    ap.add_argument("--variants", nargs="+", default=["default"], choices=sorted(VARIANTS),
                    help="engine-kernel variants (VARIANTS): several give an A/B in one process")
    ap.add_argument("--kinds", nargs="+", default=["noisy", "distilled"], choices=["noisy", "distilled"],
                    help="drafters to run (distilled trains a drafter first)")
    ap.add_argument("--cupti", action="store_true",
                    help="also profile every DDTree row's round under CUPTI (profile/e2e_round_profile.py) in this "
                         "process: the engine ops kernel by kernel and 'other' as round span minus the models "
                         "graph's span")
    ap.add_argument("--cupti-reps", type=int, default=12)
    ap.add_argument("--leaf-stats", action="store_true",
                    help="after each measurement, the trees' leaf rows and walks ending on a leaf (eager rounds)")
    ap.add_argument("--logits", nargs="+", default=["act"], choices=["act", "fp32"],
                    help="dtype of the target's logits and of the noisy drafter's (act = the model's act_dtype: bf16 "
                         "on the qwen3 presets); several: a before/after in one process, each with its own AR peer")
    ap.add_argument("--exact", action="store_true",
                    help="GPU: the lossless tests' numerics instead of the fast path (model in exact mode, fp64 "
                         "accumulation; attention through the PyTorch reference, since the kernel is bf16 only; no "
                         "CUDA graphs, no round-time split). Checks that DDTree reproduces AR on this model: a "
                         "correctness run, its tok/s are not the engine's speed")
    args = ap.parse_args()
    torch.manual_seed(0)
    if DEV == "cpu":
        torch.set_num_threads(1)
    backend = default_backend(DEV)
    t_init = time.perf_counter()
    if DEV == "cuda" and args.exact:
        from ddtree_engine.reference.tree_attention import tree_attention as reference_attention

        cfg = model_config(args)
        model = TinyTransformer.random(cfg, seed=0, device="cuda")
        backend = mixed_backend("cuda+ref-attention", cuda_backend(), tree_attention=reference_attention)
        name, dffn = torch.cuda.get_device_name() + " (exact mode, reference attention, no graphs)", 128
    else:
        model, dffn = build_model(args, DEV)
        cfg = model.cfg
        name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (reference ops, no graphs: smoke run only)"
    _sync()
    how = ("the GEMM's own" if model.act_dtype == torch.float32 else "straight from the lm_head GEMM (torch.mm out_dtype)"
           if getattr(model, "_mm_f32", False) else "by a cast after a bf16 GEMM")
    print(f"model: {cfg}  act {model.act_dtype}  (built in {time.perf_counter() - t_init:.2f} s); fp32 logits: {how}\n"
          f"device: {name}  L={args.block - 1} agree={args.agree}")
    bw = 0.0
    if DEV == "cuda" and not args.exact:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _timing import copy_bandwidth

        bw = copy_bandwidth(1 << 30)
        wb = model.fast_weight_bytes()
        print(f"copy bandwidth (read + write, this process): {bw / 1e12:.2f} TB/s; target weight bytes per forward "
              f"{wb / 1e6:,.1f} MB -> byte floor {wb / bw * 1e6:,.1f} us")
    L = args.block - 1
    distilled = None
    if "distilled" in args.kinds:
        distilled = TinyDrafter(model, block_len=L, seed=1, ffn_dim=dffn)
        t0 = time.perf_counter()
        if DEV == "cuda" and not model.exact:
            agree = distill_drafter_batched(model, distilled, backend, sequences=args.distill_seqs,
                                            tokens=args.distill_tokens, steps=args.distill_steps)
            extra = (f" ({int(agree.pop('samples'))} training samples; generation {agree.pop('gen_s'):.2f} s, "
                     f"fit {agree.pop('fit_s'):.2f} s)")
        else:
            agree, extra = distill_drafter(model, distilled, steps=args.distill_steps), ""
        print(f"distilled drafter (d {cfg.d_model}, ffn {dffn}) in {time.perf_counter() - t0:.2f} s{extra}; held-out "
              "top-1 agreement by depth:", " ".join(f"{v:.3f}" for v in agree.values()))
        if bw:
            print(f"  drafter weight bytes per call {distilled.weight_bytes() / 1e6:,.1f} MB -> byte floor "
                  f"{distilled.weight_bytes() / bw * 1e6:,.1f} us")
    vocab_prompt = min(256, cfg.vocab_size) if cfg.vocab_size <= 1024 else cfg.vocab_size
    logit_dtypes = list(dict.fromkeys(torch.float32 if x == "fp32" or model.exact else model.act_dtype
                                      for x in args.logits))
    for batch, ldt in [(b, d) for b in args.batch for d in logit_dtypes]:
        model.logits_dtype = ldt  # read when a forward is captured
        lname = str(ldt).replace("torch.", "")
        g = torch.Generator().manual_seed(batch)
        prompts = [torch.randint(0, vocab_prompt, (int(k),), generator=g).tolist()
                   for k in torch.randint(4, 64, (batch,), generator=g)]
        dr0 = NoisyOracleDrafter(cfg.vocab_size, L, batch, 64 + args.tokens + L + 32, DEV, agree=args.agree, dtype=ldt)
        os.environ["DDTREE_ROUND_FINISH"] = ""  # the AR peer: the engine's default path at budget 0
        set_variant("default")
        ref, ar_tps, _, ar_eng = run(model, prompts, args.tokens, 0, dr0, [], backend)
        graphs = ", graphs" if DEV == "cuda" and backend.graph_safe else ""
        ar_round = ""
        if DEV == "cuda" and backend.graph_safe:
            for s, p in enumerate(prompts):
                ar_eng.admit(s, Request(p, args.tokens, budget=0))
            ar_eng.step()
            ar_round = f"; round {round_time(ar_eng) * 1e6:.1f} us"
            for s in range(batch):
                ar_eng.release(s)
        del ar_eng
        print(f"\nbatch {batch}, {lname} logits: AR (budget 0, same engine{graphs}, no drafter call): {ar_tps:,.0f} "
              f"tok/s{ar_round}")
        for budget, kind, finish, variant in [(b, k, f, v) for b in args.budgets for k in args.kinds
                                              for f in args.finish for v in args.variants]:
            os.environ["DDTREE_ROUND_FINISH"] = finish  # read when the engine is built
            set_variant(variant)  # read by the library when the round is captured
            if kind == "noisy":
                dr = NoisyOracleDrafter(cfg.vocab_size, L, batch, 64 + args.tokens + L + 32, DEV, agree=args.agree,
                                        dtype=ldt)
                toks, tps, acc, eng = run(model, prompts, args.tokens, budget, dr, ref, backend)
            else:
                dr = distilled
                toks, tps, acc, eng = run(model, prompts, args.tokens, budget, dr, [], backend)
            agree_tok = sum(a == b for t, r in zip(toks, ref) for a, b in zip(t, r)) / sum(map(len, ref))
            if not backend.graph_safe and DEV == "cuda":  # --exact: no graphs to split the round with
                print(f"  DDTree {kind:9s} budget {budget:4d}: {tps:9,.0f} tok/s  ({tps / ar_tps:5.2f}x AR)  "
                      f"accept {acc:5.2f}   tokens equal to AR {agree_tok:.3f}")
                continue
            for s, p in enumerate(prompts):
                if kind == "noisy":
                    dr.set_reference(s, p + ref[s])
                eng.admit(s, Request(p, args.tokens, budget=budget))
            for _ in range(3):
                eng.step()
            if args.leaf_stats and DEV == "cuda":  # the steady state the timings see (they start 2 rounds later)
                print(f"  {leaf_stats(eng)}")
            t = overhead_share(eng)
            other = (t["round"] - t["models"]) / t["round"]
            other_sep = (t["round"] - t["drafter"] - t["target"]) / t["round"]
            tail = "fused" if eng.fused_finish else "split"
            floors = ""
            if bw:
                tf = model.fast_weight_bytes() / bw
                floors = f"; target {t['target'] / tf:.2f}x its byte floor"
                if kind == "distilled":
                    floors += f", drafter {t['drafter'] / (distilled.weight_bytes() / bw):.2f}x"  # type: ignore[union-attr]
            print(f"  DDTree {kind:9s} budget {budget:4d} ({tail} tail, {variant}, {lname} logits): {tps:9,.0f} tok/s  ({tps / ar_tps:5.2f}x AR)  "
                  f"accept {acc:5.2f}  round {t['round'] * 1e6:7.1f} us, drafter+target in one graph "
                  f"{t['models'] * 1e6:7.1f} us -> other {other:6.1%} ({(t['round'] - t['models']) * 1e6:5.1f} us);"
                  f"  separately: drafter {t['drafter'] * 1e6:6.1f} + target {t['target'] * 1e6:6.1f} -> other "
                  f"{other_sep:6.1%}{floors}   tokens equal to AR {agree_tok:.3f}")
            if "paired_other" in t:
                print(f"    paired (21 alternating single replays, launch hidden, round state restored each time): round "
                      f"{t['paired_round'] * 1e6:7.1f} us -> other {t['paired_other'] / t['paired_round']:6.1%} "
                      f"({t['paired_other'] * 1e6:5.1f} us)")
            if args.cupti and DEV == "cuda":
                sys.path.insert(0, str(Path(__file__).resolve().parent / "profile"))
                from e2e_round_profile import profile_engine  # noqa: E402  (CUPTI; GPU only)

                eng.max_new.fill_(1 << 30)  # overhead_share restored its snapshot: the same steady state
                r = profile_engine(eng, args.cupti_reps, variant, batch, budget)
                if r:
                    ks = " ".join(f"{k[2:]} {v:.2f}" for k, v in r.items() if k.startswith("k:"))
                    print(f"  CUPTI summary {kind} {lname} {batch}/{budget}: span {r['span']:.1f} us, engine ops {r['engine']:.1f} "
                          f"us ({r['engine'] / r['span']:.1%}), span - models span {r['span'] - r['models_span']:.1f} us "
                          f"({(r['span'] - r['models_span']) / r['span']:.1%}); engine kernels: {ks}")

            del eng


if __name__ == "__main__":
    main()
