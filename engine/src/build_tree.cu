// Launcher of build_tree: validates arguments, launches one CTA per request on the caller's stream.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common.h"
#include "ddtree/build_tree.h"
#include "ddtree/kernels/build_tree.cuh"
#include "ddtree/kernels/build_tree/warp_heap.cuh"

namespace {

namespace bt = ddtree::build_tree_k;
using ddtree::detail::fail;

static_assert(bt::kMaxDepth == DDTREE_BUILD_TREE_MAX_DEPTH, "header and kernel limits agree");
static_assert(bt::kMaxK == DDTREE_BUILD_TREE_MAX_K, "header and kernel limits agree");
static_assert(bt::kMaxNodes == DDTREE_BUILD_TREE_MAX_NODES, "header and kernel limits agree");

// Raises the kernel's dynamic shared-memory limit once per device (a host-side attribute, no sync).
ddtree_status_t prepare() {
  static bool done[64] = {false};
  int dev = 0;
  DDTREE_CUDA_TRY(cudaGetDevice(&dev));
  if (dev >= 0 && dev < 64 && done[dev]) return DDTREE_STATUS_SUCCESS;
  DDTREE_CUDA_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(&bt::build_tree_kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bt::kSmemBytes)));
  DDTREE_CUDA_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(&bt::build_tree_v10_kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bt::kSmemBytes)));
  DDTREE_CUDA_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(&bt::build_tree_v11_kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bt::kSmemBytes)));
  if (dev >= 0 && dev < 64) done[dev] = true;
  return DDTREE_STATUS_SUCCESS;
}

// Which selection runs. DDTREE_BUILD_TREE_IMPL=v6 (chain bound + level pool), v6dp (counting bound +
// level pool), v7 (counting bound + deviation rounds), auto (the session-4 default: v6dp for requests
// with M > 256, v6 otherwise), v8 (build_tree/v8.cuh for requests with M <= 64 and L <= 16, auto for
// the others), v8p8 (v8 with 8 probing warps), v8auto (v8 for M <= 32, auto for the others), v9 (the
// warp heap of build_tree/warp_heap.cuh for launches with n_max <= 65 and L <= 16, v8auto for the
// others), v9auto (the warp heap for launches with n_max <= 65 and L <= 16, v8auto for the others), v9s6
// (session 6's warp-heap kernel, build_tree/warp_heap_s6.cuh, where v9 applies: the A/B peer) or
// v10 (build_tree/v10.cuh for requests with M > 64 and L <= 16, v8auto for the others; opt-in: slower
// than auto at most measured shapes, bench/NOTES.md "### v10 measured"), v11 (build_tree/v11.cuh for
// every request with L <= 16, the v8auto choice for what it hands back; opt-in: slower than the default at
// every measured shape but one, bench/NOTES.md "### v11 measured (session 7"); unset or anything else: kDefaultImpl (v9auto; warp_heap.cuh and bench/NOTES.md "### v9 session 7 measured"
// say why). Read on every call (a getenv, no sync) so that one process can A/B them; a captured graph
// keeps the value it was captured with.
constexpr int kDefaultImpl = bt::kImplV9Auto;
int impl_from_env() {
  const char* v = std::getenv("DDTREE_BUILD_TREE_IMPL");
  if (v == nullptr) return kDefaultImpl;
  if (std::strcmp(v, "v6") == 0) return bt::kImplV6;
  if (std::strcmp(v, "v6dp") == 0) return bt::kImplV6Dp;
  if (std::strcmp(v, "v7") == 0) return bt::kImplV7;
  if (std::strcmp(v, "auto") == 0) return bt::kImplAuto;
  if (std::strcmp(v, "v8") == 0) return bt::kImplV8;
  if (std::strcmp(v, "v8p8") == 0) return bt::kImplV8P8;
  if (std::strcmp(v, "v8auto") == 0) return bt::kImplV8Auto;
  if (std::strcmp(v, "v9") == 0) return bt::kImplV9;
  if (std::strcmp(v, "v9auto") == 0) return bt::kImplV9Auto;
  if (std::strcmp(v, "v9s6") == 0) return bt::kImplV9S6;
  if (std::strcmp(v, "v10") == 0) return bt::kImplV10;
  if (std::strcmp(v, "v11") == 0) return bt::kImplV11;
  return kDefaultImpl;
}

