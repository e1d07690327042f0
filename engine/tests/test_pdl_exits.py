"""Every kernel the library launches with programmatic dependent launch (PDL) executes griddepcontrol.wait in every
CTA before that CTA exits (a source check, CPU only).

Why: griddepcontrol.wait returns once the grid's *own* predecessor has completed. A PDL grid whose CTAs can all
exit without waiting may complete before that predecessor does, and the next kernel's wait then covers nothing of
the predecessor's writes: the chain's transitivity breaks (engine/bench/NOTES.md, "Session 12 (s12pdl): PDL chain
audit"). tree_attention's merge kernel (after fa3) exited before its wait in every CTA whenever no request needed a
second chunk, until session 12.

The rule checked: in the kernel's body, every `return;` that comes before the kernel's wait point (the first wait
every thread of a PDL-launched instance executes, named per kernel below) is directly preceded by a pdl_wait().
Kernels launched without PDL (build_tree, kv_commit, round_update, the split plan's tree kernel, the top-k
partial kernels) are not listed.

A second rule this file cannot check: no new PDL launch directly behind a cuBLAS GEMM without the five-process
stress run (engine/bench/run_pdl_stress.sh). Session 13 measured the accept's early mode there deviating in 20 of
124 decodes while the same code launched plainly, or PDL behind a torch kernel, never did (NOTES, "the edge behind
cuBLAS's lm_head GEMM"). qkv_prep after the wqkv GEMM passed that run and stays PDL.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[1] / "include" / "ddtree" / "kernels"

# (header under include/ddtree/kernels, kernel name, the text of its wait point: the first line holding it)
PDL_KERNELS = [
    ("tree_attention/merge.cuh", "tree_attention_merge_kernel",
     "ddtree::kernels::pdl_wait();\n  DDTREE_TA_MERGE_TRACE(1)"),
    # kEarlyInputs (v18, the default after qkv_prep): the waits sit in the warpgroups' prologue branches; the
    # other instance waits at the top (`if constexpr (!kEarlyInputs)`), before any return.
    ("tree_attention/fa3_kernel.cuh", "tree_attention_fa3_kernel",
     "if constexpr (kEarlyInputs) ddtree::kernels::pdl_wait();  // the block-table loads"),
    ("tree_accept/fused.cuh", "tree_accept_fused_kernel", "if (early) pdl_wait();"),
    ("tree_accept/one_cta.cuh", "tree_accept_one_cta_kernel", "pdl_wait();  // the logits"),
    ("tree_accept/split_plan.cuh", "tree_accept_target_kernel", "pdl_wait();                      // depth"),
    ("tree_accept/split_plan.cuh", "tree_accept_walk_kernel", "pdl_wait();"),
    ("qkv_prep.cuh", "qkv_prep_kernel", "pdl_wait();"),
    ("commit_update.cuh", "commit_update_kernel", "pdl_wait();"),
    ("draft_topk_lse_small.cuh", "draft_topk_lse_small_kernel", "pdl_wait();"),
    ("draft_topk_lse_v4/kernel.cuh", "draft_topk_lse_v4_kernel", "pdl_wait();"),
    ("draft_topk_lse.cuh", "draft_topk_merge_kernel", "pdl_wait();"),
    ("draft_topk_lse_v3.cuh", "draft_topk_merge_v3_kernel", "pdl_wait();"),
]


def _strip_comments(src: str) -> str:
    """C++ source without // and /* */ comments (newlines kept, so that offsets of lines stay comparable)."""
    src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def kernel_body(src: str, name: str) -> str:
    """The body (between its outer braces) of the __global__ function `name` in `src` (comments kept)."""
    m = re.search(r"__global__[^;{]*?\b" + re.escape(name) + r"\s*\(", src, flags=re.S)
    assert m, f"kernel {name} not found"
    i = m.end()
    depth = 1  # inside the parameter list
    while depth:
        depth += {"(": 1, ")": -1}.get(src[i], 0)
        i += 1
    start = src.index("{", i)
    depth, j = 1, start + 1
    while depth:  # brace matching that skips comments (a comment may hold a brace)
        c = src[j]
        if src.startswith("//", j):
            j = src.index("\n", j)
            continue
        if src.startswith("/*", j):
            j = src.index("*/", j) + 2
            continue
        depth += {"{": 1, "}": -1}.get(c, 0)
        j += 1
    return src[start + 1 : j - 1]


def exits_before_wait(body: str, wait_point: str) -> list[str]:
    """The lines of `body` before `wait_point` that hold a `return;` not directly preceded by a pdl_wait()."""
    at = body.find(wait_point)
    assert at >= 0, f"wait point {wait_point!r} not found"
    head = _strip_comments(body[:at])
    bad = []
    for m in re.finditer(r"\breturn\s*;", head):
        before = head[: m.start()].rstrip()
        if not re.search(r"pdl_wait\(\)\s*;$", before):
            line = head[head.rfind("\n", 0, m.start()) + 1 : head.find("\n", m.end())]
            bad.append(line.strip())
    return bad


@pytest.mark.parametrize(("header", "name", "wait_point"), PDL_KERNELS, ids=[k[1] for k in PDL_KERNELS])
def test_pdl_kernel_waits_before_every_exit(header: str, name: str, wait_point: str) -> None:
    body = kernel_body((KERNELS / header).read_text(), name)
    assert exits_before_wait(body, wait_point) == [], f"{name}: a CTA can exit before griddepcontrol.wait"


def test_rule_sees_an_exit_before_the_wait() -> None:
    """The check itself: an early `return;` before the wait is reported, a `pdl_wait(); return;` is not."""
    src = """
    template <int X>
    __global__ void __launch_bounds__(128) k(const int* __restrict__ a, int n) {
      if (threadIdx.x >= n) return;  // exits without waiting
      if (n > 4) {
        pdl_wait();  // covered
        return;
      }
      auto f = [&](int v) { return v + 1; };  // a lambda's value return is not an exit
      pdl_wait();
      if (a[0]) return;
    }
    """
    body = kernel_body(src, "k")
    assert exits_before_wait(body, "pdl_wait();\n      if (a[0])") == ["if (threadIdx.x >= n) return;"]
