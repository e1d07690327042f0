"""tree_accept: the reference (CPU, CI) on hand-built trees, the Gumbel noise (pinned bits, statistics,
equivalence with autoregressive sampling), and the CUDA op against the reference (GPU)."""

from __future__ import annotations

import struct

import pytest
import torch

from ddtree_engine.reference.tree_accept import gumbel_noise, tree_accept

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _links(parents: list[int], n_max: int) -> tuple[list[int], list[int]]:
    first = [-1] * n_max
    nxt = [-1] * n_max
    last: dict[int, int] = {}
    for i, p in enumerate(parents):
        if i == 0 or p < 0:
            continue
        if p in last:
            nxt[last[p]] = i
        else:
            first[p] = i
        last[p] = i
    return first, nxt


def _golden() -> dict[str, torch.Tensor]:
    # Root 0 -> {1: tok 5, 2: tok 3}; 1 -> {3: tok 2}; 2 -> {4: tok 7}; node 5 is padding.
    parents = [-1, 0, 0, 1, 2, -1]
    first, nxt = _links(parents, 6)
    logits = torch.zeros(6, 8)
    logits[0, 3] = 2.0
    logits[2, 7] = 1.0
    logits[4, 1] = 3.0
    logits[4, 6] = 3.0  # tie with id 1: lower id wins
    logits[1, 2] = 5.0
    return dict(
        target_logits=logits,
        node_token=torch.tensor([[9, 5, 3, 2, 7, -1]], dtype=torch.int32),
        first_child=torch.tensor([first], dtype=torch.int32),
        next_sibling=torch.tensor([nxt], dtype=torch.int32),
        num_nodes=torch.tensor([5], dtype=torch.int32),
        ctx_len=torch.tensor([10], dtype=torch.int32),
        temperature=torch.tensor([0.0]),
        seed=torch.tensor([1], dtype=torch.int64),
        stop_ids=torch.tensor([], dtype=torch.int32),
    )


def test_reference_golden_greedy_walk() -> None:
    out = tree_accept(**_golden(), max_depth=5)
    assert out.accept_nodes.tolist() == [[0, 2, 4, -1, -1, -1]]
    assert out.committed_ids.tolist() == [[3, 7, 1, -1, -1, -1]]
    assert out.accept_len.tolist() == [3] and out.bonus.tolist() == [1] and out.finished.tolist() == [0]


def test_reference_stop_id_truncates_right_after_it() -> None:
    args = _golden()
    args["stop_ids"] = torch.tensor([11, 7], dtype=torch.int32)
    out = tree_accept(**args, max_depth=5)
    assert out.accept_nodes.tolist() == [[0, 2, -1, -1, -1, -1]]
    assert out.committed_ids.tolist() == [[3, 7, -1, -1, -1, -1]]
    assert (out.accept_len.item(), out.bonus.item(), out.finished.item()) == (2, 7, 1)
    args["stop_ids"] = torch.tensor([3], dtype=torch.int32)  # the very first new token
    out = tree_accept(**args, max_depth=5)
    assert out.accept_nodes.tolist()[0][:2] == [0, -1] and out.committed_ids.tolist()[0][:2] == [3, -1]
    assert (out.accept_len.item(), out.bonus.item(), out.finished.item()) == (1, 3, 1)


def test_reference_max_depth_caps_the_walk_and_root_only_tree() -> None:
    out = tree_accept(**_golden(), max_depth=1)
    assert out.accept_nodes.tolist() == [[0, 2]] and out.committed_ids.tolist() == [[3, 7]]
    assert out.bonus.item() == 7
    args = _golden()
    args["num_nodes"] = torch.tensor([1], dtype=torch.int32)  # plain decode: root only
    out = tree_accept(**args)
    assert out.accept_len.item() == 1 and out.committed_ids.tolist()[0][:2] == [3, -1]


