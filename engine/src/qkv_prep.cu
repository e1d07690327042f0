// Launcher of qkv_prep (C ABI): validates every argument, then one PDL launch of the (in, out) dtype pair.
#include <cuda_bf16.h>

#include <cstdint>

#include "common.h"
#include "ddtree/kernels/qkv_prep.cuh"
#include "ddtree/qkv_prep.h"

namespace {
namespace k = ddtree::kernels;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

size_t dtype_size(ddtree_dtype_t d) { return d == DDTREE_DTYPE_FLOAT32 ? 4 : 2; }

template <typename Ti, typename To>
ddtree_status_t launch_pair(const void* qkv, int64_t stride, const void* cos, const void* sin, const int64_t* slots,
                            int32_t t, int32_t hq, int32_t hkv, int32_t d, void* q_out, void* k_cache,
                            void* v_cache, int64_t rows, int32_t* flags, cudaStream_t stream) {
  const int64_t items = int64_t(t) * (hq + 2 * hkv) * (d / 2 / k::QkvVec<Ti>::N);
  const int64_t blocks = (items + k::kQkvPrepThreads - 1) / k::kQkvPrepThreads;
  return ddtree::detail::launch("qkv_prep_kernel", k::qkv_prep_kernel<Ti, To>, dim3(unsigned(blocks)),
                                dim3(k::kQkvPrepThreads), stream, true, static_cast<const Ti*>(qkv), stride,
                                static_cast<const Ti*>(cos), static_cast<const Ti*>(sin), slots, t, hq, hkv, d,
                                static_cast<To*>(q_out), static_cast<To*>(k_cache), static_cast<To*>(v_cache), rows,
                                flags);
}

}  // namespace

extern "C" {

DDTREE_API ddtree_status_t ddtree_qkv_prep(const void* qkv, int64_t qkv_row_stride, ddtree_dtype_t in_dtype,
                                           const void* cos, const void* sin, const int64_t* slots,
                                           int32_t num_tokens, int32_t num_q_heads, int32_t num_kv_heads,
                                           int32_t head_dim, void* q_out, void* k_cache, void* v_cache,
                                           int64_t cache_rows, ddtree_dtype_t out_dtype, int32_t* error_flags,
                                           cudaStream_t stream) {
  DDTREE_REQUIRE(in_dtype == DDTREE_DTYPE_FLOAT32 || in_dtype == DDTREE_DTYPE_BFLOAT16,
                 "qkv_prep: in_dtype must be float32 or bfloat16, got %d", int(in_dtype));
  DDTREE_REQUIRE(out_dtype == DDTREE_DTYPE_FLOAT32 || out_dtype == DDTREE_DTYPE_BFLOAT16,
                 "qkv_prep: out_dtype must be float32 or bfloat16, got %d", int(out_dtype));
  DDTREE_REQUIRE(num_tokens >= 0, "qkv_prep: num_tokens must be >= 0, got %d", num_tokens);
  DDTREE_REQUIRE(num_q_heads >= 1 && num_kv_heads >= 1, "qkv_prep: num_q_heads (%d) and num_kv_heads (%d) must be >= 1",
                 num_q_heads, num_kv_heads);
  const int vec = int(16 / dtype_size(in_dtype));
  DDTREE_REQUIRE(head_dim >= 2 * vec && head_dim % (2 * vec) == 0 && head_dim <= 1024,
                 "qkv_prep: head_dim must be a multiple of %d in [%d, 1024], got %d", 2 * vec, 2 * vec, head_dim);
  const int64_t heads = int64_t(num_q_heads) + 2 * int64_t(num_kv_heads);
  DDTREE_REQUIRE(heads <= 65536, "qkv_prep: too many heads (%lld)", static_cast<long long>(heads));
  DDTREE_REQUIRE(qkv_row_stride >= heads * head_dim, "qkv_prep: qkv_row_stride (%lld) is shorter than a row (%lld)",
                 static_cast<long long>(qkv_row_stride), static_cast<long long>(heads * head_dim));
  DDTREE_REQUIRE(cache_rows >= 1, "qkv_prep: cache_rows must be >= 1, got %lld", static_cast<long long>(cache_rows));
  if (num_tokens == 0) return ddtree::detail::succeed();
  DDTREE_REQUIRE(qkv != nullptr && cos != nullptr && sin != nullptr && slots != nullptr && q_out != nullptr &&
                     k_cache != nullptr && v_cache != nullptr,
                 "qkv_prep: qkv, cos, sin, slots, q_out, k_cache and v_cache must be non-null");
  DDTREE_REQUIRE(aligned16(qkv) && aligned16(cos) && aligned16(sin) && aligned16(q_out) && aligned16(k_cache) &&
                     aligned16(v_cache),
                 "qkv_prep: qkv, cos, sin, q_out, k_cache and v_cache must be 16-byte aligned");
  DDTREE_REQUIRE((qkv_row_stride * int64_t(dtype_size(in_dtype))) % 16 == 0,
                 "qkv_prep: qkv_row_stride * element size must be a multiple of 16 bytes, got stride %lld",
                 static_cast<long long>(qkv_row_stride));
  const int64_t items = int64_t(num_tokens) * heads * (head_dim / 2 / vec);
  DDTREE_REQUIRE((items + k::kQkvPrepThreads - 1) / k::kQkvPrepThreads <= 0x7fffffff,
                 "qkv_prep: too much work for one launch (%lld items)", static_cast<long long>(items));
  const bool in16 = in_dtype == DDTREE_DTYPE_BFLOAT16, out16 = out_dtype == DDTREE_DTYPE_BFLOAT16;
#define DDTREE_QKV_ARGS                                                                                          \
  qkv, qkv_row_stride, cos, sin, slots, num_tokens, num_q_heads, num_kv_heads, head_dim, q_out, k_cache, v_cache, \
      cache_rows, error_flags, stream
  if (in16 && out16) return launch_pair<__nv_bfloat16, __nv_bfloat16>(DDTREE_QKV_ARGS);
  if (in16) return launch_pair<__nv_bfloat16, float>(DDTREE_QKV_ARGS);
  if (out16) return launch_pair<float, __nv_bfloat16>(DDTREE_QKV_ARGS);
  return launch_pair<float, float>(DDTREE_QKV_ARGS);
#undef DDTREE_QKV_ARGS
}

}  // extern "C"
