"""DDTree decoding is lossless: the engine's output equals plain autoregressive decoding token for token.

The reference is `ar_generate`: one request at a time through the model's dense path (no tree, no paging,
no engine op). The engine runs whole rounds through the op backend (CPU: the PyTorch references) with
ragged prompts, continuous batching over B slots and per-request budgets. Numerics: see model.py (fp64
accumulation rounded to fp32); `test_reference_margins` reports how far every reference trajectory stays
from a near-tie compared with the measured tree-vs-dense logit error.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import pytest

torch = pytest.importorskip("torch")
for _op in ("draft_topk_lse", "build_tree", "tree_attention", "tree_accept", "kv_commit"):
    # The loop runs on the ops' PyTorch references; each lands with its op.
    pytest.importorskip(f"ddtree_engine.reference.{_op}", reason=f"reference {_op} not in the tree yet")

from ddtree_engine.backend import OpBackend, reference_backend  # noqa: E402
from ddtree_engine.decode import DDTreeEngine, Generation, Request, ar_generate  # noqa: E402
from ddtree_engine.drafter import NoisyOracleDrafter, OracleDrafter, TinyDrafter, WrongDrafter, distill_drafter  # noqa: E402
from ddtree_engine.model import DenseKV, ModelConfig, TinyTransformer  # noqa: E402

CFG = ModelConfig(vocab_size=320, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=176)
L = 7  # draft positions per round (block size 8)
N_PROMPTS, N_TOKENS = 16, 256
MAX_CONTEXT = 320
# Tree-vs-dense logit error bound, asserted in test_model.test_tree_path_matches_dense_path (measured
# ~3e-6: the fp32 attention reference's rounding).
LOGIT_ERR = 2e-5


def _prompts(n: int = N_PROMPTS, seed: int = 9) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 2, 5, 16, 17, 33, 40, 9, 3, 24, 31, 12, 1, 48, 7, 20][:n]
    return [torch.randint(0, CFG.vocab_size, (k,), generator=g).tolist() for k in lengths]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Any:
    """The model is tiny: one intra-op thread is several times faster than two on a busy 2-core
    machine (OpenMP workers spin against each other). Restored after this module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return TinyTransformer.random(CFG, seed=0)


@pytest.fixture(scope="module")
def backend() -> OpBackend:
    return reference_backend()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return _prompts()


@pytest.fixture(scope="module")
def greedy_ref(model: TinyTransformer, prompts: list[list[int]]) -> list[list[int]]:
    return [ar_generate(model, p, N_TOKENS) for p in prompts]


def _engine(model: TinyTransformer, backend: OpBackend, drafter: Any, slots: int, max_budget: int,
            stop_ids: Sequence[int] = ()) -> DDTreeEngine:
    return DDTreeEngine(model, drafter, backend, slots=slots, max_budget=max_budget, max_context=MAX_CONTEXT,
                        page_size=16, stop_ids=stop_ids)


def _ref_drafter(cls: Callable[..., Any], slots: int, refs: dict[int, list[int]], **kw: Any) -> tuple[Any, Callable]:
    """A reference-following drafter and an on_admit hook that loads each admitted request's reference."""
    drafter = cls(CFG.vocab_size, L, slots, MAX_CONTEXT + L + 2, "cpu", **kw)

    def on_admit(slot: int, index: int) -> None:
        drafter.set_reference(slot, refs[index])

    return drafter, on_admit


def _run(engine: DDTreeEngine, reqs: list[Request], on_admit: Callable | None = None) -> list[Generation]:
    return engine.generate(reqs, on_admit=on_admit)


# ---- greedy: budgets x batch sizes -------------------------------------------------------------------
# batch 8 runs every prompt with the noisy-oracle drafter (long accepted paths, wrong siblings, deep
# commits); batch 1 and 3 run with the engine's own TinyDrafter, which is almost always wrong (the
# drafter never decides what is emitted: a bug that trusted drafts would show up as a mismatch).
MATRIX = [(b, 8, "noisy") for b in (0, 1, 2, 7, 15, 64)] + [(b, 3, "tiny") for b in (2, 64)] + [
    (b, 1, "tiny") for b in (1, 7, 64)]