def test_gumbel_noise_bits_are_pinned() -> None:
    # The same literals are checked against the CUDA implementation in ddtree-selftest.
    cases = [((0, 0, 0, 0), 0x3F4F029A), ((1, 0, 5, 7), 0xBD82AA69), ((123456789012345, 3, 1000, 163839), 0xBF96F373),
             ((-5, 7, 99999, 42), 0x403A772E), ((42, 1, 17, 31999), 0xBECD0A66)]
    for (seed, req, pos, vid), bits in cases:
        g = gumbel_noise(seed, req, pos, torch.tensor([vid]))[0].item()
        assert struct.unpack("<I", struct.pack("<f", g))[0] == bits


def test_gumbel_noise_statistics_and_sampling_frequencies() -> None:
    g = gumbel_noise(7, 0, 3, torch.arange(400_000))
    g = g[torch.isfinite(g)]
    assert abs(g.mean().item() - 0.5772) < 0.01 and abs(g.std().item() - 1.2825) < 0.01
    # Gumbel-max over positions samples softmax(logits / T).
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0])
    temp = 0.7
    positions = torch.arange(40000).unsqueeze(1)
    draws = torch.argmax(logits / temp + gumbel_noise(3, 1, positions, torch.arange(4).unsqueeze(0)), dim=1)
    freq = torch.bincount(draws, minlength=4).float() / len(draws)
    assert torch.allclose(freq, torch.softmax(logits / temp, dim=0), atol=0.01)


def test_gumbel_noise_depends_on_every_key_part() -> None:
    v = torch.arange(64)
    base = gumbel_noise(5, 1, 9, v)
    assert torch.equal(base, gumbel_noise(5, 1, 9, v))
    for other in (gumbel_noise(6, 1, 9, v), gumbel_noise(5, 2, 9, v), gumbel_noise(5, 1, 10, v),
                  gumbel_noise(5 + (1 << 32), 1, 9, v)):
        assert not torch.equal(base, other)


def test_reference_sampled_tree_reproduces_autoregressive_sampling() -> None:
    # A bigram "model": the logits after token t are table[t]. AR sampling draws token k at position
    # ctx + k; a tree holding the AR path (plus distractor siblings) must accept exactly that path.
    gen = torch.Generator().manual_seed(0)
    vocab, ctx, seed, temp, steps = 50, 17, 1234, 0.9, 6
    table = torch.randn(vocab, vocab, generator=gen) * 2
    root = 4
    ar = [root]
    for k in range(1, steps + 2):
        g = gumbel_noise(seed, 0, ctx + k, torch.arange(vocab))
        ar.append(int(torch.argmax(table[ar[-1]] / torch.tensor(temp) + g)))
    # Tree: chain of the first `steps` AR tokens, each with a distractor sibling of another token.
    tokens, parents = [root], [-1]
    for k in range(1, steps + 1):
        chain_parent = 0 if k == 1 else len(tokens) - 1
        tokens.append((ar[k] + 1) % vocab)  # distractor first (lower index)
        parents.append(chain_parent)
        tokens.append(ar[k])
        parents.append(chain_parent)
    n = len(tokens)
    first, nxt = _links(parents, n)
    out = tree_accept(
        table[torch.tensor(tokens)], torch.tensor([tokens], dtype=torch.int32), torch.tensor([first], dtype=torch.int32),
        torch.tensor([nxt], dtype=torch.int32), torch.tensor([n], dtype=torch.int32), torch.tensor([ctx], dtype=torch.int32),
        torch.tensor([temp]), torch.tensor([seed]), torch.tensor([], dtype=torch.int32),
    )
    assert out.accept_len.item() == steps + 1
    assert out.committed_ids[0, : steps + 1].tolist() == ar[1 : steps + 2]


