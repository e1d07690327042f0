"""DDTree decoding over a batch of request slots, and an independent autoregressive reference decoder.

`DDTreeEngine` keeps every piece of per-request state in static device tensors of B rows (one row per
slot). A round is:

    draft (drafter)  -> draft_topk_lse -> build_tree -> tree-masked target forward (tree_attention)
                     -> tree_accept -> kv_commit -> round_update (the per-slot bookkeeping)

all through the injected op backend, with no host sync and no data-dependent shapes, so on CUDA with the
kernel backend the whole round is captured once as a CUDA graph and replayed. Inactive slots run along
with budget 0 and have their state restored by masks (their K/V writes land in scratch slots past their
context). The only host sync is `read_round`, which copies the round's new tokens (and per-slot flags)
to the host in one transfer.

New requests are admitted between rounds: `admit` prefills prompt[:-1] in chunks through the same tree
forward (a chain-shaped tree), and prompt[-1] becomes the first round's root. Finished requests free their
slot, so the server gets continuous batching from the same object.

`ar_generate` is the reference for the lossless tests: one request, the model's plain dense-attention
path, one token per step, no tree, no paging, no engine op except the shared Gumbel noise function."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ddtree_engine.backend import OpBackend
from ddtree_engine.drafter import Drafter
from ddtree_engine.model import DenseKV, TinyTransformer
from ddtree_engine.paged_kv import PagedKVCache

from ddtree_engine.reference.round_update import FINISH_LENGTH, FINISH_NONE, FINISH_STOP  # noqa: F401
FINISH_NAMES = {FINISH_STOP: "stop", FINISH_LENGTH: "length"}


@dataclass
class Request:
    prompt: Sequence[int]
    max_new_tokens: int
    budget: int = 0
    temperature: float = 0.0
    seed: int = 0
    # Keep decoding through stop tokens (SGLang's ignore_eos): they are emitted like any other token.
    ignore_stop: bool = False


@dataclass
class Generation:
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    rounds: int = 0
    accept_lens: list[int] = field(default_factory=list)  # new tokens per round (accepted + bonus)


@dataclass
class RoundOutput:
    """Host view of one round: for each slot that was active, its new tokens and finish state."""

    new_tokens: dict[int, list[int]]
    finished: dict[int, str]  # slot -> "stop" | "length"


def chain_anc(n: int, device: torch.device | str) -> torch.Tensor:
    """Ancestor bitsets [1, n, ceil(n/32)] of a chain: node i sees nodes 0..i (int32 holding u32)."""
    w = max(1, -(-n // 32))
    i = torch.arange(n, device=device)[:, None]
    word = torch.arange(w, device=device)[None, :]
    cnt = (i + 1 - 32 * word).clamp(0, 32)
    val = torch.where(cnt >= 32, torch.full_like(cnt, 0xFFFFFFFF), (1 << cnt.clamp(max=31)) - 1)
    val = torch.where(val >= 1 << 31, val - (1 << 32), val)  # two's complement into int32
    return val.to(torch.int32)[None]


class DDTreeEngine:
    def __init__(
        self,
        model: TinyTransformer,
        drafter: Drafter,
        backend: OpBackend,
        *,
        slots: int,
        max_budget: int,
        max_context: int,
        topk: int | None = None,
        page_size: int = 16,
        stop_ids: Sequence[int] = (),
        prefill_chunk: int = 128,
        cache_seed: int = 0,
    ) -> None:
        if max_budget < 0:
            raise ValueError(f"max_budget must be >= 0, got {max_budget}")
        self.model, self.drafter, self.be = model, drafter, backend
        self.device = model.device
        self.B, self.L = slots, drafter.block_len
        self.max_budget = max_budget
        self.n_max = max_budget + 1
        V = model.cfg.vocab_size
        # The tree can use at most `budget` siblings per position, so K = min(budget, V) loses nothing.
        self.K = topk or max(1, min(max_budget, V))
        self.max_context = max_context
        self.prefill_chunk = prefill_chunk
        self.cache = PagedKVCache(
            n_layers=model.cfg.n_layers, n_kv_heads=model.cfg.n_kv_heads, head_dim=model.cfg.head_dim,
            slots=slots, max_slot_tokens=max_context + self.n_max, page_size=page_size,
            dtype=model.kv_dtype, device=self.device, seed=cache_seed,
        )
        dev, B = self.device, slots
        i32 = dict(dtype=torch.int32, device=dev)
        self.ctx_len = torch.zeros(B, **i32)
        self.root = torch.zeros(B, **i32)
        self.hidden = torch.zeros(B, model.cfg.d_model, dtype=model.act_dtype, device=dev)
        self.budget = torch.zeros(B, **i32)
        self.temperature = torch.zeros(B, dtype=torch.float32, device=dev)
        self.seed = torch.zeros(B, dtype=torch.int64, device=dev)
        self.active = torch.zeros(B, dtype=torch.bool, device=dev)
        self.ignore_stop = torch.zeros(B, dtype=torch.bool, device=dev)
        self.out_len = torch.zeros(B, **i32)
        self.max_new = torch.zeros(B, **i32)
        self.stop_ids = torch.tensor(list(stop_ids), **i32)
        # Round outputs (static buffers, read by read_round): new tokens (-1 padded), count, finish code.
        self.r_tokens = torch.full((B, self.L + 1), -1, **i32)
        self.r_count = torch.zeros(B, **i32)
        self.r_finish = torch.zeros(B, **i32)
        # budget where active, else 0: what build_tree reads. Kept by admit/release and by the fused round
        # tail or commit_update, so the round needs no torch.where(active, budget, 0) kernel; only the split
        # tail's two-op form (DDTREE_SPLIT_TAIL=ops) still masks.
        self.live_budget = torch.zeros(B, **i32)
        self.fused_finish = self._pick_finish(os.environ.get("DDTREE_ROUND_FINISH", ""))
        self.commit_update = self._pick_split_tail(os.environ.get("DDTREE_SPLIT_TAIL", ""))
        self._no_draft = (torch.zeros(B, self.L, self.K, dtype=torch.float32, device=dev),
                          torch.zeros(B, self.L, self.K, **i32))
        self._graph: Any = None
        self.host_active = [False] * B

    def _pick_finish(self, mode: str) -> bool:
        """Whether the round ends with one round_finish launch (tree_accept + kv_commit + round_update) or
        the three ops. DDTREE_ROUND_FINISH=split|fused; default fused where the backend offers it and the
        commit fits one CTA per request (small models), else split."""
        if mode not in ("", "fused", "split"):
            raise ValueError(f"DDTREE_ROUND_FINISH must be fused or split, got {mode!r}")
        if mode == "split" or self.be.round_finish is None:
            if mode == "fused":
                raise ValueError(f"DDTREE_ROUND_FINISH=fused: backend {self.be.name!r} has no fused round tail")
            return False
        from ddtree_engine.ops.round_finish import fits

        ok = fits(self.cache.k, self.cache.v, self.n_max)
        if mode == "fused" and not ok:
            raise ValueError("DDTREE_ROUND_FINISH=fused: this model's commit does not fit one launch")
        return ok

    def _pick_split_tail(self, mode: str) -> bool:
        """Whether the split tail ends with one commit_update op (kv_commit + round_update + the live budget,
        one launch on CUDA) or the two ops and a torch.where budget mask. DDTREE_SPLIT_TAIL=ops|commit_update;
        default commit_update where the backend offers it (one launch up to ops.commit_update.MAX_LAYERS)."""
        if mode not in ("", "ops", "commit_update"):
            raise ValueError(f"DDTREE_SPLIT_TAIL must be ops or commit_update, got {mode!r}")
        if mode == "commit_update" and self.be.commit_update is None:
            raise ValueError(f"DDTREE_SPLIT_TAIL=commit_update: backend {self.be.name!r} has no commit_update")
        return not self.fused_finish and mode != "ops" and self.be.commit_update is not None

    # ---- admission (eager, between rounds) ---------------------------------------------------------
    @torch.inference_mode()
    def admit(self, slot: int, req: Request) -> None:
        prompt = [int(t) for t in req.prompt]
        V = self.model.cfg.vocab_size
        if not prompt:
            raise ValueError("prompt must contain at least one token")
        if any(t < 0 or t >= V for t in prompt):
            raise ValueError(f"prompt token ids must lie in [0, {V})")
        if req.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if len(prompt) + req.max_new_tokens > self.max_context:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({req.max_new_tokens}) exceeds the "
                f"context limit {self.max_context}"
            )
        if not 0 <= req.budget <= self.max_budget:
            raise ValueError(f"budget {req.budget} outside [0, {self.max_budget}]")
        if self.host_active[slot]:
            raise RuntimeError(f"slot {slot} is busy")
        self.ctx_len[slot] = 0
        body = torch.tensor(prompt[:-1], dtype=torch.int32, device=self.device)
        hidden = torch.zeros(self.model.cfg.d_model, dtype=self.hidden.dtype, device=self.device)
        ctx = self.ctx_len[slot : slot + 1]
        bt = self.cache.block_table[slot : slot + 1]
        for s in range(0, body.shape[0], self.prefill_chunk):
            toks = body[s : s + self.prefill_chunk]
            n = toks.shape[0]
            pos = (ctx.long() + torch.arange(n, device=self.device)).to(torch.int32)
            _, hid = self.model.forward_tree(
                self.be, self.cache.k, self.cache.v, bt, toks[None], pos[None], ctx, chain_anc(n, self.device)
            )
            ctx += n
            hidden = hid[0, -1]
        self.hidden[slot] = hidden
        self.root[slot] = prompt[-1]
        self.budget[slot] = req.budget
        self.live_budget[slot] = req.budget
        self.temperature[slot] = req.temperature
        self.seed[slot] = req.seed
        self.ignore_stop[slot] = req.ignore_stop
        self.out_len[slot] = 0
        self.max_new[slot] = req.max_new_tokens
        self.active[slot] = True
        self.host_active[slot] = True

    def release(self, slot: int) -> None:
        """Stop decoding a slot (e.g. client gone, text stop string hit); frees it for admission."""
        self.active[slot] = False
        self.live_budget[slot] = 0
        self.host_active[slot] = False

    # ---- one round (device only) --------------------------------------------------------------------
    def _round(self) -> None:
        be, m = self.be, self.model
        keeps_budget = self.fused_finish or self.commit_update  # the tail zeroes live_budget of stopped slots
        budget = self.live_budget if keeps_budget else torch.where(self.active, self.budget, 0)
        if self.max_budget == 0:
            # Plain decoding (the AR peer): every tree is the root alone whatever the drafts say, so the round
            # skips the drafter and top-k; build_tree reads constant placeholder top-k rows at budget 0.
            top_lp, top_id = self._no_draft
        else:
            drafts = self.drafter.draft(self.root, self.hidden, self.ctx_len)
            top_lp, top_id, _ = be.draft_topk_lse(drafts, self.K)
        tree = be.build_tree(top_lp, top_id, self.root, self.ctx_len, budget, self.n_max)
        logits, hid = m.forward_tree(
            be, self.cache.k, self.cache.v, self.cache.block_table, tree.node_token, tree.positions,
            self.ctx_len, tree.anc,
        )
        if self.fused_finish:  # the three ops below in one launch, plus the live budget
            assert be.round_finish is not None
            be.round_finish(
                logits, tree.node_token, tree.first_child, tree.next_sibling, tree.num_nodes, self.ctx_len,
                self.temperature, self.seed, self.stop_ids, self.cache.k, self.cache.v, self.cache.block_table,
                hid, self.active, self.ignore_stop, self.max_new, self.out_len, self.root, self.hidden,
                self.r_tokens, self.r_count, self.r_finish, self.live_budget,
            )
            return
        acc = be.tree_accept(
            logits, tree.node_token, tree.first_child, tree.next_sibling, tree.num_nodes, self.ctx_len,
            self.temperature, self.seed, self.stop_ids,
        )
        if self.commit_update:  # the two ops below in one launch, plus the live budget
            assert be.commit_update is not None
            be.commit_update(self.cache.k, self.cache.v, self.cache.block_table, acc.accept_len, acc.finished,
                             acc.bonus, acc.committed_ids, acc.accept_nodes, hid, self.active, self.ignore_stop,
                             self.max_new, self.out_len, self.ctx_len, self.root, self.hidden, self.r_tokens,
                             self.r_count, self.r_finish, self.live_budget)
            return
        be.kv_commit(self.cache.k, self.cache.v, self.cache.block_table, acc.accept_nodes, acc.accept_len,
                     self.ctx_len)
        # Tokens to report, finish codes, restored state of inactive slots, next root and hidden state:
        # one op (one launch on CUDA) instead of ~35 small torch ops in the round's graph.
        be.round_update(acc.accept_len, acc.finished, acc.bonus, acc.committed_ids, acc.accept_nodes, hid,
                        self.active, self.ignore_stop, self.max_new, self.out_len, self.ctx_len, self.root,
                        self.hidden, self.r_tokens, self.r_count, self.r_finish)

    def capture_graph(self) -> None:
        """Capture one round as a CUDA graph. Call while no slot is active: the capture's warm-up rounds
        then only touch scratch KV slots and masked state."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        if any(self.host_active):
            raise RuntimeError("capture_graph needs every slot idle")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(2):
                self._round()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph):
            self._round()
        self._graph = graph

    @torch.inference_mode()
    def run_round(self) -> None:
        if self._graph is not None:
            self._graph.replay()
        else:
            self._round()

    def read_round(self) -> RoundOutput:
        """The one host sync per round: new tokens and finish codes of every slot that was active."""
        packed = torch.cat([self.r_count[:, None], self.r_finish[:, None], self.r_tokens], dim=1).cpu().tolist()
        out = RoundOutput(new_tokens={}, finished={})
        for slot, row in enumerate(packed):
            if not self.host_active[slot]:
                continue
            count, fin = row[0], row[1]
            out.new_tokens[slot] = row[2 : 2 + count]
            if fin:
                out.finished[slot] = FINISH_NAMES[fin]
                self.host_active[slot] = False
        return out

    def step(self) -> RoundOutput:
        self.run_round()
        return self.read_round()

    def idle(self) -> bool:
        return not any(self.host_active)

    # ---- batch convenience -------------------------------------------------------------------------
    def generate(
        self, requests: Sequence[Request], on_admit: Callable[[int, int], None] | None = None
    ) -> list[Generation]:
        """Decode `requests` (at most B at a time, continuous batching) and return their generations.
        `on_admit(slot, request_index)` runs just before a request is admitted into a slot."""
        gens = [Generation() for _ in requests]
        pending = list(range(len(requests)))
        owner: dict[int, int] = {}
        while pending or owner:
            for slot in range(self.B):
                if pending and not self.host_active[slot]:
                    idx = pending.pop(0)
                    if on_admit:
                        on_admit(slot, idx)
                    self.admit(slot, requests[idx])
                    owner[slot] = idx
            out = self.step()
            for slot, toks in out.new_tokens.items():
                g = gens[owner[slot]]
                g.tokens += toks
                g.rounds += 1
                g.accept_lens.append(len(toks))
            for slot, reason in out.finished.items():
                gens[owner.pop(slot)].finish_reason = reason
        return gens