@pytest.mark.parametrize("budget,batch,drafter_kind", MATRIX)
def test_greedy_ddtree_equals_greedy_ar(model: TinyTransformer, backend: OpBackend, prompts: list[list[int]],
                                        greedy_ref: list[list[int]], budget: int, batch: int,
                                        drafter_kind: str) -> None:
    # batch 1 and 3 run subsets of the prompts (wall time on 2 CI cores); batch 8 runs all 16.
    pick = {8: list(range(N_PROMPTS)), 3: [0, 3, 6, 9, 12, 15] if budget == 2 else [1, 4, 7, 10, 13, 14],
            1: [budget % 4, 4 + budget % 5, 9 + budget % 7]}[batch]
    n_tokens = N_TOKENS
    reqs = [Request(prompts[i], n_tokens, budget=budget) for i in pick]
    refs = {k: prompts[i] + greedy_ref[i] for k, i in enumerate(pick)}
    if drafter_kind == "noisy":
        drafter, on_admit = _ref_drafter(NoisyOracleDrafter, batch, refs, agree=0.6)
    else:
        drafter, on_admit = TinyDrafter(model, block_len=L, seed=3), None
    t0 = time.perf_counter()
    gens = _run(_engine(model, backend, drafter, batch, budget), reqs, on_admit)
    elapsed = time.perf_counter() - t0
    for k, i in enumerate(pick):
        assert gens[k].tokens == greedy_ref[i][:n_tokens], f"prompt {i}: first mismatch at " + str(
            next(j for j, (a, b) in enumerate(zip(gens[k].tokens, greedy_ref[i])) if a != b))
        assert gens[k].finish_reason == "length"
    lens = [a for g in gens for a in g.accept_lens]
    print(f"budget={budget} batch={batch} {drafter_kind}: {sum(lens)} tokens in {len(lens)} request-rounds "
          f"(mean accept {sum(lens) / len(lens):.2f}, max {max(lens)}), {elapsed:.1f} s")
    if budget == 0:
        assert max(lens) == 1  # plain decoding through the same loop
    else:
        assert max(lens) <= L + 1 and max(lens) <= budget + 1


def test_reference_margins(model: TinyTransformer, prompts: list[list[int]], greedy_ref: list[list[int]]) -> None:
    """Along every greedy reference trajectory, the top-2 logit margin stays far above the tree-vs-dense
    logit difference (the fp32 attention op's rounding), so the equality above is not luck of the draw
    on this machine: it would take a near-tie < `err` to flip a token."""
    worst = float("inf")
    for p, ref in zip(prompts, greedy_ref):
        logits, _ = model.forward_dense(torch.tensor(p + ref[:-1]), DenseKV())
        top2 = logits[len(p) - 1 :].topk(2, dim=-1).values
        worst = min(worst, float((top2[:, 0] - top2[:, 1]).min()))
    print(f"smallest top-2 margin over {N_PROMPTS * N_TOKENS} reference tokens: {worst:.3g} "
          f"(logit error bound {LOGIT_ERR})")
    assert worst > 10 * LOGIT_ERR


def test_distilled_drafter_is_lossless_and_accepts_more(model: TinyTransformer, backend: OpBackend,
                                                        prompts: list[list[int]],
                                                        greedy_ref: list[list[int]]) -> None:
    """The engine's own drafter, trained on the target's greedy continuations (never on these prompts'
    references), makes rounds accept more than one token, and the output is still exactly AR's."""
    drafter = TinyDrafter(model, block_len=L, seed=3)
    agree = distill_drafter(model, drafter, sequences=24, tokens=128, steps=200, seed=11)
    pick = [2, 5, 8, 11]
    gens = _run(_engine(model, backend, drafter, 4, 15), [Request(prompts[i], 128, budget=15) for i in pick])
    for k, i in enumerate(pick):
        assert gens[k].tokens == greedy_ref[i][:128]
    lens = [a for g in gens for a in g.accept_lens]
    print(f"distilled drafter: held-out depth-1 agreement {agree['depth1']:.2f}, "
          f"mean accept {sum(lens) / len(lens):.2f} at budget 15")
    assert agree["depth1"] > 0.2
    assert sum(lens) / len(lens) > 1.2


