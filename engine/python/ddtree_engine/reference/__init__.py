"""Readable pure-PyTorch versions of every kernel (CPU and GPU), same signatures as `ddtree_engine.ops`.

Imported eagerly so that `ddtree_engine.reference.<op>` is always the function, never the submodule."""

from ddtree_engine.reference.build_tree import BuildTreeOutput, build_tree
from ddtree_engine.reference.commit_update import commit_update
from ddtree_engine.reference.draft_topk_lse import draft_topk_lse
from ddtree_engine.reference.kv_commit import kv_commit
from ddtree_engine.reference.qkv_prep import qkv_prep
from ddtree_engine.reference.round_finish import round_finish
from ddtree_engine.reference.round_update import round_update
from ddtree_engine.reference.tree_accept import AcceptOutput, gumbel_noise, tree_accept
from ddtree_engine.reference.tree_attention import tree_attention

__all__ = [
    "AcceptOutput",
    "BuildTreeOutput",
    "build_tree",
    "commit_update",
    "draft_topk_lse",
    "gumbel_noise",
    "kv_commit",
    "qkv_prep",
    "round_finish",
    "round_update",
    "tree_accept",
    "tree_attention",
]