# ---- independent autoregressive reference ----------------------------------------------------------
def sample_token(
    logits: torch.Tensor, temperature: float, seed: int, request: int, position: int,
    noise: Callable[..., torch.Tensor] | None = None,
) -> int:
    """Greedy (ties -> lowest id) or Gumbel-max with the engine's counter-based noise."""
    if temperature == 0.0:
        return int(torch.argmax(logits))
    if noise is None:
        from ddtree_engine.reference.tree_accept import gumbel_noise as noise
    V = logits.shape[-1]
    g = noise(seed, request, position, torch.arange(V, device=logits.device))
    t = torch.tensor(temperature, dtype=torch.float32, device=logits.device)
    return int(torch.argmax(logits.float() / t + g.to(logits.device)))


@torch.inference_mode()
def ar_generate(
    model: TinyTransformer,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    request: int = 0,
    stop_ids: Sequence[int] = (),
) -> list[int]:
    """Plain autoregressive decoding of one request with the dense path (the lossless reference).
    `request` is the batch row whose Gumbel noise stream the sampled DDTree run used."""
    kv = DenseKV()
    logits, _ = model.forward_dense(torch.tensor(list(prompt), device=model.device), kv)
    out: list[int] = []
    stops = set(stop_ids)
    while len(out) < max_new_tokens:
        pos = len(prompt) + len(out)  # position of the token being drawn
        tok = sample_token(logits[-1], temperature, seed, request, pos)
        out.append(tok)
        if tok in stops:
            break
        logits, _ = model.forward_dense(torch.tensor([tok], device=model.device), kv)
    return out