# ---- sampling ---------------------------------------------------------------------------------------
def _sample_margin(model: TinyTransformer, prompt: list[int], ref: list[int], temperature: float, seed: int,
                   request: int) -> float:
    from ddtree_engine.reference.tree_accept import gumbel_noise

    logits, _ = model.forward_dense(torch.tensor(prompt + ref[:-1]), DenseKV())
    rows = logits[len(prompt) - 1 :]
    pos = torch.arange(len(prompt), len(prompt) + len(ref))[:, None]
    g = gumbel_noise(seed, request, pos, torch.arange(CFG.vocab_size)[None, :])
    top2 = (rows / torch.tensor(temperature, dtype=torch.float32) + g).topk(2, dim=-1).values
    return float((top2[:, 0] - top2[:, 1]).min())


@pytest.mark.parametrize("temperature,budget", [(0.8, 7), (1.3, 64)])
def test_sampled_ddtree_equals_sampled_ar(model: TinyTransformer, backend: OpBackend, prompts: list[list[int]],
                                          temperature: float, budget: int) -> None:
    """Gumbel-max with the shared counter-based noise: same tokens as AR sampling with that noise."""
    pick = list(range(6))
    seeds = [1000 + i for i in pick]
    # One slot per request, so request k decodes in row k and draws noise stream (seed, k, position).
    ref = [ar_generate(model, prompts[i], N_TOKENS, temperature=temperature, seed=seeds[k], request=k)
           for k, i in enumerate(pick)]
    refs = {k: prompts[i] + ref[k] for k, i in enumerate(pick)}
    reqs = [Request(prompts[i], N_TOKENS, budget=budget, temperature=temperature, seed=seeds[k])
            for k, i in enumerate(pick)]
    drafter, on_admit = _ref_drafter(NoisyOracleDrafter, len(pick), refs, agree=0.6)
    gens = _run(_engine(model, backend, drafter, len(pick), budget), reqs, on_admit)
    for k in range(len(pick)):
        assert gens[k].tokens == ref[k]
    # As for greedy: every sampled decision along the references is far from a tie of logit/T + noise.
    worst = min(_sample_margin(model, prompts[i], ref[k], temperature, seeds[k], k) for k, i in enumerate(pick))
    print(f"T={temperature}: smallest top-2 margin of logit/T + g along the references: {worst:.3g}")
    assert worst > 10 * LOGIT_ERR / temperature
    greedy = [ar_generate(model, prompts[i], 32) for i in pick]
    assert any(g.tokens[:32] != gr for g, gr in zip(gens, greedy))  # sampling really sampled
    assert max(a for g in gens for a in g.accept_lens) > 1


# ---- adversarial drafters ---------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [7, 15])
def test_always_right_drafter_accepts_L_plus_1(model: TinyTransformer, backend: OpBackend, prompts: list[list[int]],
                                               greedy_ref: list[list[int]], budget: int) -> None:
    pick = [0, 5, 13]
    n = 8 * (L + 1)  # a whole number of full rounds
    refs = {k: prompts[i] + greedy_ref[i] for k, i in enumerate(pick)}
    reqs = [Request(prompts[i], n, budget=budget) for i in pick]
    drafter, on_admit = _ref_drafter(OracleDrafter, 3, refs)
    gens = _run(_engine(model, backend, drafter, 3, budget), reqs, on_admit)
    for k, i in enumerate(pick):
        assert gens[k].tokens == greedy_ref[i][:n]
        assert gens[k].accept_lens == [L + 1] * 8


def test_always_right_drafter_with_small_budget_accepts_budget_plus_1(
        model: TinyTransformer, backend: OpBackend, prompts: list[list[int]], greedy_ref: list[list[int]]) -> None:
    refs = {0: prompts[2] + greedy_ref[2]}
    req = Request(prompts[2], 30, budget=2)
    drafter, on_admit = _ref_drafter(OracleDrafter, 1, refs)
    (gen,) = _run(_engine(model, backend, drafter, 1, 2), [req], on_admit)
    assert gen.tokens == greedy_ref[2][:30]
    assert gen.accept_lens == [3] * 10


@pytest.mark.parametrize("budget", [1, 15, 64])
def test_always_wrong_drafter_accepts_1(model: TinyTransformer, backend: OpBackend, prompts: list[list[int]],
                                        greedy_ref: list[list[int]], budget: int) -> None:
    pick = [1, 6, 11]
    refs = {k: prompts[i] + greedy_ref[i] for k, i in enumerate(pick)}
    reqs = [Request(prompts[i], 40, budget=budget) for i in pick]
    drafter, on_admit = _ref_drafter(WrongDrafter, 3, refs)
    gens = _run(_engine(model, backend, drafter, 3, budget), reqs, on_admit)
    for k, i in enumerate(pick):
        assert gens[k].tokens == greedy_ref[i][:40]
        assert gens[k].accept_lens == [1] * 40


