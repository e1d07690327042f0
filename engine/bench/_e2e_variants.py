"""The engine-kernel variants of bench_e2e.py (--variants) and of profile/e2e_round_profile.py: the environment the
library reads on every call, set per variant for an A/B in one process. Apart from the bench so that each file stays
under 500 lines; the bench imports these names (and re-exports them) and its CLI and output are as before."""

from __future__ import annotations

import os

# Engine-kernel variants for an A/B in one process: environment the library reads on every call (so at capture).
VARIANTS: dict[str, dict[str, str | None]] = {
    "default": {"DDTREE_TOPK_SMALL": None, "DDTREE_ACCEPT_ONE_CTA": None},  # the library's defaults
    # session 5's kernels: v4 top-k, the chunked fused accept, build_tree's v8auto (no warp heap)
    "s5": {"DDTREE_TOPK_SMALL": "0", "DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_BUILD_TREE_IMPL": "v8auto"},
    "s6": {"DDTREE_TOPK_SMALL": "1", "DDTREE_ACCEPT_ONE_CTA": "1"},  # small-row top-k, one-CTA accept
    "topk": {"DDTREE_TOPK_SMALL": "1", "DDTREE_ACCEPT_ONE_CTA": "0"},
    "accept": {"DDTREE_TOPK_SMALL": "0", "DDTREE_ACCEPT_ONE_CTA": "1"},
    # Session 7, the round tail's accept (top-k and build_tree at the library's defaults): session 6's final
    # default (chunked accept, unrolled scoring, no PDL); the compact greedy scoring; that plus the early mode
    # (PDL launch, temperature/ctx_len with num_nodes, block-table prefetch); the one-CTA accept, compact scoring.
    "s6final": {"DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_SCORE": "unrolled", "DDTREE_ACCEPT_PDL": "0"},
    "compact": {"DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_SCORE": "compact", "DDTREE_ACCEPT_PDL": "0"},
    "early": {"DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_SCORE": "compact", "DDTREE_ACCEPT_PDL": "1"},
    "onecta": {"DDTREE_ACCEPT_ONE_CTA": "1", "DDTREE_ACCEPT_SCORE": "compact"},
    # Session 11: tree_accept's bf16 chunk of 8192 logits (session 10's default; the default is 16,384 now)
    "narrow": {"DDTREE_ACCEPT_WIDE": "0"},
    "widepdl": {"DDTREE_ACCEPT_WIDE": "1", "DDTREE_ACCEPT_PDL": "1"},  # that plus the early (PDL) mode, opt-in above V 1024
    # Session 11 (s11tail): the split tail as kv_commit + round_update + a torch.where budget mask (session 10's
    # default; the default is one commit_update launch keeping the live budget now). Read when the engine is built.
    "splitops": {"DDTREE_SPLIT_TAIL": "ops"},
    "cupdl": {"DDTREE_COMMIT_UPDATE_PDL": "1"},  # commit_update launched with PDL (opt-in)
    # Session 12 (s12tail): commit_update's 16-row K/V pass (session 11's; 8 rows now)
    "cutile16": {"DDTREE_COMMIT_UPDATE_TILE": "16"},
    # Session 13 (s13accept): tree_accept reading every row (the leaf mode is the default above V = 1024)
    "noleaf": {"DDTREE_ACCEPT_LEAF": "0"},
    "leafrows": {"DDTREE_ACCEPT_LEAF": "2"},  # its first pass without leaf CTAs (opt-in)
}
# A variable one variant sets is left at the library's default by the others.
for _name, _env in VARIANTS.items():
    for _var in ("DDTREE_TOPK_SMALL", "DDTREE_ACCEPT_ONE_CTA", "DDTREE_BUILD_TREE_IMPL", "DDTREE_ACCEPT_SCORE",
                 "DDTREE_ACCEPT_PDL", "DDTREE_ACCEPT_WIDE", "DDTREE_SPLIT_TAIL", "DDTREE_COMMIT_UPDATE_PDL",
                 "DDTREE_COMMIT_UPDATE_TILE", "DDTREE_ACCEPT_LEAF"):
        _env.setdefault(_var, None)


def set_variant(name: str) -> None:
    for k, v in VARIANTS[name].items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
