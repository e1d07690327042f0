"""round_finish over libddtree (semantics: reference/round_finish.py): tree_accept, kv_commit and
round_update in ONE kernel launch — the accept's last CTA per request also moves the accepted K/V rows of
every layer and does the slot bookkeeping. Only for small commits (`fits`); the decode loop keeps the three
launches otherwise."""

from __future__ import annotations

import ctypes

import torch

from ddtree_engine import _lib
from ddtree_engine.ops.tree_accept import FUSED_MAX_NODES, launch_args
from ddtree_engine.ops._common import arrival_counters, cuda_device_of, error_flags, ptr, require, stream_handle
from ddtree_engine.reference.tree_accept import AcceptOutput

MAX_LAYERS = 32  # DDTREE_ROUND_FINISH_MAX_LAYERS
MAX_PAIRS = 2048  # DDTREE_ROUND_FINISH_MAX_PAIRS


class _Tail(ctypes.Structure):
    _fields_ = [  # ddtree_round_tail_t
        ("k_caches", ctypes.c_void_p), ("v_caches", ctypes.c_void_p), ("num_layers", ctypes.c_int32),
        ("num_pages", ctypes.c_int32), ("page_size", ctypes.c_int32), ("max_pages", ctypes.c_int32),
        ("kv_row_bytes", ctypes.c_int64), ("block_table", ctypes.c_void_p), ("hid", ctypes.c_void_p),
        ("hid_rows", ctypes.c_int32), ("hid_row_bytes", ctypes.c_int64), ("active", ctypes.c_void_p),
        ("ignore_stop", ctypes.c_void_p), ("max_new", ctypes.c_void_p), ("out_len", ctypes.c_void_p),
        ("ctx_len", ctypes.c_void_p), ("root", ctypes.c_void_p), ("hidden", ctypes.c_void_p),
        ("r_tokens", ctypes.c_void_p), ("tokens_width", ctypes.c_int32), ("r_count", ctypes.c_void_p),
        ("r_finish", ctypes.c_void_p), ("live_budget", ctypes.c_void_p),
    ]


def _fn() -> object:
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    return _lib.function(
        "ddtree_round_finish",
        [vp, ctypes.c_int, i32, i32, i32, i64, i64, vp, vp, vp, vp, vp, vp, vp, vp, i32, i32, vp, vp, vp, vp, vp,
         vp, ctypes.c_size_t, ctypes.POINTER(_Tail), vp, vp, vp],
    )


def _unit(nbytes: int, tensors: list[torch.Tensor]) -> int:
    bits = nbytes
    for t in tensors:
        bits |= t.data_ptr()
    return 16 if bits % 16 == 0 else 4 if bits % 4 == 0 else 1


