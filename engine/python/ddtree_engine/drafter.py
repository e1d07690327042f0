"""Drafters: one call per round gives logits [B, L, V] for the L positions after each request's root.

Interface (all tensors on the engine's device; static shapes so a round stays CUDA-graph capturable):
    draft(root [B] i32, hidden [B, d] fp32, ctx_len [B] i32) -> logits [B, L, V] fp32
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

from typing import Protocol

import torch

from ddtree_engine.model import TinyTransformer


class Drafter(Protocol):
    block_len: int

    def draft(self, root: torch.Tensor, hidden: torch.Tensor, ctx_len: torch.Tensor) -> torch.Tensor: ...


class TinyDrafter:
    def __init__(self, target: TinyTransformer, block_len: int = 7, seed: int = 1, ffn_dim: int = 128) -> None:
        if block_len < 1:
            raise ValueError(f"block_len must be >= 1, got {block_len}")
        self.block_len = block_len
        d = target.cfg.d_model
        g = torch.Generator().manual_seed(seed)
        dev = target.device

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
        self.eps = target.cfg.norm_eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def draft(self, root: torch.Tensor, hidden: torch.Tensor, ctx_len: torch.Tensor) -> torch.Tensor:
        z = self._norm(hidden.float()) @ self.w_hidden.t() + self.embed[root.long()] @ self.w_root.t()
        x = z[:, None, :] + self.pos_emb[None]  # [B, L, d]
        x = x + torch.nn.functional.silu(self._norm(x) @ self.w1.t()) @ self.w2.t()
        return (self._norm(x) * self.final_norm) @ self.lm_head.t()


def distill_drafter(
    target: TinyTransformer, drafter: TinyDrafter, *, sequences: int = 48, tokens: int = 160,
    steps: int = 400, batch: int = 256, lr: float = 3e-3, seed: int = 0,
) -> dict[str, float]:
    """Train `drafter` (in place) to predict the target's own greedy continuations, DFlash-style at toy
    scale: decode `sequences` random byte prompts greedily with the target, then fit the drafter's
    weights (not the shared embedding / lm_head) on (hidden state h_t, token s_{t+1}) -> s_{t+2..t+1+L}
    with cross-entropy. A random-weight drafter almost never agrees with a random-weight target; a few
    hundred CPU steps make DDTree rounds accept ~2 tokens. Returns held-out top-1 agreement per depth."""
    from ddtree_engine.decode import ar_generate
    from ddtree_engine.model import DenseKV

    L, V = drafter.block_len, target.cfg.vocab_size
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
    dev = drafter.w1.device
    H = torch.stack(hs).float().to(dev)
    R = torch.tensor(roots, device=dev)
    Y = torch.tensor(ys, device=dev)
    perm = torch.randperm(H.shape[0], generator=g).to(dev)
    cut = int(0.9 * H.shape[0])
    train, held = perm[:cut], perm[cut:]
    params = [drafter.w_hidden, drafter.w_root, drafter.pos_emb, drafter.w1, drafter.w2]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=lr)
    try:
        for _ in range(steps):
            idx = train[torch.randint(0, cut, (batch,), generator=g).to(dev)]
            logits = drafter.draft(R[idx], H[idx], R[idx])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), Y[idx].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        for p in params:
            p.requires_grad_(False)
    with torch.no_grad():
        agree = (drafter.draft(R[held], H[held], R[held]).argmax(-1) == Y[held]).float().mean(0)
    return {f"depth{i + 1}": float(a) for i, a in enumerate(agree)}


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

    def _noise(self, ctx_len: torch.Tensor, salt: int) -> torch.Tensor:
        """Deterministic pseudo-random values in [0, 1) per (row, position, vocab id) — a small
        integer hash kept inside int64 without overflow."""
        B = ctx_len.shape[0]
        pos = ctx_len.long()[:, None, None] + self._offsets[None, :, None]
        row = torch.arange(B, device=ctx_len.device)[:, None, None]
        vid = torch.arange(self.vocab_size, device=ctx_len.device)[None, None, :]
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
    def __init__(self, *args: object, agree: float = 0.7, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.agree = agree

    def draft(self, root: torch.Tensor, hidden: torch.Tensor, ctx_len: torch.Tensor) -> torch.Tensor:
        tgt = self._targets(ctx_len)
        logits = self._noise(ctx_len, salt=23) * 4.0
        coin = self._noise(ctx_len, salt=97)[..., :1]  # one coin per (row, position)
        boost = torch.where(coin < self.agree, 8.0, 0.0)
        return logits.scatter_add(2, tgt.clamp(min=0)[..., None], boost)
