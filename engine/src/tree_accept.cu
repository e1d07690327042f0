// Launcher of tree_accept (C ABI): validates, carves the workspace, launches the fused kernel (one launch)
// or the split plan's three kernels; and of round_finish (the fused kernel with the round tail).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common.h"
#include "ddtree/kernels/round_finish.cuh"
#include "ddtree/kernels/tree_accept.cuh"
#include "ddtree/round_finish.h"
#include "ddtree/tree_accept.h"

static_assert(DDTREE_ROUND_FINISH_MAX_LAYERS == ddtree::kernels::kFinishMaxLayers, "C ABI limit");
static_assert(DDTREE_ROUND_FINISH_MAX_PAIRS == ddtree::kernels::kFinishMaxPairs, "C ABI limit");

static_assert(DDTREE_TREE_ACCEPT_FUSED_MAX_NODES == ddtree::kernels::kAcceptFusedMaxNodes, "C ABI limit");

// The arguments both C entry points share (spelled out in ddtree/tree_accept.h), as parameters and as a
// forwarding list.
#define DDTREE_ACCEPT_PARAMS                                                                                   \
  const void *target_logits, ddtree_dtype_t dtype, int32_t batch, int32_t n_max, int32_t vocab,                \
      int64_t batch_stride, int64_t row_stride, const int32_t *node_token, const int32_t *first_child,         \
      const int32_t *next_sibling, const int32_t *num_nodes, const int32_t *ctx_len, const float *temperature, \
      const int64_t *seed, const int32_t *stop_ids, int32_t num_stop, int32_t max_depth, int32_t *accept_nodes, \
      int32_t *accept_len, int32_t *committed_ids, int32_t *bonus, int32_t *finished, void *workspace,         \
      size_t workspace_bytes
#define DDTREE_ACCEPT_ARGS                                                                                      \
  target_logits, dtype, batch, n_max, vocab, batch_stride, row_stride, node_token, first_child, next_sibling,  \
      num_nodes, ctx_len, temperature, seed, stop_ids, num_stop, max_depth, accept_nodes, accept_len,          \
      committed_ids, bonus, finished, workspace, workspace_bytes