# ---------------------------------------------------------------------------------------------- GPU
def _random_case(batch: int, n_max: int, vocab: int, dtype: torch.dtype, temp: float, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.full((batch, n_max), -1, dtype=torch.int32)
    first = torch.full((batch, n_max), -1, dtype=torch.int32)
    nxt = torch.full((batch, n_max), -1, dtype=torch.int32)
    num = torch.randint(1, n_max + 1, (batch,), generator=gen, dtype=torch.int32)
    logits = torch.randn(batch, n_max, vocab, generator=gen) * 2
    for b in range(batch):
        n = int(num[b])
        parents = [-1] + [int(torch.randint(0, max(1, i // 2 + 1), (1,), generator=gen)) for i in range(1, n)]
        kids: dict[int, list[int]] = {}
        tokens[b, 0] = int(torch.randint(0, vocab, (1,), generator=gen))
        for i in range(1, n):
            used = {int(tokens[b, s]) for s in kids.get(parents[i], [])}
            tok = int(torch.randint(0, vocab, (1,), generator=gen))
            while tok in used:
                tok = (tok + 1) % vocab
            tokens[b, i] = tok
            kids.setdefault(parents[i], []).append(i)
        f, s = _links(parents + [-1] * (n_max - n), n_max)
        first[b], nxt[b] = torch.tensor(f), torch.tensor(s)
        for p, ks in kids.items():  # steer most nodes toward one child so walks go deep
            if torch.rand(1, generator=gen).item() < 0.8:
                logits[b, p, int(tokens[b, ks[int(torch.randint(0, len(ks), (1,), generator=gen))]])] += 12
    temps = torch.tensor([temp if b % 2 == 0 else 0.0 for b in range(batch)])
    return dict(
        target_logits=logits.to(dtype).cuda(), node_token=tokens.cuda(), first_child=first.cuda(),
        next_sibling=nxt.cuda(), num_nodes=num.cuda(),
        ctx_len=torch.randint(0, 4000, (batch,), generator=gen, dtype=torch.int32).cuda(),
        temperature=temps.cuda(), seed=torch.randint(-(2**62), 2**62, (batch,), generator=gen).cuda(),
        stop_ids=torch.randint(0, vocab, (2,), generator=gen, dtype=torch.int32).cuda(),
    )


def _assert_same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    for name, g, w in zip(("accept_nodes", "accept_len", "committed_ids", "bonus", "finished"), got, want):
        assert torch.equal(g, w), f"{name}: {g.tolist()} != {w.tolist()}"


def _assert_eager_and_graph(op: object, args: dict[str, torch.Tensor], want: tuple[torch.Tensor, ...],
                            poison: tuple[str, ...]) -> None:
    """op(**args) == want eagerly, then from two replays of a captured call (the `poison` outputs reset first)."""
    _assert_same(op(**args), want)  # type: ignore[operator]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(**args)  # type: ignore[operator]
    for _ in range(2):
        for name in poison:
            getattr(out, name).fill_(-7)
        graph.replay()
        _assert_same(out, want)


# The library's launch switches for each impl a test names (read by the launcher on every call).
PLANS = {
    "fused": {"DDTREE_ACCEPT_IMPL": "fused", "DDTREE_ACCEPT_ONE_CTA": "0"},  # chunked kernel, default scoring
    "one_cta": {"DDTREE_ACCEPT_IMPL": "fused", "DDTREE_ACCEPT_ONE_CTA": "1"},  # one CTA per request where it fits
    "split": {"DDTREE_ACCEPT_IMPL": "split"},
    # session 6's chunked kernel (unrolled scoring, no PDL) and session 7's early mode with the compact scoring
    "fused_s6": {"DDTREE_ACCEPT_IMPL": "fused", "DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_SCORE": "unrolled",
                 "DDTREE_ACCEPT_PDL": "0", "DDTREE_ACCEPT_WIDE": "0"},
    "fused_early": {"DDTREE_ACCEPT_IMPL": "fused", "DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_SCORE": "compact",
                    "DDTREE_ACCEPT_PDL": "1"},
    "one_cta_compact": {"DDTREE_ACCEPT_IMPL": "fused", "DDTREE_ACCEPT_ONE_CTA": "1", "DDTREE_ACCEPT_SCORE": "compact"},
    # session 10: the packed bf16 greedy scoring at every vocabulary (the default only above V = 1024; fp32 rows
    # and partial vectors take the compact loop), and session 6's unrolled loop at V = 151,936's default plan
    "fused_packed": {"DDTREE_ACCEPT_IMPL": "fused", "DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_SCORE": "packed"},
    # session 11: the fused kernel's bf16 chunk of 8192 logits (session 10's; the default is now 16,384), and the
    # wide chunk under the unrolled loop (greedy rows through the out-of-line scorer)
    "fused_narrow": {"DDTREE_ACCEPT_IMPL": "fused", "DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_WIDE": "0"},
    "fused_wide_unrolled": {"DDTREE_ACCEPT_IMPL": "fused", "DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_WIDE": "1",
                            "DDTREE_ACCEPT_SCORE": "unrolled"},
    # session 13: leaf mode forced on at every vocabulary (default only above V = 1024), with the wide and the
    # 8192-logit bf16 chunk, and forced off (the default plan before session 13)
    "fused_leaf": {"DDTREE_ACCEPT_IMPL": "fused", "DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_LEAF": "1"},
    "fused_leaf_narrow": {"DDTREE_ACCEPT_IMPL": "fused", "DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_LEAF": "1",
                          "DDTREE_ACCEPT_WIDE": "0"},
    "fused_noleaf": {"DDTREE_ACCEPT_IMPL": "fused", "DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_LEAF": "0"},
    # leaf mode with the row-list first pass (opt-in)
    "fused_leaf_rows": {"DDTREE_ACCEPT_IMPL": "fused", "DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_LEAF": "2"},
}
ALL_PLANS = list(PLANS)


def _set_plan(monkeypatch: pytest.MonkeyPatch, impl: str) -> None:
    """impl: a key of PLANS ("fused" = the chunked kernel, "one_cta" = its one-CTA variant where it fits, ...)."""
    for name, value in PLANS[impl].items():
        monkeypatch.setenv(name, value)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", ALL_PLANS)
@pytest.mark.parametrize("vocab", [320, 997, 32000, 163840])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_op_matches_reference(vocab: int, dtype: torch.dtype, temp: float, impl: str,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_engine.ops import tree_accept as op

    _set_plan(monkeypatch, impl)
    args = _random_case(3, 24, vocab, dtype, temp, seed=vocab + int(temp * 10))
    _assert_same(op(**args, max_depth=15), tree_accept(**args, max_depth=15))
    _assert_same(op(**args), tree_accept(**args))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", ["fused", "split", "fused_early"])
def test_op_flat_logits_large_tree_and_graph_replay(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_engine.ops import tree_accept as op

    _set_plan(monkeypatch, impl)
    args = _random_case(2, 257, 32000, torch.bfloat16, 1.3, seed=5)
    args["target_logits"] = args["target_logits"].reshape(2 * 257, 32000)
    want = tree_accept(**args, max_depth=40)
    _assert_same(op(**args, max_depth=40), want)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(**args, max_depth=40)
    for _ in range(3):  # the fused plan's arrival counters must be back at zero after every replay
        out.accept_nodes.fill_(-7)
        graph.replay()
        _assert_same(out, want)


@pytest.mark.gpu
@needs_cuda
def test_op_fused_plan_batch_of_64_many_chunks_and_auto_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_engine.ops import tree_accept as op
    from ddtree_engine.ops.tree_accept import resolved_impl

    monkeypatch.delenv("DDTREE_ACCEPT_IMPL", raising=False)
    assert resolved_impl(1024) == "fused" and resolved_impl(1025) == "split"
    with pytest.raises(ValueError, match="n_max <= 1024"):
        resolved_impl(1025, "fused")
    # 64 requests over 19 vocab chunks each: 64 arrival counters, each reached by many CTAs per node.
    args = _random_case(64, 17, 151936, torch.bfloat16, 0.7, seed=11)
    want = tree_accept(**args)
    for _ in range(2):
        _assert_same(op(**args), want)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", ALL_PLANS)
def test_op_small_vocab_trees_all_plans(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The e2e model's shapes (V = 320, 17 and 65 nodes, up to 8 requests) and tiny vocabularies (fewer 16-byte
    vectors per row than a warp has lanes; _random_case needs more tokens than a node has children), greedy and sampled, with and without graph replay."""
    from ddtree_engine.ops import tree_accept as op

    _set_plan(monkeypatch, impl)
    for i, (batch, n_max, vocab, dtype, temp) in enumerate([
            (1, 17, 320, torch.float32, 0.0), (8, 65, 320, torch.float32, 0.0), (8, 65, 320, torch.bfloat16, 0.9),
            (3, 100, 320, torch.float32, 0.5), (4, 9, 12, torch.float32, 0.0), (2, 2, 1, torch.bfloat16, 0.7)]):
        args = _random_case(batch, n_max, vocab, dtype, temp, seed=70 + i)
        _assert_eager_and_graph(op, args, tree_accept(**args), ("accept_nodes",))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", ALL_PLANS)
def test_op_nan_logits_set_the_flag(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_engine import DdtreeDeviceError
    from ddtree_engine.ops import check_errors
    from ddtree_engine.ops import tree_accept as op

    _set_plan(monkeypatch, impl)
    check_errors()
    args = _random_case(1, 8, 997, torch.float32, 0.0, seed=1)
    args["target_logits"][0, 0, 5] = float("nan")
    with pytest.raises(DdtreeDeviceError, match="NaN"):
        op(**args, check=True)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", ["fused_leaf", "fused_leaf_narrow", "fused_leaf_rows", "fused"])
@pytest.mark.parametrize("vocab", [997, 151936])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_op_walks_ending_on_leaves_and_stops(impl: str, vocab: int, dtype: torch.dtype,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Leaf mode (session 13): every internal node's row steered to one child, so every walk ends on a leaf (whose
    row only the second pass reads) or at the depth limit; greedy and sampled requests, ragged trees (num_nodes 1..N,
    budget 0 among them), with graph replay; then a stop id equal to a leaf's target (finished by the bonus) and
    one inside a path (the leaf never decides)."""
    from ddtree_engine.ops import check_errors
    from ddtree_engine.ops import tree_accept as op

    _set_plan(monkeypatch, impl)
    check_errors()
    args = _random_case(6, 40, vocab, dtype, 0.8, seed=vocab + 13)
    args["num_nodes"][0] = 1  # the root alone (itself a leaf, always read): its child lists go too
    args["first_child"][0] = -1
    args["next_sibling"][0] = -1
    gen = torch.Generator().manual_seed(5)
    fc, ns, tok = (args[k].cpu() for k in ("first_child", "next_sibling", "node_token"))
    x = args["target_logits"].float()
    for b in range(fc.shape[0]):
        for i in range(int(args["num_nodes"][b])):
            kids, c = [], int(fc[b, i])
            while c != -1:
                kids.append(c)
                c = int(ns[b, c])
            if kids:
                x[b, i, int(tok[b, kids[int(torch.randint(0, len(kids), (1,), generator=gen))]])] = 60.0
    args["target_logits"] = x.to(dtype)
    args["stop_ids"] = torch.zeros(0, dtype=torch.int32, device="cuda")
    want = tree_accept(**args)
    end = want.accept_nodes.gather(1, (want.accept_len.long() - 1)[:, None])[:, 0]
    on_leaf = [b for b in range(6) if int(end[b]) > 0 and int(fc[b, int(end[b])]) == -1]
    assert len(on_leaf) >= 3, f"walks ending on a leaf: {on_leaf}"
    _assert_eager_and_graph(op, args, want, ("bonus", "committed_ids"))
    b0 = on_leaf[0]
    b1 = next(b for b in on_leaf if int(want.accept_len[b]) >= 3)
    stops = [int(want.bonus[b0]), int(want.committed_ids[b1, 0])]
    args["stop_ids"] = torch.tensor(stops, dtype=torch.int32, device="cuda")
    want = tree_accept(**args)
    assert int(want.finished[b0]) == 1 and int(want.finished[b1]) == 1 and int(want.accept_len[b1]) == 1
    _assert_same(op(**args, check=True), want)  # and no error flag raised by any call above


def _root_only_case(rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """One request per logits row, each tree the root alone: the bonus token is that row's target."""
    batch = rows.shape[0]
    neg = torch.full((batch, 1), -1, dtype=torch.int32, device="cuda")
    return dict(target_logits=rows[:, None].contiguous(), node_token=torch.zeros_like(neg), first_child=neg,
                next_sibling=neg.clone(), num_nodes=torch.ones(batch, dtype=torch.int32, device="cuda"),
                ctx_len=torch.zeros(batch, dtype=torch.int32, device="cuda"),
                temperature=torch.zeros(batch, device="cuda"), seed=torch.zeros(batch, dtype=torch.int64, device="cuda"),
                stop_ids=torch.zeros(0, dtype=torch.int32, device="cuda"))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", ["fused", "fused_packed", "fused_early", "fused_s6"])
@pytest.mark.parametrize("vocab", [151936, 151931])
def test_op_bf16_greedy_ties_zero_infinities_and_nan(impl: str, vocab: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 greedy targets that the packed scoring decides or hands to the compact loop (common.cuh): ties across
    chunks, across one thread's vectors (thread 5 of chunk 0 holds ids 40-47 and 6184-6191) and inside a vector
    (lower id wins), a maximum of zero, rows of -inf and +inf, the vocab's last id, and V = 151,931 (the last
    vector crosses the vocab); random rows tie often at bf16. Each row is a root-only tree: bonus = its target."""
    from ddtree_engine import DdtreeDeviceError
    from ddtree_engine.ops import check_errors
    from ddtree_engine.ops import tree_accept as op

    _set_plan(monkeypatch, impl)
    gen = torch.Generator().manual_seed(vocab)
    x = (torch.randn(16, vocab, generator=gen) * 3).to(torch.bfloat16)
    x[:10] = -5.0
    x[0, [vocab - 2, 70000, 9000, 3]] = 7.0  # -> 3
    x[1, [6185, 41]] = 7.0  # one thread, vectors 3 and 0 -> 41
    x[2, [45, 42]] = 7.0  # one vector -> 42
    x[3, [5000, 100]] = 0.0  # maximum +0 (no -0 in the row) -> 100
    x[4] = float("-inf")  # -> 0
    x[5] = float("-inf")
    x[5, 123456] = -1e30  # -> 123456
    x[6, vocab - 1] = 1.0  # -> the last id
    x[7, [vocab - 1, vocab - 3]] = 2.0  # -> vocab - 3
    x[8, [99999, 100000]] = float("inf")  # -> 99999
    x[9] = -(torch.rand(vocab, generator=gen) * 8 + 2).to(torch.bfloat16)  # all negative
    args = _root_only_case(x.cuda())
    want = tree_accept(**args)
    assert want.bonus[:9].tolist() == [3, 41, 42, 100, 0, 123456, vocab - 1, vocab - 3, 99999]
    check_errors()
    _assert_same(op(**args, check=True), want)
    args["target_logits"][11, 0, 777] = float("nan")
    with pytest.raises(DdtreeDeviceError, match="NaN"):
        op(**args, check=True)