// Survivors' order (build_tree/rank.cuh): DDTREE_BUILD_TREE_ORDER=bitonic keeps session 12's tighten and packed /
// bitonic sorts (the same-process peer of bench_build_tree.py --m256), =rankt the tighten then the rank (opt-in);
// unset or anything else: the bucketed rank without the tighten, which hands a bin over kRankBinCap back to the
// sorts. Read on every call, like the selection.
int order_from_env() {
  const char* v = std::getenv("DDTREE_BUILD_TREE_ORDER");
  if (v != nullptr && std::strcmp(v, "bitonic") == 0) return bt::kOrderBitonic;
  if (v != nullptr && std::strcmp(v, "rankt") == 0) return bt::kOrderRankTighten;
  return bt::kOrderRank;
}

}  // namespace

extern "C" DDTREE_API ddtree_status_t ddtree_build_tree(
    const float* top_lp, const int32_t* top_id, const int32_t* root_token, const int32_t* ctx_len,
    const int32_t* budget, int batch, int depth, int k, int n_max, int32_t* node_token,
    int32_t* node_parent, int32_t* node_depth, int32_t* num_nodes, uint32_t* anc, int32_t* positions,
    int32_t* first_child, int32_t* next_sibling, void* stream) {
  DDTREE_REQUIRE(batch >= 0 && batch <= 65535, "build_tree: batch must be in [0, 65535], got %d", batch);
  DDTREE_REQUIRE(depth >= 0 && depth <= DDTREE_BUILD_TREE_MAX_DEPTH,
                 "build_tree: depth L must be in [0, %d], got %d", DDTREE_BUILD_TREE_MAX_DEPTH, depth);
  DDTREE_REQUIRE(k >= 1 && k <= DDTREE_BUILD_TREE_MAX_K, "build_tree: k must be in [1, %d], got %d",
                 DDTREE_BUILD_TREE_MAX_K, k);
  DDTREE_REQUIRE(n_max >= 1 && n_max <= DDTREE_BUILD_TREE_MAX_NODES,
                 "build_tree: n_max must be in [1, %d] (budget <= %d), got %d", DDTREE_BUILD_TREE_MAX_NODES,
                 DDTREE_BUILD_TREE_MAX_NODES - 1, n_max);
  if (batch == 0) return ddtree::detail::succeed();
  DDTREE_REQUIRE(top_lp || depth == 0, "build_tree: top_lp is NULL");
  DDTREE_REQUIRE(top_id || depth == 0, "build_tree: top_id is NULL");
  DDTREE_REQUIRE(root_token && ctx_len && budget, "build_tree: root_token, ctx_len and budget must not be NULL");
  DDTREE_REQUIRE(node_token && node_parent && node_depth && num_nodes && anc && positions && first_child &&
                     next_sibling,
                 "build_tree: every output pointer must be non-NULL");
  ddtree_status_t st = prepare();
  if (st != DDTREE_STATUS_SUCCESS) return st;

  bt::Params p;
  p.lp = top_lp;
  p.ids = top_id;
  p.root_token = root_token;
  p.ctx_len = ctx_len;
  p.budget = budget;
  p.depth = depth;
  p.k = k;
  p.n_max = n_max;
  p.words = (n_max + 31) / 32;
  p.impl = impl_from_env();
  p.order = order_from_env();
  p.node_token = node_token;
  p.node_parent = node_parent;
  p.node_depth = node_depth;
  p.num_nodes = num_nodes;
  p.anc = anc;
  p.positions = positions;
  p.first_child = first_child;
  p.next_sibling = next_sibling;
  if (bt::warp_heap_applies(p.impl, n_max, depth)) {  // small launches: one warp's exact heap per request
    if (p.impl == bt::kImplV9S6) {  // session 6's pop, the A/B peer
      bt::build_tree_warp_heap_s6_kernel<<<batch, bt::kWhThreads, sizeof(bt::WhSmemS6),
                                           static_cast<cudaStream_t>(stream)>>>(p);
    } else {
      bt::build_tree_warp_heap_kernel<<<batch, bt::kWhThreads, sizeof(bt::WhSmem),
                                        static_cast<cudaStream_t>(stream)>>>(p);
    }
    return ddtree::detail::check_launch("build_tree warp-heap kernel launch");
  }
  // The big kernel's choice for the other launches.
  if (p.impl == bt::kImplV9 || p.impl == bt::kImplV9Auto || p.impl == bt::kImplV9S6) p.impl = bt::kImplV8Auto;
  if (p.impl == bt::kImplV10) {  // opt-in: the kernel with v10 compiled in
    bt::build_tree_v10_kernel<<<batch, bt::kThreads, bt::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(p);
  } else if (p.impl == bt::kImplV11) {  // opt-in: the kernel with v11 compiled in
    bt::build_tree_v11_kernel<<<batch, bt::kThreads, bt::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(p);
  } else {
    bt::build_tree_kernel<<<batch, bt::kThreads, bt::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(p);
  }
  return ddtree::detail::check_launch("build_tree kernel launch");
}