def fits(k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], n_max: int) -> bool:
    """Whether one launch can take this round's tail: tree_accept's fused plan holds the tree (n_max) and
    one CTA per request moves every layer's accepted rows (layers x row bytes, see round_finish.h)."""
    if not k_caches or n_max > FUSED_MAX_NODES or len(k_caches) > MAX_LAYERS:
        return False
    row_bytes = k_caches[0][0, 0].numel() * k_caches[0].element_size()
    unit = _unit(row_bytes, list(k_caches) + list(v_caches))
    return 2 * len(k_caches) * (row_bytes // unit) <= MAX_PAIRS


def round_finish(target_logits: torch.Tensor, node_token: torch.Tensor, first_child: torch.Tensor,
                 next_sibling: torch.Tensor, num_nodes: torch.Tensor, ctx_len: torch.Tensor,
                 temperature: torch.Tensor, seed: torch.Tensor, stop_ids: torch.Tensor,
                 k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], block_table: torch.Tensor,
                 hid: torch.Tensor, active: torch.Tensor, ignore_stop: torch.Tensor, max_new: torch.Tensor,
                 out_len: torch.Tensor, root: torch.Tensor, hidden: torch.Tensor, r_tokens: torch.Tensor,
                 r_count: torch.Tensor, r_finish: torch.Tensor,
                 live_budget: torch.Tensor | None = None) -> AcceptOutput:
    """Same arguments and effects as reference.round_finish (target_logits [B, N, V] or [B*N, V])."""
    require(node_token.dim() == 2, f"node_token must be [B, N], got shape {tuple(node_token.shape)}")
    batch, n_max = node_token.shape
    require(0 < len(k_caches) <= MAX_LAYERS and len(v_caches) in (0, len(k_caches)),
            f"round_finish takes 1..{MAX_LAYERS} K caches and as many V caches (or none)")
    shape, dtype = k_caches[0].shape, k_caches[0].dtype
    for c in list(k_caches) + list(v_caches):
        require(c.shape == shape and c.dtype == dtype and c.is_contiguous(),
                "caches must be contiguous and share shape and dtype")
    require(block_table.dim() == 2 and block_table.shape[0] == batch and block_table.dtype == torch.int32
            and block_table.is_contiguous(), f"block_table must be a contiguous [{batch}, P] int32 tensor")
    require(hid.dim() == 3 and hid.shape[:2] == (batch, n_max) and hid.is_contiguous(),
            f"hid must be a contiguous [{batch}, {n_max}, D] tensor")
    require(hidden.shape == (batch, hid.shape[2]) and hidden.dtype == hid.dtype and hidden.is_contiguous(),
            "hidden must be a contiguous [B, D] tensor of hid's dtype")
    for name, t in (("max_new", max_new), ("out_len", out_len), ("root", root), ("r_count", r_count),
                    ("r_finish", r_finish)) + ((("live_budget", live_budget),) if live_budget is not None else ()):
        require(tuple(t.shape) == (batch,) and t.dtype == torch.int32 and t.is_contiguous(),
                f"{name} must be a contiguous [{batch}] int32 tensor")
    for name, t in (("active", active), ("ignore_stop", ignore_stop)):
        require(tuple(t.shape) == (batch,) and t.dtype == torch.bool and t.is_contiguous(),
                f"{name} must be a contiguous [{batch}] bool tensor")
    require(r_tokens.dim() == 2 and r_tokens.shape[0] == batch and r_tokens.dtype == torch.int32
            and r_tokens.is_contiguous(), f"r_tokens must be a contiguous [{batch}, T] int32 tensor")
    require(fits(k_caches, v_caches, n_max), "round_finish: commit too large for one CTA (see fits())")
    device = cuda_device_of(target_logits, node_token, block_table, hid, active, hidden, r_tokens, *k_caches)
    out = AcceptOutput(*(torch.empty((batch, n_max) if i in (0, 2) else (batch,), dtype=torch.int32, device=device)
                         for i in range(5)))
    if batch == 0:
        return out
    # `workspace` stays referenced until the launch below.
    args, _, workspace = launch_args(target_logits, node_token, first_child, next_sibling, num_nodes, ctx_len,
                                     temperature, seed, stop_ids, n_max, out)
    row_bytes = k_caches[0][0, 0].numel() * k_caches[0].element_size()
    layers = len(k_caches)
    k_ptrs = (ctypes.c_void_p * layers)(*[t.data_ptr() for t in k_caches])
    v_ptrs = (ctypes.c_void_p * layers)(*[t.data_ptr() for t in v_caches]) if v_caches else None
    tail = _Tail(
        ctypes.cast(k_ptrs, ctypes.c_void_p), ctypes.cast(v_ptrs, ctypes.c_void_p) if v_ptrs else None, layers,
        shape[0], shape[1], block_table.shape[1], row_bytes, block_table.data_ptr(), hid.data_ptr(), n_max,
        hid.shape[2] * hid.element_size(), active.data_ptr(), ignore_stop.data_ptr(), max_new.data_ptr(),
        out_len.data_ptr(), ctx_len.data_ptr(), root.data_ptr(), hidden.data_ptr(), r_tokens.data_ptr(),
        r_tokens.shape[1], r_count.data_ptr(), r_finish.data_ptr(),
        live_budget.data_ptr() if live_budget is not None else None,
    )
    counters = arrival_counters("tree_accept", device, batch)  # shared with tree_accept: same stream order
    with torch.cuda.device(device):
        status = _fn()(*args, ctypes.byref(tail), ptr(counters), ptr(error_flags(device)),  # type: ignore[operator]
                       stream_handle(device))
    _lib.check(status, "ddtree_round_finish")
    return out
