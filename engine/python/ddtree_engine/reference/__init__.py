"""Readable pure-PyTorch versions of every kernel (CPU and GPU), same signatures as `ddtree_engine.ops`.

Names resolve lazily (one module per op: reference/<op>.py)."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "draft_topk_lse": "draft_topk_lse",
    "build_tree": "build_tree",
    "BuildTreeOutput": "build_tree",
    "tree_attention": "tree_attention",
    "tree_accept": "tree_accept",
    "AcceptOutput": "tree_accept",
    "gumbel_noise": "tree_accept",
    "kv_commit": "kv_commit",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddtree_engine.reference' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
