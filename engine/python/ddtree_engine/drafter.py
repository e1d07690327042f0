"""Drafters: one call per round gives logits [B, L, V] for the L positions after each request's root.

Interface (all tensors on the engine's device; static shapes so a round stays CUDA-graph capturable):
    draft(root [B] i32, hidden [B, d], ctx_len [B] i32) -> logits [B, L, V] fp32 (TinyDrafter on a fast-path
    target: the target's act_dtype, e.g. bf16; draft_topk_lse takes both)
`root` is the token the round verifies first (the previous bonus; it sits at position ctx_len), `hidden`
the target's final hidden state at the last committed token (the one whose logits produced the root).
Row b's logit l is the drafter's belief about the token at position ctx_len[b] + 1 + l.

* `TinyDrafter` — the engine's drafter: a small seeded network conditioned on the target's last hidden
  state and the root's embedding (the DFlash idea at toy scale; it reads the target's embedding table and
  lm_head), one forward per round for all L positions. With random weights it rarely agrees with a random
  target; `distill_drafter` trains it on the target's own greedy continuations (seconds on a CPU), after
  which it agrees at ~50% of depth-1 positions. Losslessness never depends on the drafter.
* `OracleDrafter` — test drafter that knows each slot's reference continuation (e.g. the AR decoder's
  output): always right, so a round accepts L + 1 tokens once the budget covers the chain.
* `WrongDrafter` — test drafter whose candidates at every position exclude the reference token: always
  wrong, so a round accepts exactly 1 token (the bonus).
* `NoisyOracleDrafter` — agrees with the reference at a seeded fraction of positions; otherwise the
  reference token gets an ordinary rank. Gives tunable acceptance for benchmarks.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from ddtree_engine.model import TinyTransformer, gemm


class Drafter(Protocol):
    block_len: int

    def draft(self, root: torch.Tensor, hidden: torch.Tensor, ctx_len: torch.Tensor) -> torch.Tensor: ...


class TinyDrafter:
    """DFlash-shaped drafter: one forward per round for all L positions. z = W_h norm(h) + W_r embed(root),
    x_l = z + pos_emb[l], one SwiGLU-free MLP residual block (silu), then the target's final norm scale and
    lm_head: logits [B, L, V]. Its cost therefore includes an L x d x V lm_head GEMM per request, as a real
    DFlash drafter's does.

    Exact targets (CPU, the lossless tests): fp32 weights from a CPU generator, the code path unchanged since
    session 1. Fast targets (exact=False): weights drawn on the target's device, trained in fp32 (`params`),
    run in the target's act_dtype (`refresh` casts them after training), W_h and W_r as one [d, 2d] GEMM,
    torch rms_norm, the target's embedding / final norm / lm_head device tensors shared (no copies); logits in
    act_dtype (draft_topk_lse takes bf16 and fp32)."""

    def __init__(self, target: TinyTransformer, block_len: int = 7, seed: int = 1, ffn_dim: int = 128) -> None:
        if block_len < 1:
            raise ValueError(f"block_len must be >= 1, got {block_len}")
        self.block_len = block_len
        # The fused bf16-capable path follows the target's (model.fast); otherwise the fp32 path of sessions 1-8.
        self.fast = target.fast
        d = target.cfg.d_model
        self.d = d
        self.eps = target.cfg.norm_eps
        dev = target.device
        if self.fast:
            g = torch.Generator(device=dev).manual_seed(seed)

            def dnormal(*shape: int, std: float) -> torch.Tensor:
                return torch.randn(*shape, generator=g, device=dev) * std

            # fp32 masters (trained by the distill functions); w_in = [W_h | W_r].
            self.params = {
                "w_in": dnormal(d, 2 * d, std=d**-0.5), "pos_emb": dnormal(block_len, d, std=1.0),
                "w1": dnormal(ffn_dim, d, std=d**-0.5), "w2": dnormal(d, ffn_dim, std=ffn_dim**-0.5),
            }
            self.embed = target.f["embed"]
            self.lm_head = target.f["lm_head"]
            self.final_norm = target.f["final_norm"]
            self.dtype = target.act_dtype
            self.refresh()
            return
        g = torch.Generator().manual_seed(seed)

        def normal(*shape: int, std: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * std).to(dev)

        self.w_hidden = normal(d, d, std=d**-0.5)
        self.w_root = normal(d, d, std=d**-0.5)
        self.pos_emb = normal(block_len, d, std=1.0)
        self.w1 = normal(ffn_dim, d, std=d**-0.5)
        self.w2 = normal(d, ffn_dim, std=ffn_dim**-0.5)
        self.embed = target.weights["embed"].to(dev)
        self.lm_head = target.weights["lm_head"].to(dev)
        self.final_norm = target.weights["final_norm"].to(dev)

    def trainable(self) -> list[torch.Tensor]:
        if self.fast:
            return list(self.params.values())
        return [self.w_hidden, self.w_root, self.pos_emb, self.w1, self.w2]

    def refresh(self) -> None:
        """Fast drafters: the act_dtype copies draft() runs on, from the fp32 masters (after training)."""
        if self.fast:
            self.run_w = {k: v.detach().to(self.dtype) for k, v in self.params.items()}

    def weight_bytes(self) -> int:
        """Bytes of weights one draft() reads (its own matrices + the shared final norm and lm_head)."""
        if not self.fast:
            own = sum(t.numel() * t.element_size() for t in self.trainable())
        else:
            own = sum(t.numel() * t.element_size() for t in self.run_w.values())
        return own + sum(t.numel() * t.element_size() for t in (self.final_norm, self.lm_head))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def logits(self, root: torch.Tensor, hidden: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
        """Fast drafters: [B, L, V] logits (lm_head's dtype) with weights `w` (run_w, or the fp32 params
        while training: gradients flow through the casts)."""
        B, L, d = root.shape[0], self.block_len, self.d
        dt = w["w1"].dtype
        rms = torch.nn.functional.rms_norm
        z = torch.cat([rms(hidden.to(dt), (d,), None, self.eps), self.embed[root.long()].to(dt)], dim=-1)
        x = (gemm(z, w["w_in"])[:, None, :] + w["pos_emb"][None]).reshape(B * L, d)
        x = gemm(torch.nn.functional.silu(gemm(rms(x, (d,), None, self.eps), w["w1"])), w["w2"], residual=x)
        h = rms(x.to(self.lm_head.dtype), (d,), self.final_norm, self.eps)
        return gemm(h, self.lm_head).view(B, L, -1)

    def train_logits(self, root: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        if self.fast:
            return self.logits(root, hidden, self.params)
        return self.draft(root, hidden, root)

    def draft(self, root: torch.Tensor, hidden: torch.Tensor, ctx_len: torch.Tensor) -> torch.Tensor:
        if self.fast:
            return self.logits(root, hidden, self.run_w)
        z = self._norm(hidden.float()) @ self.w_hidden.t() + self.embed[root.long()] @ self.w_root.t()
        x = z[:, None, :] + self.pos_emb[None]  # [B, L, d]
        x = x + torch.nn.functional.silu(self._norm(x) @ self.w1.t()) @ self.w2.t()
        return (self._norm(x) * self.final_norm) @ self.lm_head.t()


def _fit(drafter: TinyDrafter, H: torch.Tensor, R: torch.Tensor, Y: torch.Tensor, train: torch.Tensor,
         held: torch.Tensor, steps: int, batch: int, lr: float, g: torch.Generator) -> dict[str, float]:
    """Adam on the drafter's own weights (not the shared embedding / lm_head): cross-entropy of
    (h_t, s_{t+1}) -> s_{t+2..t+1+L}; returns held-out top-1 agreement per depth."""
    dev = H.device
    V = drafter.lm_head.shape[0]
    params = drafter.trainable()
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=lr)
    try:
        for _ in range(steps):
            idx = train[torch.randint(0, train.shape[0], (batch,), generator=g).to(dev)]
            logits = drafter.train_logits(R[idx], H[idx])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V).float(), Y[idx].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        for p in params:
            p.requires_grad_(False)
    drafter.refresh()
    with torch.no_grad():
        hits = torch.zeros(drafter.block_len, device=dev)
        for s in range(0, held.shape[0], batch):
            h = held[s : s + batch]
            hits += (drafter.draft(R[h], H[h], R[h]).argmax(-1) == Y[h]).float().sum(0)
        agree = hits / max(1, held.shape[0])
    return {f"depth{i + 1}": float(a) for i, a in enumerate(agree)}


def distill_drafter(
    target: TinyTransformer, drafter: TinyDrafter, *, sequences: int = 48, tokens: int = 160,
    steps: int = 400, batch: int = 256, lr: float = 3e-3, seed: int = 0,
) -> dict[str, float]:
    """Train `drafter` (in place) to predict the target's own greedy continuations, DFlash-style at toy
    scale: decode `sequences` random byte prompts greedily with the target, then fit the drafter's
    weights (not the shared embedding / lm_head) on (hidden state h_t, token s_{t+1}) -> s_{t+2..t+1+L}
    with cross-entropy. A random-weight drafter almost never agrees with a random-weight target; a few
    hundred CPU steps make DDTree rounds accept ~2 tokens. Returns held-out top-1 agreement per depth.
    Token by token through the dense path: the small model's route (CPU tests, the server); on a GPU with a
    large target use `distill_drafter_batched`."""
    from ddtree_engine.decode import ar_generate
    from ddtree_engine.model import DenseKV

    L = drafter.block_len
    g = torch.Generator().manual_seed(seed)
    hs, roots, ys = [], [], []
    with torch.inference_mode():
        for _ in range(sequences):
            prompt = torch.randint(0, 256, (int(torch.randint(1, 16, (1,), generator=g)),), generator=g).tolist()
            seq = prompt + ar_generate(target, prompt, tokens)
            _, hid = target.forward_dense(torch.tensor(seq, device=target.device), DenseKV())
            for t in range(len(prompt) - 1, len(seq) - L - 2):
                hs.append(hid[t])
                roots.append(seq[t + 1])
                ys.append(seq[t + 2 : t + 2 + L])
    dev = drafter.lm_head.device
    H = torch.stack(hs).to(dev)
    H = H.clone() if drafter.fast else H.float()  # (inference tensors cannot be saved for backward)
    R = torch.tensor(roots, device=dev)
    Y = torch.tensor(ys, device=dev)
    perm = torch.randperm(H.shape[0], generator=g).to(dev)
    cut = int(0.9 * H.shape[0])
    return _fit(drafter, H, R, Y, perm[:cut], perm[cut:], steps, batch, lr, g)


def distill_drafter_batched(
    target: TinyTransformer, drafter: TinyDrafter, backend: object, *, sequences: int = 128, tokens: int = 128,
    steps: int = 300, batch: int = 64, lr: float = 2e-3, seed: int = 0, held_out: float = 0.125,
) -> dict[str, float]:
    """distill_drafter for large targets on a GPU: the target's greedy continuations of `sequences` random
    prompts come from ONE budget-0 DDTreeEngine over all of them at once (a CUDA-graph round per token, every
    prompt a batch row; no drafter call at budget 0), recording each round's (root, hidden) on the device;
    then the same fit. Held-out = whole sequences (the last `held_out` fraction of the prompts), not positions
    of training sequences. Returns held-out top-1 agreement per depth (plus `samples`, `gen_s`, `fit_s`)."""
    import time

    from ddtree_engine.decode import DDTreeEngine, Request

    L, V, dev = drafter.block_len, target.cfg.vocab_size, target.device
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, 33, (sequences,), generator=g).tolist()
    prompts = [torch.randint(0, V, (k,), generator=g).tolist() for k in lens]
    t0 = time.perf_counter()
    eng = DDTreeEngine(target, drafter, backend, slots=sequences, max_budget=0,  # type: ignore[arg-type]
                       max_context=max(lens) + tokens + 2)
    if dev.type == "cuda" and getattr(backend, "graph_safe", False):
        eng.capture_graph()
    for s, p in enumerate(prompts):
        eng.admit(s, Request(p, tokens + 1))
    roots, hiddens = [], []
    with torch.inference_mode():
        for _ in range(tokens):
            roots.append(eng.root.clone())
            hiddens.append(eng.hidden.clone())
            eng.run_round()
        roots.append(eng.root.clone())
    for s in range(sequences):
        eng.release(s)
    R_all = torch.stack(roots, 1).long()  # [S, T + 1]: the greedy sequence from each prompt's last token
    H_all = torch.stack(hiddens, 1)  # [S, T, d]: the hidden state that produced roots[:, t]
    if dev.type == "cuda":
        torch.cuda.synchronize()
    gen_s = time.perf_counter() - t0
    T = tokens - L  # rounds t with L known successors roots[t+1 .. t+L]
    idx = torch.arange(T, device=dev)[:, None] + torch.arange(1, L + 1, device=dev)[None, :]  # [T, L]
    Y = R_all[:, idx].reshape(-1, L)
    R = R_all[:, :T].reshape(-1)
    H = H_all[:, :T].reshape(-1, H_all.shape[-1]).clone()
    n_held = max(1, int(sequences * held_out))
    rows = torch.arange(sequences * T, device=dev).view(sequences, T)
    train, held = rows[: sequences - n_held].reshape(-1), rows[sequences - n_held :].reshape(-1)
    del eng
    t1 = time.perf_counter()
    out = _fit(drafter, H, R, Y, train, held, steps, batch, lr, g)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    out.update(samples=float(train.shape[0]), gen_s=gen_s, fit_s=time.perf_counter() - t1)
    return out


class _ReferenceDrafter:
    """Shared plumbing: per-slot reference sequences (prompt + continuation) in a device tensor."""

    def __init__(self, vocab_size: int, block_len: int, slots: int, max_len: int, device: str | torch.device) -> None:
        self.block_len = block_len
        self.vocab_size = vocab_size
        self.ref = torch.full((slots, max_len), -1, dtype=torch.int64, device=device)
        self._offsets = torch.arange(1, block_len + 1, device=device)

    def set_reference(self, slot: int, tokens: list[int]) -> None:
        if len(tokens) > self.ref.shape[1]:
            raise ValueError(f"reference of {len(tokens)} tokens > max_len {self.ref.shape[1]}")
        self.ref[slot].fill_(-1)
        self.ref[slot, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)

    def _targets(self, ctx_len: torch.Tensor) -> torch.Tensor:
        """[B, L] reference tokens at positions ctx_len + 1 .. ctx_len + L (-1 where unknown)."""
        idx = (ctx_len.long()[:, None] + self._offsets[None]).clamp(max=self.ref.shape[1] - 1)
        return torch.gather(self.ref, 1, idx)

    def _noise(self, ctx_len: torch.Tensor, salt: int, vocab: int | None = None) -> torch.Tensor:
        """Deterministic pseudo-random values in [0, 1) per (row, position, vocab id) — a small
        integer hash kept inside int64 without overflow. `vocab` = only the first ids (same values)."""
        B = ctx_len.shape[0]
        pos = ctx_len.long()[:, None, None] + self._offsets[None, :, None]
        row = torch.arange(B, device=ctx_len.device)[:, None, None]
        vid = torch.arange(vocab or self.vocab_size, device=ctx_len.device)[None, None, :]
        h = (pos * 7919 + row * 104729 + vid * 31 + salt) % 2147483647
        h = (h * 48271) % 2147483647
        h = (h * 48271) % 2147483647
        return h.to(torch.float32) / 2147483647.0


class OracleDrafter(_ReferenceDrafter):
    def draft(self, root: torch.Tensor, hidden: torch.Tensor, ctx_len: torch.Tensor) -> torch.Tensor:
        tgt = self._targets(ctx_len)
        logits = torch.full((tgt.shape[0], self.block_len, self.vocab_size), -20.0, device=tgt.device)
        return logits.scatter(2, tgt.clamp(min=0)[..., None], 20.0)


class WrongDrafter(_ReferenceDrafter):
    def draft(self, root: torch.Tensor, hidden: torch.Tensor, ctx_len: torch.Tensor) -> torch.Tensor:
        tgt = self._targets(ctx_len)
        logits = self._noise(ctx_len, salt=11) * 4.0
        return logits.scatter(2, tgt.clamp(min=0)[..., None], float("-inf"))


class NoisyOracleDrafter(_ReferenceDrafter):
    """`dtype`: the logits' dtype it emits. fp32 by default; bf16 stands in for a drafter that computes in bf16
    (its lm_head GEMM writes bf16, as TinyDrafter's does at act_dtype bf16): the same fp32 values rounded to bf16
    once, so draft_topk_lse reads half the bytes. The rounding ties many noise values (spacing 2^-6 below 4.0),
    as a real bf16 drafter's logits tie; draft_topk_lse takes the lower id at a tie."""

    def __init__(self, *args: object, agree: float = 0.7, dtype: torch.dtype = torch.float32, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.agree = agree
        self.dtype = dtype
        # The boost that makes the reference token top-1 also sets its log-prob against the noise mass of the
        # other V - 1 ids (logsumexp ~ ln V): 8.0 calibrated at V = 320 gives lp ~ -0.2 there but ~ -4.5 at
        # V = 151,936, where best-first trees then stop growing deep. + ln(V / 320) keeps lp ~ -0.2 at any V
        # (exactly 8.0 for V <= 320, so the small-vocabulary tests draft the same logits as before).
        self.boost = 8.0 + max(0.0, math.log(self.vocab_size / 320))

    def draft(self, root: torch.Tensor, hidden: torch.Tensor, ctx_len: torch.Tensor) -> torch.Tensor:
        tgt = self._targets(ctx_len)
        logits = self._noise(ctx_len, salt=23) * 4.0
        coin = self._noise(ctx_len, salt=97, vocab=1)  # one coin per (row, position): vocab id 0's value
        boost = torch.where(coin < self.agree, self.boost, 0.0)
        return logits.scatter_add(2, tgt.clamp(min=0)[..., None], boost).to(self.dtype)
