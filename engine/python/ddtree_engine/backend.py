"""The six DDTree ops as one injectable object.

The decoding loop never imports an op directly: it calls `backend.<op>`. `reference_backend()` binds the
readable PyTorch versions (`ddtree_engine.reference`, CPU or GPU); `cuda_backend()` binds the libddtree
kernels (`ddtree_engine.ops`). Tests can also build a backend that mixes the two, e.g. CUDA ops for
everything but attention (see `mixed_backend`)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

OP_NAMES = ("draft_topk_lse", "build_tree", "tree_attention", "tree_accept", "kv_commit", "round_update")


@dataclass(frozen=True)
class OpBackend:
    name: str
    draft_topk_lse: Callable[..., Any]
    build_tree: Callable[..., Any]
    tree_attention: Callable[..., Any]
    tree_accept: Callable[..., Any]
    kv_commit: Callable[..., Any]
    round_update: Callable[..., Any]
    # True when every op can be captured in a CUDA graph (no host sync, no allocation on the host side).
    graph_safe: bool = False
    # tree_accept + kv_commit + round_update in one launch (ops.round_finish), offered only where those three
    # are this backend's CUDA kernels; the decode loop uses it when the commit fits (ops.round_finish.fits).
    round_finish: Callable[..., Any] | None = None
    # kv_commit + round_update + the live budget in one op (reference/commit_update.py): the split tail's
    # one launch on the CUDA backend; dropped by mixed_backend when kv_commit or round_update is replaced.
    commit_update: Callable[..., Any] | None = None
    # The model layer's RoPE + K/V cache write + q in one op (reference/qkv_prep.py), used by the model's fast
    # path when present (its old torch sequence otherwise): the reference on the reference backend, the
    # libddtree kernel on the CUDA one. Not one of the decode loop's ops, so it is not in OP_NAMES.
    qkv_prep: Callable[..., Any] | None = None


def _load(package: str) -> dict[str, Callable[..., Any]]:
    # Each op lives in <package>/<op>.py under the op's own name. Read it from that module: once the
    # submodule has been imported, the package attribute of the same name is the module, not the function.
    return {op: getattr(importlib.import_module(f"{package}.{op}"), op) for op in OP_NAMES}


def reference_backend() -> OpBackend:
    from ddtree_engine.reference.commit_update import commit_update
    from ddtree_engine.reference.qkv_prep import qkv_prep

    return OpBackend(name="reference", graph_safe=False, qkv_prep=qkv_prep, commit_update=commit_update,
                     **_load("ddtree_engine.reference"))


def cuda_backend() -> OpBackend:
    from ddtree_engine.ops.commit_update import commit_update
    from ddtree_engine.ops.qkv_prep import qkv_prep
    from ddtree_engine.ops.round_finish import round_finish

    return OpBackend(name="cuda", graph_safe=True, round_finish=round_finish, qkv_prep=qkv_prep,
                     commit_update=commit_update, **_load("ddtree_engine.ops"))


def mixed_backend(name: str, base: OpBackend, **overrides: Callable[..., Any]) -> OpBackend:
    """`base` with some ops replaced (a backend whose ops are not all graph-safe is not graph-safe)."""
    ops = {op: overrides.get(op, getattr(base, op)) for op in OP_NAMES}  # (qkv_prep may be overridden too)
    # The fused round tail stands for base's tree_accept, kv_commit and round_update: dropped if any is replaced.
    keep = not {"tree_accept", "kv_commit", "round_update"} & set(overrides)
    keep_tail = not {"kv_commit", "round_update"} & set(overrides)  # likewise commit_update
    return OpBackend(name=name, graph_safe=base.graph_safe and not overrides,
                     round_finish=base.round_finish if keep else None,
                     commit_update=base.commit_update if keep_tail else None,
                     qkv_prep=overrides.get("qkv_prep", base.qkv_prep), **ops)


def default_backend(device: Any) -> OpBackend:
    """CUDA kernels on a CUDA device, the references elsewhere."""
    import torch

    return cuda_backend() if torch.device(device).type == "cuda" else reference_backend()
