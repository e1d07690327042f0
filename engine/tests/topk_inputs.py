"""Logits of the shapes draft_topk_lse must survive, shared by the GPU tests and the CPU emulation."""

from __future__ import annotations

import torch

INF = float("inf")
KINDS = ("normal", "ties", "dyadic", "neginf")


def make_logits(shape: tuple[int, ...], kind: str, gen: torch.Generator) -> torch.Tensor:
    """float32 CPU logits: `normal` (wide spread), `ties` (4 values: many equal logits), `dyadic`
    (exactly representable steps: exact log-prob ties), `neginf` (20% -inf, like a padded vocab)."""
    if kind == "normal":
        return torch.randn(shape, generator=gen) * 4
    if kind == "ties":
        return torch.randint(0, 4, shape, generator=gen).float()
    if kind == "dyadic":
        return torch.randint(0, 16, shape, generator=gen).float() * 0.25 - 2
    if kind == "neginf":
        x = torch.randn(shape, generator=gen) * 3
        x[torch.rand(shape, generator=gen) < 0.2] = -INF
        return x
    raise AssertionError(f"unknown logits kind {kind!r}")
