"""PDL race stress (session 12, s12pdl; engine/bench/NOTES.md "Session 12 (s12pdl): PDL chain audit").

The bf16 toy of test_decode_gpu.py's test_gpu_bf16_logits_rounds (V = 997, 2 layers, head_dim 64, bf16 K/V, bf16 logits
by default, a noisy bf16 oracle drafter, 6 requests of 64 tokens at budget 16, request 4 sampled at T = 0.7) decoded
again and again for --seconds in one process: eager and graph-replayed, fused and split round tails, in turn. Greedy
and seeded sampling are deterministic and the four (mode, tail) pairs compute the same tokens, so every run must
return the same token lists: a run that differs from the most common result is a deviation. Prints one JSON line
(label, environment, runs, deviations, each deviation's kind and the first one's detail).

Meant to run in 5 processes side by side on one GPU (time-sliced contexts, where the race showed: a single process
passed): engine/bench/run_pdl_stress.sh. Switches:
  --env NAME=VALUE  set before the library loads (DDTREE_ACCEPT_PDL=1 or 2, DDTREE_DISABLE_PDL=1,
                    DDTREE_LIB=<a libddtree.so>, ...); repeatable.
  --fence           launch a one-element torch kernel right before every tree_accept / round_finish, so that the
                    accept's PDL predecessor is a plain torch kernel instead of the lm_head's cuBLAS GEMM.
  --sync            eager runs: synchronize the device right before every accept launch (no overlap is left for
                    PDL to open; graph runs are unchanged, "by_mode" separates the two).
  --logits fp32     fp32 logits (torch.mm out_dtype, test_gpu_bf16_fast_graph_rounds' dtype) instead of bf16.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import time
from typing import Any

L, MAX_CONTEXT, BUDGET, NEW_TOKENS = 7, 320, 16, 64
PROMPT_LENGTHS = [1, 2, 5, 16, 17, 33]  # test_decode_gpu.py's first six LENGTHS


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="default")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--fence", action="store_true")
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--logits", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--seconds", type=float, default=25.0, help="stop starting runs after this long")
    ap.add_argument("--min-runs", type=int, default=8, help="runs to finish even past --seconds")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the reference ops, eager only (checks this script, not the race)")
    args = ap.parse_args(argv)
    for kv in args.env:
        if "=" not in kv:
            ap.error(f"--env wants NAME=VALUE, got {kv!r}")
    return args


def classify(run: list[list[int]], ref: list[list[int]]) -> dict[str, Any]:
    """Where `run` first differs from `ref` and how: 'gap' (from there on the run's tokens are ref's with a contiguous
    run of up to one round's tokens left out: tokens lost from the report while the state advanced as in ref),
    'extra' (the reverse: tokens reported that ref's state never took), 'diverge' (the continuations differ: the
    state or the logits differed), 'length' (one sequence is a prefix of the other)."""
    for slot, (a, b) in enumerate(zip(run, ref)):
        if a == b:
            continue
        i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        kind = "length" if i == min(len(a), len(b)) else "diverge"

        def skips(x: list[int], y: list[int], gap: int) -> bool:  # x[i:] == y[i + gap:] where both have tokens
            n = min(len(x) - i, len(y) - i - gap)
            return n >= 2 and x[i : i + n] == y[i + gap : i + gap + n]

        for gap in range(1, L + 2) if kind == "diverge" else ():
            if skips(a, b, gap) or skips(b, a, gap):
                kind = "gap" if skips(a, b, gap) else "extra"
                break
        lo = max(0, i - 2)
        return {"slot": slot, "index": i, "kind": kind, "run": a[lo : i + 8], "ref": b[lo : i + 8]}
    return {"slot": -1, "index": -1, "kind": "none", "run": [], "ref": []}


Result = tuple[str, tuple[tuple[int, ...], ...], list[list[int]]]  # (mode/tail, tokens per request, accept lengths)


def deviations(results: list[Result], plain: list[list[int]]) -> list[dict[str, Any]]:
    """The runs whose tokens differ from the most common result of the same round tail, each classified (classify)
    and described."""
    devs: list[dict[str, Any]] = []
    for tail in sorted({name.split("/")[1] for name, _, _ in results}):
        devs += _deviations([r for r in results if r[0].endswith("/" + tail)], plain)
    return devs


def tail_references(results: list[Result]) -> dict[str, tuple[tuple[int, ...], ...]]:
    """The most common tokens of each round tail."""
    by_tail = collections.defaultdict(list)
    for name, toks, _ in results:
        by_tail[name.split("/")[1]].append(toks)
    return {t: collections.Counter(v).most_common(1)[0][0] for t, v in by_tail.items()}


def _deviations(results: list[Result], plain: list[list[int]]) -> list[dict[str, Any]]:
    ref_tokens, _ = collections.Counter(r[1] for r in results).most_common(1)[0]
    ref = [list(t) for t in ref_tokens]
    ref_lens = next(r[2] for r in results if r[1] == ref_tokens)
    devs = []
    for name, toks, lens in results:
        if toks == ref_tokens:
            continue
        d = classify([list(t) for t in toks], ref)
        d["mode"] = name
        # A third opinion: how far the run and the reference agree with budget-0 decoding (the target's greedy
        # output up to bf16 shape-dependent rounding; request 4 samples, so only greedy slots say much).
        pl = plain[d["slot"]]
        d["plain_agree"] = [next((j for j, (x, y) in enumerate(zip(t, pl)) if x != y), min(len(t), len(pl)))
                            for t in (list(toks[d["slot"]]), ref[d["slot"]])]
        d["accept_lens"], d["ref_accept_lens"] = lens[d["slot"]][:6], ref_lens[d["slot"]][:6]
        devs.append(d)
    return devs


def main(argv: list[str]) -> int:
    args = parse(argv)
    for kv in args.env:  # before the library loads: DDTREE_DISABLE_PDL is read once per process
        name, value = kv.split("=", 1)
        os.environ[name] = value
    import torch

    from ddtree_engine.backend import cuda_backend, reference_backend
    from ddtree_engine.decode import DDTreeEngine, Request
    from ddtree_engine.drafter import NoisyOracleDrafter, OracleDrafter
    from ddtree_engine.model import ModelConfig, TinyTransformer, random_weights

    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"label": args.label, "error": "no CUDA device"}))
        return 2
    cfg = ModelConfig(vocab_size=997, d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=512)
    w = {k: v.to(torch.bfloat16).float() for k, v in random_weights(cfg, 5).items()}
    model = TinyTransformer(cfg, w, device=dev, exact=False, act_dtype=torch.bfloat16, kv_dtype=torch.bfloat16)
    model.logits_dtype = torch.bfloat16 if args.logits == "bf16" else torch.float32
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 320, (k,), generator=g).tolist() for k in PROMPT_LENGTHS]

    be = cuda_backend() if dev == "cuda" else reference_backend()
    if args.fence or args.sync:
        fence = torch.zeros(1, dtype=torch.int32, device=dev)

        def fenced(op: Any) -> Any:
            def call(*a: Any, **k: Any) -> Any:
                if args.sync and dev == "cuda" and not torch.cuda.is_current_stream_capturing():
                    torch.cuda.synchronize()  # eager: the lm_head GEMM has completed before the accept is launched
                if args.fence:  # the accept's PDL predecessor becomes this torch kernel (in the graph as well)
                    fence.add_(1)
                return op(*a, **k)
            return call

        be = dataclasses.replace(be, tree_accept=fenced(be.tree_accept),
                                 round_finish=fenced(be.round_finish) if be.round_finish is not None else None)

    def run(drafter: Any, budget: int, graph: bool, reqs: list[Any], on_admit: Any = None) -> list[Any]:
        eng = DDTreeEngine(model, drafter, be, slots=len(reqs), max_budget=budget, max_context=MAX_CONTEXT)
        if graph and dev == "cuda":
            eng.capture_graph()
        return eng.generate(reqs, on_admit=on_admit)

    plain = run(OracleDrafter(cfg.vocab_size, L, 6, MAX_CONTEXT + L + 2, dev), 0, True,
                [Request(p, NEW_TOKENS) for p in prompts])
    noisy = NoisyOracleDrafter(cfg.vocab_size, L, 6, MAX_CONTEXT + L + 2, dev, agree=0.8, dtype=torch.bfloat16)
    reqs = [Request(p, NEW_TOKENS, budget=BUDGET, temperature=0.7 if k == 4 else 0.0, seed=k)
            for k, p in enumerate(prompts)]

    def admit(slot: int, i: int) -> None:
        noisy.set_reference(slot, prompts[i] + plain[i].tokens)

    tails = ("fused", "split") if be.round_finish is not None else ("split",)
    results: list[Result] = []
    t0 = time.monotonic()
    k = 0
    while time.monotonic() - t0 < args.seconds or len(results) < args.min_runs:
        tail, graph = tails[k % len(tails)], (k // len(tails)) % 2 == 1 and dev == "cuda"
        os.environ["DDTREE_ROUND_FINISH"] = tail
        gens = run(noisy, BUDGET, graph, reqs, on_admit=admit)
        results.append((f"{'graph' if graph else 'eager'}/{tail}", tuple(tuple(x.tokens) for x in gens),
                        [x.accept_lens for x in gens]))
        k += 1
    if dev == "cuda":
        torch.cuda.synchronize()
    devs = deviations(results, [g.tokens for g in plain])
    by_mode = collections.Counter(d["mode"] for d in devs)
    refs = list(tail_references(results).values())
    print(json.dumps({
        "label": args.label, "env": args.env, "fence": args.fence, "sync": args.sync, "logits": args.logits,
        "runs": len(results), "tails_agree": all(r == refs[0] for r in refs),
        "deviations": len(devs), "by_mode": dict(by_mode), "kinds": dict(collections.Counter(d["kind"] for d in devs)),
        "first": devs[0] if devs else None, "seconds": round(time.monotonic() - t0, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