namespace {

using ddtree::detail::align_up;
namespace k = ddtree::kernels;

// The fused plan's one-CTA variant (tree_accept/one_cta.cuh) where it fits: DDTREE_ACCEPT_ONE_CTA=1 on, =0 off,
// unset: kAcceptOneCtaDefault (off: it measured slower than the chunked kernel on the H200, NOTES session 6).
// Read on every call (a CUDA graph keeps the choice made at capture), so one process can A/B the two.
constexpr bool kAcceptOneCtaDefault = false;
bool one_cta_enabled() {
  const char* e = std::getenv("DDTREE_ACCEPT_ONE_CTA");
  if (e != nullptr && e[0] == '1' && e[1] == 0) return true;
  if (e != nullptr && e[0] == '0' && e[1] == 0) return false;
  return kAcceptOneCtaDefault;
}

// Session 7's defaults (NOTES, "Session 7"), for the fused plan at vocabularies of at most kAcceptSession7MaxV, where
// a thread holds at most one 16-byte vector of a row (the regime of the H200 measurement, V = 320): the compact
// greedy scoring and the chunked kernel's early mode measured 2.2-3.1 µs faster per round tail than session 6's
// kernel in the same process (round_finish in the end-to-end round, batch 1/8, budget 16/64). Elsewhere (larger
// vocabularies, the split plan) nothing was measured: session 6's path stays the default there.
constexpr int kAcceptSession7MaxV = 1024;

// Scoring loop of the fused plan's kernels (tree_accept/common.cuh): DDTREE_ACCEPT_SCORE=compact|unrolled|packed
// (only T = 0 rows differ; sampled rows keep the unrolled loop; packed scores fp32 rows compact). Unset: compact at
// vocab <= kAcceptSession7MaxV (session 7), packed above (session 10, V = 151,936: NOTES "Session 10 (s10e2e)";
// the unrolled loop was session 6's default there, never measured). Read on every call, like the switches above
// and below (a CUDA graph keeps the choice made at capture). The split plan's target kernel keeps the unrolled loop
// (the compact one made it spill 16 bytes on sm_120, and the split plan was not measured).
int score_mode(int32_t vocab) {
  const char* e = std::getenv("DDTREE_ACCEPT_SCORE");
  if (e != nullptr && std::strcmp(e, "compact") == 0) return k::kAcceptScoreCompact;
  if (e != nullptr && std::strcmp(e, "unrolled") == 0) return k::kAcceptScoreUnrolled;
  if (e != nullptr && std::strcmp(e, "packed") == 0) return k::kAcceptScorePacked;
  return vocab <= kAcceptSession7MaxV ? k::kAcceptScoreCompact : k::kAcceptScorePacked;
}

// The chunked fused kernel's early mode (fused.cuh: PDL launch, temperature and ctx_len with num_nodes, the round
// tail's block-table prefetch): DDTREE_ACCEPT_PDL=1 on, anything else off. Sessions 7-11 had it on at vocab <=
// kAcceptSession7MaxV (the toy model) for its 0.2-0.3 µs launch gap. Session 12 found the bf16 toy's graph-vs-eager
// decode tests (test_decode_gpu.py) failing in 4 of 5 processes run side by side on one H200 (time-sliced
// contexts), with this library and with session 11's; with the early mode off 4 of 4 passed, as with
// DDTREE_DISABLE_PDL=1, while turning off fa3's PDL or the merge trigger did not help (engine/bench/NOTES.md,
// "PDL race in the accept's early mode"). Session 13's five-process stress (NOTES, "the edge behind cuBLAS's lm_head
// GEMM") narrowed it to the PDL edge directly behind cuBLAS's lm_head GEMM: the same code launched plainly (=2), or
// PDL behind a torch kernel, never deviated; what cuBLAS's kernel does at that edge is not visible to us. So the mode
// is off by default and stays an opt-in for measurements only; large-vocabulary rounds never took it.
// Except DDTREE_ACCEPT_PDL=2 (session 12, s12pdl, a diagnostic): the early mode's code (the loads, the prefetch)
// launched without PDL, so a run can tell the launch attribute from the code it enables (bench/run_pdl_stress.sh).
// (fa3 and its PDL merge kernel never run in the toy: head_dim 64 takes the mma.sync kernels, plain launches.)
enum class AcceptEarly { kOff, kPdl, kPlainLaunch };
AcceptEarly accept_early() {
  const char* e = std::getenv("DDTREE_ACCEPT_PDL");
  if (e == nullptr || e[0] == 0 || e[1] != 0) return AcceptEarly::kOff;
  return e[0] == '1' ? AcceptEarly::kPdl : e[0] == '2' ? AcceptEarly::kPlainLaunch : AcceptEarly::kOff;
}

// The fused kernel's wide bf16 chunk (kAcceptWideNV vectors a thread, 16,384 logits a CTA; session 11, issue #6):
// DDTREE_ACCEPT_WIDE=1 on, =0 off (session 10's 8192-logit chunk), unset -> kAcceptWideDefault. bf16 rows with
// 16-byte loads only (fp32 chunks are 32 KB already); the one-CTA kernel and the split plan are unchanged.
constexpr bool kAcceptWideDefault = true;
bool accept_wide() {
  const char* e = std::getenv("DDTREE_ACCEPT_WIDE");
  if (e != nullptr && e[0] == '1' && e[1] == 0) return true;
  if (e != nullptr && e[0] == '0' && e[1] == 0) return false;
  return kAcceptWideDefault;
}

// Leaf mode (session 13, issue #6; fused.cuh / leaf.cuh): the fused kernel reads no leaf row, a second launch reads
// the one leaf row per request that a walk ended on. DDTREE_ACCEPT_LEAF=1 on, =0 off, unset: on above
// kAcceptSession7MaxV (at V = 151,936 a leaf row is 297 KB of bf16; at the toy's V = 320 a second launch costs more
// than the rows it skips). Only tree_accept_fused (round_finish's tail runs in the walk's CTA, which no longer knows
// the bonus) and trees of 2+ nodes. Read on every call, like the switches above.
// DDTREE_ACCEPT_LEAF=2 (opt-in, session 13): leaf mode with the row-list kernel (rows.cuh) as its first pass, which
// launches no CTA for leaf rows. Returns 0 (off), 1 or 2.
int accept_leaf(int32_t vocab) {
  const char* e = std::getenv("DDTREE_ACCEPT_LEAF");
  if (e != nullptr && e[0] >= '0' && e[0] <= '2' && e[1] == 0) return e[0] - '0';
  return vocab > kAcceptSession7MaxV ? 1 : 0;
}

// Chunks of `chunk` logits per row. The workspace is sized for kAcceptChunk, the smallest chunk of any plan.
int num_chunks(int32_t vocab, int chunk = k::kAcceptChunk) { return (vocab + chunk - 1) / chunk; }

size_t tree_bytes(int32_t batch, int32_t n_max) { return align_up(size_t(batch) * size_t(n_max) * sizeof(int32_t)); }

template <typename T>
ddtree_status_t run(const T* logits, int32_t batch, int32_t n_max, int32_t vocab, int64_t batch_stride,
                    int64_t row_stride, const int32_t* node_token, const int32_t* first_child,
                    const int32_t* next_sibling, const int32_t* num_nodes, const int32_t* ctx_len,
                    const float* temperature, const int64_t* seed, const int32_t* stop_ids, int32_t num_stop,
                    int32_t width, int32_t* accept_nodes, int32_t* accept_len, int32_t* committed_ids,
                    int32_t* bonus, int32_t* finished, void* workspace, int32_t* flags, cudaStream_t stream) {
  char* ws = static_cast<char*>(workspace);
  auto* parent = reinterpret_cast<int32_t*>(ws);
  auto* depth = reinterpret_cast<int32_t*>(ws + tree_bytes(batch, n_max));
  auto* partial = reinterpret_cast<uint64_t*>(ws + 2 * tree_bytes(batch, n_max));
  const int chunks = num_chunks(vocab);
  ddtree_status_t st = ddtree::detail::launch("tree_accept_tree_kernel", k::tree_accept_tree_kernel,
                                              dim3(unsigned(batch)), dim3(k::kAcceptWalkThreads), stream, false,
                                              first_child, next_sibling, num_nodes, n_max, parent, depth, flags);
  if (st != DDTREE_STATUS_SUCCESS) return st;
  constexpr int VN = 16 / int(sizeof(T));
  const bool vec = reinterpret_cast<uintptr_t>(logits) % 16 == 0 && row_stride % VN == 0 &&
                   (batch <= 1 || batch_stride % VN == 0);
  const dim3 grid{unsigned(chunks), unsigned(n_max), unsigned(batch)};
  st = vec ? ddtree::detail::launch("tree_accept_target_kernel", k::tree_accept_target_kernel<T, true>, grid,
                                    dim3(k::kAcceptThreads), stream, true, logits, batch_stride, row_stride, vocab,
                                    n_max, num_nodes, ctx_len, temperature, seed,
                                    static_cast<const int32_t*>(depth), chunks, partial, flags)
           : ddtree::detail::launch("tree_accept_target_kernel", k::tree_accept_target_kernel<T, false>, grid,
                                    dim3(k::kAcceptThreads), stream, true, logits, batch_stride, row_stride, vocab,
                                    n_max, num_nodes, ctx_len, temperature, seed,
                                    static_cast<const int32_t*>(depth), chunks, partial, flags);
  if (st != DDTREE_STATUS_SUCCESS) return st;
  return ddtree::detail::launch("tree_accept_walk_kernel", k::tree_accept_walk_kernel, dim3(unsigned(batch)),
                                dim3(k::kAcceptWalkThreads), stream, true, static_cast<const uint64_t*>(partial),
                                chunks, node_token, static_cast<const int32_t*>(parent), num_nodes, n_max, stop_ids,
                                num_stop, width, accept_nodes, accept_len, committed_ids, bonus, finished);
}

template <typename T, typename Tail>
ddtree_status_t run_fused(const Tail& tail, const T* logits, int32_t batch, int32_t n_max, int32_t vocab, int64_t batch_stride,
                          int64_t row_stride, const int32_t* node_token, const int32_t* first_child,
                          const int32_t* next_sibling, const int32_t* num_nodes, const int32_t* ctx_len,
                          const float* temperature, const int64_t* seed, const int32_t* stop_ids, int32_t num_stop,
                          int32_t width, int32_t* accept_nodes, int32_t* accept_len, int32_t* committed_ids,
                          int32_t* bonus, int32_t* finished, void* workspace, uint32_t* counters, int32_t* flags,
                          cudaStream_t stream) {
  // Same workspace layout as the split plan (parents and depths unused) so one size query serves both.
  auto* partial = reinterpret_cast<uint64_t*>(static_cast<char*>(workspace) + 2 * tree_bytes(batch, n_max));
  const int chunks = num_chunks(vocab);
  constexpr int VN = 16 / int(sizeof(T));
  const bool vec = reinterpret_cast<uintptr_t>(logits) % 16 == 0 && row_stride % VN == 0 &&
                   (batch <= 1 || batch_stride % VN == 0);
  const int score = score_mode(vocab);
  // Leaf mode's pending walks live in the split plan's parent area (batch x n_max >= 2 x batch int32).
  int32_t* pend = nullptr;
  const int leaf = std::is_same<Tail, k::NoRoundTail>::value && n_max >= 2 ? accept_leaf(vocab) : 0;
  if (leaf != 0) pend = static_cast<int32_t*>(workspace);
  const bool rows = leaf == 2;  // pass 1 as the row-list kernel (rows.cuh)
  // The leaf pass after the fused kernel (same chunking, so it fills the leaf's own partial slots).
  auto leaf_pass = [&](auto kernel, int nchunks) {
    if (pend == nullptr) return DDTREE_STATUS_SUCCESS;
    return ddtree::detail::launch("tree_accept_leaf_kernel", kernel, dim3{unsigned(nchunks), unsigned(batch)},
                                  dim3(k::kAcceptThreads), stream, false, logits, batch_stride, row_stride, vocab,
                                  n_max, ctx_len, temperature, seed, stop_ids, num_stop, width, nchunks,
                                  static_cast<const int32_t*>(pend), partial, counters, committed_ids, bonus,
                                  finished, flags, score);
  };
  if (pend == nullptr && one_cta_enabled() && k::accept_one_cta_fits(n_max, vocab, int(sizeof(T)))) {
    // With PDL: its prologue reads only inputs older than the model's last kernel (see one_cta.cuh).
    auto go = [&](auto kernel) {
      return ddtree::detail::launch("tree_accept_one_cta_kernel", kernel, dim3(unsigned(batch)),
                                    dim3(k::kAcceptOneThreads), stream, true, logits, batch_stride, row_stride, vocab,
                                    n_max, node_token, first_child, next_sibling, num_nodes, ctx_len, temperature,
                                    seed, stop_ids, num_stop, width, accept_nodes, accept_len, committed_ids, bonus,
                                    finished, flags, tail,
                                    score == k::kAcceptScorePacked ? int(k::kAcceptScoreCompact) : score);
    };
    return vec ? go(k::tree_accept_one_cta_kernel<T, true, Tail>) : go(k::tree_accept_one_cta_kernel<T, false, Tail>);
  }
  // Session 5/6 order without PDL; the early mode launches with PDL and waits before reading any input.
  const AcceptEarly mode = accept_early();
  const bool early = mode != AcceptEarly::kOff, pdl = mode == AcceptEarly::kPdl;
  // Pass 1 (the fused kernel, or leaf mode 2's row-list kernel), then leaf mode's leaf pass.
  auto go = [&](auto kernel, auto rows_kernel, auto leaf_kernel, int nchunks) {
    const ddtree_status_t st =
        rows
            ? ddtree::detail::launch(
                  "tree_accept_rows_kernel", rows_kernel,
                  dim3{unsigned(nchunks), unsigned(std::min(int(n_max), k::kAcceptRowSlots)), unsigned(batch)},
                  dim3(k::kAcceptThreads), stream, false, logits, batch_stride, row_stride, vocab, n_max, node_token,
                  first_child, next_sibling, num_nodes, ctx_len, temperature, seed, stop_ids, num_stop, width, nchunks,
                  partial, counters, accept_nodes, accept_len, committed_ids, bonus, finished, flags, score, pend)
            : ddtree::detail::launch(
                  "tree_accept_fused_kernel", kernel, dim3{unsigned(nchunks), unsigned(n_max), unsigned(batch)},
                  dim3(k::kAcceptThreads), stream, pdl, logits, batch_stride, row_stride, vocab, n_max, node_token,
                  first_child, next_sibling, num_nodes, ctx_len, temperature, seed, stop_ids, num_stop, width, nchunks,
                  partial, counters, accept_nodes, accept_len, committed_ids, bonus, finished, flags, tail, score,
                  int(early), pend);
    if (st != DDTREE_STATUS_SUCCESS) return st;
    return leaf_pass(leaf_kernel, nchunks);
  };
  if constexpr (sizeof(T) == 2) {
    if (vec && accept_wide()) {
      constexpr int W = k::kAcceptWideNV;
      return go(k::tree_accept_fused_kernel<T, true, Tail, W>, k::tree_accept_rows_kernel<T, true, W>,
                k::tree_accept_leaf_kernel<T, true, W>, num_chunks(vocab, k::ChunkLogits<T, true, W>::kChunk));
    }
  }
  constexpr int NV = k::kAcceptPerThread / VN;
  if (vec)
    return go(k::tree_accept_fused_kernel<T, true, Tail>, k::tree_accept_rows_kernel<T, true, NV>,
              k::tree_accept_leaf_kernel<T, true, NV>, chunks);
  return go(k::tree_accept_fused_kernel<T, false, Tail>, k::tree_accept_rows_kernel<T, false, NV>,
            k::tree_accept_leaf_kernel<T, false, NV>, chunks);
}

// Argument checks shared by both entry points.
ddtree_status_t validate(const char* op, DDTREE_ACCEPT_PARAMS) {
  DDTREE_REQUIRE(n_max >= 1 && n_max <= 65535, "%s: n_max must be in [1, 65535], got %d", op, n_max);
  DDTREE_REQUIRE(batch <= 65535, "%s: batch must be <= 65535, got %d", op, batch);
  DDTREE_REQUIRE(vocab >= 1, "%s: vocab must be >= 1, got %d", op, vocab);
  DDTREE_REQUIRE(row_stride >= vocab, "%s: row_stride (%lld) must be >= vocab (%d)", op,
                 static_cast<long long>(row_stride), vocab);
  DDTREE_REQUIRE(batch <= 1 || batch_stride >= (int64_t(n_max) - 1) * row_stride + vocab,
                 "%s: batch_stride (%lld) overlaps the previous request's rows", op,
                 static_cast<long long>(batch_stride));
  DDTREE_REQUIRE(max_depth >= 0 && max_depth < ddtree::kernels::kAcceptMaxWidth,
                 "%s: max_depth must be in [0, %d), got %d", op, ddtree::kernels::kAcceptMaxWidth, max_depth);
  DDTREE_REQUIRE(num_stop >= 0 && (num_stop == 0 || stop_ids != nullptr),
                 "%s: stop_ids must be non-null when num_stop (%d) > 0", op, num_stop);
  DDTREE_REQUIRE(dtype == DDTREE_DTYPE_FLOAT32 || dtype == DDTREE_DTYPE_BFLOAT16,
                 "%s: target_logits must be float32 or bfloat16 (dtype code %d)", op, int(dtype));
  DDTREE_REQUIRE(target_logits != nullptr && node_token != nullptr && first_child != nullptr &&
                     next_sibling != nullptr && num_nodes != nullptr && ctx_len != nullptr &&
                     temperature != nullptr && seed != nullptr,
                 "%s: input pointers must be non-null", op);
  DDTREE_REQUIRE(accept_nodes != nullptr && accept_len != nullptr && committed_ids != nullptr && bonus != nullptr &&
                     finished != nullptr,
                 "%s: output pointers must be non-null", op);
  const size_t need = ddtree_tree_accept_workspace_size(batch, n_max, vocab);
  if (workspace == nullptr || workspace_bytes < need) {
    return ddtree::detail::fail(DDTREE_STATUS_WORKSPACE_TOO_SMALL,
                                "%s: workspace of %zu bytes given, %zu needed", op, workspace_bytes, need);
  }
  DDTREE_REQUIRE(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, "%s: workspace must be 16-byte aligned", op);
  return DDTREE_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

DDTREE_API size_t ddtree_tree_accept_workspace_size(int32_t batch, int32_t n_max, int32_t vocab) {
  if (batch <= 0 || n_max <= 0 || vocab <= 0) return 0;
  return 2 * tree_bytes(batch, n_max) +
         align_up(size_t(batch) * size_t(n_max) * size_t(num_chunks(vocab)) * sizeof(uint64_t));
}

}  // extern "C"

namespace {

// The C ABI tail description -> the kernel's RoundTail (checked; the caller checked the accept arguments).
ddtree_status_t make_tail(const ddtree_round_tail_t* in, int32_t batch, int32_t n_max, int32_t width,
                          const int32_t* ctx_len, k::RoundTail* out) {
  DDTREE_REQUIRE(in != nullptr, "round_finish: tail must be non-null");
  const ddtree_round_tail_t& t = *in;
  DDTREE_REQUIRE(t.num_layers >= 1 && t.num_layers <= k::kFinishMaxLayers,
                 "round_finish: num_layers must be in [1, %d], got %d (larger models: tree_accept_fused + kv_commit "
                 "+ round_update)", k::kFinishMaxLayers, t.num_layers);
  DDTREE_REQUIRE(t.num_pages >= 1 && t.page_size >= 1 && t.max_pages >= 1 && t.kv_row_bytes >= 1,
                 "round_finish: num_pages (%d), page_size (%d), max_pages (%d) and kv_row_bytes (%lld) must be >= 1",
                 t.num_pages, t.page_size, t.max_pages, static_cast<long long>(t.kv_row_bytes));
  DDTREE_REQUIRE(int64_t(t.num_pages) * t.page_size <= INT32_MAX,
                 "round_finish: num_pages x page_size (%d x %d) must fit in int32 (cache row indices)", t.num_pages,
                 t.page_size);
  DDTREE_REQUIRE(t.hid_rows >= n_max && t.hid_row_bytes >= 1 && t.tokens_width >= 1,
                 "round_finish: hid_rows (%d) must be >= n_max (%d), hid_row_bytes (%lld) and tokens_width (%d) >= 1",
                 t.hid_rows, n_max, static_cast<long long>(t.hid_row_bytes), t.tokens_width);
  DDTREE_REQUIRE(t.ctx_len == ctx_len, "round_finish: the tail's ctx_len must be the accept's ctx_len pointer");
  DDTREE_REQUIRE(t.k_caches && t.block_table && t.hid && t.active && t.ignore_stop && t.max_new && t.out_len &&
                     t.root && t.hidden && t.r_tokens && t.r_count && t.r_finish,
                 "round_finish: every tail pointer but v_caches and live_budget must be non-null");
  (void)batch;
  (void)width;
  *out = k::RoundTail{};
  uintptr_t bits = uintptr_t(t.kv_row_bytes);
  for (int l = 0; l < t.num_layers; ++l) {
    DDTREE_REQUIRE(t.k_caches[l] != nullptr && (t.v_caches == nullptr || t.v_caches[l] != nullptr),
                   "round_finish: cache pointer of layer %d is null", l);
    out->k[l] = static_cast<char*>(t.k_caches[l]);
    out->v[l] = t.v_caches != nullptr ? static_cast<char*>(t.v_caches[l]) : nullptr;
    bits |= reinterpret_cast<uintptr_t>(t.k_caches[l]);
    if (t.v_caches != nullptr) bits |= reinterpret_cast<uintptr_t>(t.v_caches[l]);
  }
  const int unit = bits % 16 == 0 ? 16 : bits % 4 == 0 ? 4 : 1;
  DDTREE_REQUIRE(ddtree_round_finish_fits(t.num_layers, t.kv_row_bytes, unit),
                 "round_finish: %d layers x %lld-byte rows (copy unit %d) exceed one CTA's commit (%d work items); "
                 "use tree_accept_fused + kv_commit + round_update", t.num_layers,
                 static_cast<long long>(t.kv_row_bytes), unit, k::kFinishMaxPairs);
  const uintptr_t hbits = uintptr_t(t.hid_row_bytes) | reinterpret_cast<uintptr_t>(t.hid) |
                          reinterpret_cast<uintptr_t>(t.hidden);
  out->num_layers = t.num_layers;
  out->num_pages = t.num_pages;
  out->page_size = t.page_size;
  out->max_pages = t.max_pages;
  out->kv_row_bytes = t.kv_row_bytes;
  out->kv_unit = unit;
  out->block_table = t.block_table;
  out->hid = static_cast<const char*>(t.hid);
  out->hid_rows = t.hid_rows;
  out->hid_unit = hbits % 16 == 0 ? 16 : hbits % 4 == 0 ? 4 : 1;
  out->hid_row_bytes = t.hid_row_bytes;
  out->active = t.active;
  out->ignore_stop = t.ignore_stop;
  out->max_new = t.max_new;
  out->out_len = t.out_len;
  out->ctx_len = t.ctx_len;
  out->root = t.root;
  out->hidden = static_cast<char*>(t.hidden);
  out->r_tokens = t.r_tokens;
  out->tokens_width = t.tokens_width;
  out->r_count = t.r_count;
  out->r_finish = t.r_finish;
  out->live_budget = t.live_budget;
  return DDTREE_STATUS_SUCCESS;
}

// All entry points: argument checks, then the split plan (fused = false) or the fused plan, the latter with
// the round tail when `tail` is non-null (round_finish).
ddtree_status_t check_and_run(bool fused, DDTREE_ACCEPT_PARAMS, const ddtree_round_tail_t* tail,
                              uint32_t* counters, int32_t* error_flags, cudaStream_t stream) {
  const char* op = tail != nullptr ? "round_finish" : fused ? "tree_accept_fused" : "tree_accept";
  DDTREE_REQUIRE(batch >= 0, "%s: batch must be >= 0, got %d", op, batch);
  if (batch == 0) return ddtree::detail::succeed();
  if (fused) {
    DDTREE_REQUIRE(n_max <= DDTREE_TREE_ACCEPT_FUSED_MAX_NODES,
                   "%s: n_max must be <= %d (use ddtree_tree_accept for larger trees), got %d", op,
                   DDTREE_TREE_ACCEPT_FUSED_MAX_NODES, n_max);
    DDTREE_REQUIRE(counters != nullptr && reinterpret_cast<uintptr_t>(counters) % 4 == 0,
                   "%s: counters must be a non-null, 4-byte aligned array of batch (%d) zeros", op, batch);
  }
  const ddtree_status_t st = validate(op, DDTREE_ACCEPT_ARGS);
  if (st != DDTREE_STATUS_SUCCESS) return st;
  const int32_t width = max_depth + 1;
  k::RoundTail round_tail;
  if (tail != nullptr) {
    const ddtree_status_t ts = make_tail(tail, batch, n_max, width, ctx_len, &round_tail);
    if (ts != DDTREE_STATUS_SUCCESS) return ts;
  }
  auto launch = [&](auto* logits) {
    if (tail != nullptr)
      return run_fused(round_tail, logits, batch, n_max, vocab, batch_stride, row_stride, node_token, first_child,
                       next_sibling, num_nodes, ctx_len, temperature, seed, stop_ids, num_stop, width, accept_nodes,
                       accept_len, committed_ids, bonus, finished, workspace, counters, error_flags, stream);
    return fused ? run_fused(k::NoRoundTail{}, logits, batch, n_max, vocab, batch_stride, row_stride, node_token, first_child,
                             next_sibling, num_nodes, ctx_len, temperature, seed, stop_ids, num_stop, width,
                             accept_nodes, accept_len, committed_ids, bonus, finished, workspace, counters,
                             error_flags, stream)
                 : run(logits, batch, n_max, vocab, batch_stride, row_stride, node_token, first_child, next_sibling,
                       num_nodes, ctx_len, temperature, seed, stop_ids, num_stop, width, accept_nodes, accept_len,
                       committed_ids, bonus, finished, workspace, error_flags, stream);
  };
  return dtype == DDTREE_DTYPE_FLOAT32 ? launch(static_cast<const float*>(target_logits))
                                       : launch(static_cast<const __nv_bfloat16*>(target_logits));
}

}  // namespace

extern "C" {

DDTREE_API ddtree_status_t ddtree_tree_accept(DDTREE_ACCEPT_PARAMS, int32_t* error_flags, cudaStream_t stream) {
  return check_and_run(false, DDTREE_ACCEPT_ARGS, nullptr, nullptr, error_flags, stream);
}

DDTREE_API ddtree_status_t ddtree_tree_accept_fused(DDTREE_ACCEPT_PARAMS, uint32_t* counters, int32_t* error_flags,
                                                    cudaStream_t stream) {
  return check_and_run(true, DDTREE_ACCEPT_ARGS, nullptr, counters, error_flags, stream);
}

DDTREE_API int32_t ddtree_round_finish_fits(int32_t num_layers, int64_t kv_row_bytes, int32_t copy_unit) {
  if (num_layers < 1 || num_layers > k::kFinishMaxLayers || kv_row_bytes < 1 ||
      (copy_unit != 1 && copy_unit != 4 && copy_unit != 16) || kv_row_bytes % copy_unit != 0)
    return 0;
  return 2 * int64_t(num_layers) * (kv_row_bytes / copy_unit) <= k::kFinishMaxPairs ? 1 : 0;
}

DDTREE_API ddtree_status_t ddtree_round_finish(DDTREE_ACCEPT_PARAMS, const ddtree_round_tail_t* tail,
                                               uint32_t* counters, int32_t* error_flags, cudaStream_t stream) {
  if (tail == nullptr) return ddtree::detail::fail(DDTREE_STATUS_INVALID_ARGUMENT, "round_finish: tail must be non-null");
  return check_and_run(true, DDTREE_ACCEPT_ARGS, tail, counters, error_flags, stream);
}

}  // extern "C"
