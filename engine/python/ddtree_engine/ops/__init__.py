"""Torch ops over libddtree's kernels. Same signatures as `ddtree_engine.reference`.

Each op lives in ops/<op>.py. They are imported here eagerly (which loads torch but not the library:
that happens on an op's first call) so that `ddtree_engine.ops.<op>` is always the function, never the
submodule of the same name."""

from ddtree_engine.ops._common import check_errors, error_flags
from ddtree_engine.ops.build_tree import BuildTreeOutput, build_tree
from ddtree_engine.ops.commit_update import commit_update
from ddtree_engine.ops.draft_topk_lse import draft_topk_lse
from ddtree_engine.ops.kv_commit import kv_commit
from ddtree_engine.ops.qkv_prep import qkv_prep
from ddtree_engine.ops.round_finish import round_finish
from ddtree_engine.ops.round_update import round_update
from ddtree_engine.ops.tree_accept import AcceptOutput, tree_accept
from ddtree_engine.ops.tree_attention import tree_attention

__all__ = [
    "AcceptOutput",
    "BuildTreeOutput",
    "build_tree",
    "check_errors",
    "commit_update",
    "draft_topk_lse",
    "error_flags",
    "kv_commit",
    "qkv_prep",
    "round_finish",
    "round_update",
    "tree_accept",
    "tree_attention",
]