# ---- stops and limits -------------------------------------------------------------------------------
def test_stop_token_mid_tree_stops_exactly_there(model: TinyTransformer, backend: OpBackend,
                                                 prompts: list[list[int]], greedy_ref: list[list[int]]) -> None:
    """Request 0 hits a stop token inside an accepted path (oracle drafter: full chains); the other
    requests in the batch keep going and still match AR decoding."""
    pick = [0, 3, 8]
    others = set(greedy_ref[3][:100]) | set(greedy_ref[8][:100])
    # A token of request 0's continuation, past its first round, that the other two never produce.
    pos = next(j for j in range(10, 100) if greedy_ref[0][j] not in others and j % (L + 1) not in (0, L))
    stop = greedy_ref[0][pos]
    first = greedy_ref[0].index(stop)
    refs = {k: prompts[i] + greedy_ref[i] for k, i in enumerate(pick)}
    reqs = [Request(prompts[i], 100, budget=15) for i in pick]
    drafter, on_admit = _ref_drafter(OracleDrafter, 3, refs)
    gens = _run(_engine(model, backend, drafter, 3, 15, stop_ids=[stop]), reqs, on_admit)
    assert gens[0].tokens == greedy_ref[0][: first + 1]
    assert gens[0].finish_reason == "stop"
    assert gens[0].tokens == ar_generate(model, prompts[0], 100, stop_ids=[stop])
    if first % (L + 1) not in (L,):  # the stop was not the bonus token: it truncated an accepted path
        assert gens[0].accept_lens[-1] == first % (L + 1) + 1
    for k, i in ((1, 3), (2, 8)):
        assert gens[k].tokens == greedy_ref[i][:100] and gens[k].finish_reason == "length"


def test_ignore_stop_decodes_through_stop_tokens(model: TinyTransformer, backend: OpBackend,
                                                  prompts: list[list[int]], greedy_ref: list[list[int]]) -> None:
    stop = greedy_ref[2][12]
    refs = {0: prompts[2] + greedy_ref[2]}
    req = Request(prompts[2], 64, budget=15, ignore_stop=True)
    drafter, on_admit = _ref_drafter(OracleDrafter, 1, refs)
    (gen,) = _run(_engine(model, backend, drafter, 1, 15, stop_ids=[stop]), [req], on_admit)
    assert gen.tokens == greedy_ref[2][:64] and gen.finish_reason == "length"
    assert len(gen.accept_lens) > 8  # the stop token still ended its round early


def test_max_tokens_cuts_inside_a_round(model: TinyTransformer, backend: OpBackend, prompts: list[list[int]],
                                        greedy_ref: list[list[int]]) -> None:
    refs = {k: prompts[i] + greedy_ref[i] for k, i in enumerate([4, 7])}
    reqs = [Request(prompts[4], 13, budget=15), Request(prompts[7], 5, budget=15)]
    drafter, on_admit = _ref_drafter(OracleDrafter, 2, refs)
    gens = _run(_engine(model, backend, drafter, 2, 15), reqs, on_admit)
    assert gens[0].tokens == greedy_ref[4][:13] and gens[0].accept_lens == [8, 5]
    assert gens[1].tokens == greedy_ref[7][:5] and gens[1].accept_lens == [5]
    assert all(g.finish_reason == "length" for g in gens)


def test_admission_errors(model: TinyTransformer, backend: OpBackend) -> None:
    eng = _engine(model, backend, TinyDrafter(model, block_len=L), 2, 4)
    with pytest.raises(ValueError, match="context limit"):
        eng.admit(0, Request([1] * 300, 100, budget=1))
    with pytest.raises(ValueError, match="budget"):
        eng.admit(0, Request([1], 10, budget=5))
    with pytest.raises(ValueError, match="token ids"):
        eng.admit(0, Request([CFG.vocab_size], 10))
    eng.admit(0, Request([1, 2], 4, budget=4))
    with pytest.raises(RuntimeError, match="busy"):
        eng.admit(0, Request([1], 4))
