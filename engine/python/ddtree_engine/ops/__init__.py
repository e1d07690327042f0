"""Torch ops over libddtree's kernels. Same signatures as `ddtree_engine.reference`.

Each op lives in ops/<op>.py; names are resolved lazily so that importing this package costs nothing
and one op's module never blocks another's."""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module (ops/<module>.py) that defines it
_EXPORTS = {
    "draft_topk_lse": "draft_topk_lse",
    "build_tree": "build_tree",
    "BuildTreeOutput": "build_tree",
    "tree_attention": "tree_attention",
    "tree_accept": "tree_accept",
    "AcceptOutput": "tree_accept",
    "kv_commit": "kv_commit",
    "error_flags": "_common",
    "check_errors": "_common",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddtree_engine.ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
