// Self-checks of qkv_prep: a hand-checked golden case, random cases (GQA 8/1 and 16/8, D 64/128, odd T, bf16 and
// fp32 GEMM outputs, slots scattered over a poisoned cache: every byte compared with a host model), a bad slot
// (flag raised, that token skipped) and argument validation.
#include <cmath>
#include <cstring>
#include <vector>

#include "ddtree/qkv_prep.h"
#include "selftest.h"

namespace {

struct PrepCase {
  int t, hq, hkv, d, rows;
  bool in_f32;
};

// Host model: element j of a rotated head = float(x[j] * cos[j]) + float(x[j ^ half] * sin[j]), each product and
// the sum rounded to fp32 separately (no FMA on the host either: three statements), then rounded to bf16.
uint16_t host_rope(float x1, float c, float x2, float s) {
  const volatile float a = x1 * c;
  const volatile float b = x2 * s;
  return st::f32_to_bf16(a + b);
}

void run_prep(const PrepCase& c, uint64_t seed, const std::vector<int64_t>* forced_slots = nullptr) {
  st::Rng rng(seed);
  const int heads = c.hq + 2 * c.hkv, row = heads * c.d, half = c.d / 2;
  // Inputs as bf16-representable values so the fp32 and bf16 variants see the same numbers.
  std::vector<float> x(size_t(c.t) * row), cs(size_t(c.t) * c.d), sn(size_t(c.t) * c.d);
  for (auto& v : x) v = st::bf16_to_f32(st::f32_to_bf16(3.f * rng.normal()));
  for (int t = 0; t < c.t; ++t)
    for (int j = 0; j < half; ++j) {
      const float ang = float(rng.below(5000)) * std::pow(10000.f, -float(j) / float(half));
      const float cv = st::bf16_to_f32(st::f32_to_bf16(std::cos(ang)));
      const float sv = st::bf16_to_f32(st::f32_to_bf16(std::sin(ang)));
      cs[size_t(t) * c.d + j] = cs[size_t(t) * c.d + j + half] = cv;
      sn[size_t(t) * c.d + j] = -sv;
      sn[size_t(t) * c.d + j + half] = sv;
    }
  std::vector<int64_t> slots(c.t);
  if (forced_slots != nullptr) {
    slots = *forced_slots;
  } else {
    std::vector<int64_t> perm(c.rows);
    for (int i = 0; i < c.rows; ++i) perm[i] = i;
    for (int i = c.rows - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
    for (int t = 0; t < c.t; ++t) slots[t] = perm[t];
  }
  const size_t cache_elems = size_t(c.rows) * c.hkv * c.d;
  std::vector<uint16_t> kc(cache_elems), vc(cache_elems);
  for (auto& e : kc) e = uint16_t(rng.next());
  for (auto& e : vc) e = uint16_t(rng.next() | 0x1);  // never equal to a whole K row by chance
  std::vector<uint16_t> x16(x.size()), c16(cs.size()), s16(sn.size());
  for (size_t i = 0; i < x.size(); ++i) x16[i] = st::f32_to_bf16(x[i]);
  for (size_t i = 0; i < cs.size(); ++i) c16[i] = st::f32_to_bf16(cs[i]), s16[i] = st::f32_to_bf16(sn[i]);
  st::DeviceBuffer<float> dx32(x), dc32(cs), ds32(sn);
  st::DeviceBuffer<uint16_t> dx16(x16), dc16(c16), ds16(s16), dk(kc), dv(vc), dq(size_t(c.t) * c.hq * c.d);
  st::DeviceBuffer<int64_t> dslots(slots);
  st::DeviceBuffer<int32_t> dflags(std::vector<int32_t>{0});
  dq.poison();
  const void* in = c.in_f32 ? static_cast<const void*>(dx32.ptr) : dx16.ptr;
  const void* cin = c.in_f32 ? static_cast<const void*>(dc32.ptr) : dc16.ptr;
  const void* sin_ = c.in_f32 ? static_cast<const void*>(ds32.ptr) : ds16.ptr;
  const ddtree_dtype_t in_dt = c.in_f32 ? DDTREE_DTYPE_FLOAT32 : DDTREE_DTYPE_BFLOAT16;
  ST_CHECK_STATUS(ddtree_qkv_prep(in, row, in_dt, cin, sin_, dslots.ptr, c.t, c.hq, c.hkv, c.d, dq.ptr, dk.ptr, dv.ptr,
                                  c.rows, DDTREE_DTYPE_BFLOAT16, dflags.ptr, nullptr));
  ST_CUDA(cudaDeviceSynchronize());
  std::vector<uint16_t> q_want(size_t(c.t) * c.hq * c.d);
  bool bad = false;
  for (int t = 0; t < c.t; ++t) {
    const bool ok = slots[t] >= 0 && slots[t] < c.rows;
    bad |= !ok;
    for (int h = 0; h < heads; ++h)
      for (int j = 0; j < c.d; ++j) {
        const float* xr = &x[size_t(t) * row + size_t(h) * c.d];
        const size_t tab = size_t(t) * c.d + j;
        const uint16_t r = host_rope(xr[j], cs[tab], xr[(j + half) % c.d], sn[tab]);
        if (h < c.hq) {
          q_want[(size_t(t) * c.hq + h) * c.d + j] = r;
        } else if (ok && h < c.hq + c.hkv) {
          kc[(size_t(slots[t]) * c.hkv + h - c.hq) * c.d + j] = r;
        } else if (ok) {
          vc[(size_t(slots[t]) * c.hkv + h - c.hq - c.hkv) * c.d + j] = st::f32_to_bf16(xr[j]);
        }
      }
  }
  const char* what = c.in_f32 ? "fp32" : "bf16";
  ST_EXPECT(dq.download() == q_want, "%s T %d Hq %d Hkv %d D %d: q differs from the host model", what, c.t, c.hq, c.hkv,
            c.d);
  ST_EXPECT(dk.download() == kc, "%s T %d Hq %d Hkv %d D %d: k_cache differs (a row or a stray write)", what, c.t,
            c.hq, c.hkv, c.d);
  ST_EXPECT(dv.download() == vc, "%s T %d Hq %d Hkv %d D %d: v_cache differs", what, c.t, c.hq, c.hkv, c.d);
  ST_EXPECT((dflags.download()[0] == 2) == bad, "error flags %d, a bad slot %s", dflags.download()[0],
            bad ? "was given" : "was not given");
}

}  // namespace

DDTREE_SELFTEST(qkv_prep_golden) {
  // T 1, Hq 1, Hkv 1, D 16. x = 1..16 on every head, cos = 1/2, sin = -1 / +1 (sign-folded): q[j] = x[j]/2 -
  // x[j+8] for j < 8 and x[j]/2 + x[j-8] above; the K row the same at slot 2; V = x; rows 0, 1, 3 untouched.
  const int d = 16;
  std::vector<uint16_t> x(3 * d), cs(d), sn(d);
  for (int h = 0; h < 3; ++h)
    for (int j = 0; j < d; ++j) x[h * d + j] = st::f32_to_bf16(float(j + 1));
  for (int j = 0; j < d; ++j) cs[j] = st::f32_to_bf16(0.5f), sn[j] = st::f32_to_bf16(j < 8 ? -1.f : 1.f);
  st::DeviceBuffer<uint16_t> dx(x), dc(cs), ds(sn), dq(d), dk(std::vector<uint16_t>(4 * d, 0)),
      dv(std::vector<uint16_t>(4 * d, 0));
  st::DeviceBuffer<int64_t> slot(std::vector<int64_t>{2});
  ST_CHECK_STATUS(ddtree_qkv_prep(dx.ptr, 3 * d, DDTREE_DTYPE_BFLOAT16, dc.ptr, ds.ptr, slot.ptr, 1, 1, 1, d, dq.ptr,
                                  dk.ptr, dv.ptr, 4, DDTREE_DTYPE_BFLOAT16, nullptr, nullptr));
  ST_CUDA(cudaDeviceSynchronize());
  const auto q = dq.download(), k = dk.download(), v = dv.download();
  for (int j = 0; j < d; ++j) {
    const float want = j < 8 ? float(j + 1) / 2 - float(j + 9) : float(j + 1) / 2 + float(j - 7);
    ST_EXPECT(st::bf16_to_f32(q[j]) == want, "q[%d] = %g, want %g", j, st::bf16_to_f32(q[j]), want);
    ST_EXPECT(st::bf16_to_f32(k[2 * d + j]) == want, "k[2][%d] = %g, want %g", j, st::bf16_to_f32(k[2 * d + j]), want);
    ST_EXPECT(st::bf16_to_f32(v[2 * d + j]) == float(j + 1), "v[2][%d] = %g", j, st::bf16_to_f32(v[2 * d + j]));
    for (int r : {0, 1, 3}) ST_EXPECT(k[r * d + j] == 0 && v[r * d + j] == 0, "row %d written", r);
  }
}

DDTREE_SELFTEST(qkv_prep_random) {
  run_prep({1, 8, 1, 64, 16, false}, 1);
  run_prep({17, 16, 8, 128, 64, false}, 2);
  run_prep({65, 16, 8, 64, 96, false}, 3);
  run_prep({131, 8, 1, 128, 160, false}, 4);
  run_prep({33, 16, 8, 128, 48, true}, 5);
  run_prep({7, 8, 1, 64, 16, true}, 6);
  const std::vector<int64_t> with_bad = {3, 40, -1, 7, 0};
  run_prep({5, 8, 1, 64, 32, false}, 7, &with_bad);
}

DDTREE_SELFTEST(qkv_prep_bad_arguments) {
  // Inputs and outputs in separate buffers (the C ABI says they must not overlap), all zero.
  st::DeviceBuffer<uint16_t> buf(std::vector<uint16_t>(4096, 0)), outs(std::vector<uint16_t>(4096, 0));
  st::DeviceBuffer<int64_t> slots(std::vector<int64_t>{0, 1});
  auto call = [&](int64_t stride, ddtree_dtype_t in, int hq, int hkv, int d, const void* q, int64_t rows,
                  ddtree_dtype_t out) {
    return ddtree_qkv_prep(buf.ptr, stride, in, buf.ptr, buf.ptr, slots.ptr, 2, hq, hkv, d, const_cast<void*>(q),
                           outs.ptr + 2048, outs.ptr + 3072, rows, out, nullptr, nullptr);
  };
  const auto bf = DDTREE_DTYPE_BFLOAT16;
  ST_EXPECT(call(640, bf, 8, 1, 64, outs.ptr, 4, bf) == DDTREE_STATUS_SUCCESS, "a valid call failed");
  ST_EXPECT(call(640, DDTREE_DTYPE_FLOAT16, 8, 1, 64, outs.ptr, 4, bf) == DDTREE_STATUS_INVALID_ARGUMENT, "fp16 in");
  ST_EXPECT(call(640, bf, 8, 1, 64, outs.ptr, 4, DDTREE_DTYPE_FLOAT16) == DDTREE_STATUS_INVALID_ARGUMENT, "fp16 out");
  ST_EXPECT(call(640, bf, 0, 1, 64, outs.ptr, 4, bf) == DDTREE_STATUS_INVALID_ARGUMENT, "no q heads");
  ST_EXPECT(call(640, bf, 8, 1, 24, outs.ptr, 4, bf) == DDTREE_STATUS_INVALID_ARGUMENT, "head_dim 24");
  ST_EXPECT(call(639, bf, 8, 1, 64, outs.ptr, 4, bf) == DDTREE_STATUS_INVALID_ARGUMENT, "short stride");
  ST_EXPECT(call(644, bf, 8, 1, 64, outs.ptr, 4, bf) == DDTREE_STATUS_INVALID_ARGUMENT, "unaligned stride");
  ST_EXPECT(call(640, bf, 8, 1, 64, outs.ptr + 1, 4, bf) == DDTREE_STATUS_INVALID_ARGUMENT, "unaligned q");
  ST_EXPECT(call(640, bf, 8, 1, 64, nullptr, 4, bf) == DDTREE_STATUS_INVALID_ARGUMENT, "null q");
  ST_EXPECT(call(640, bf, 8, 1, 64, outs.ptr, 0, bf) == DDTREE_STATUS_INVALID_ARGUMENT, "no cache rows");
  ST_CUDA(cudaDeviceSynchronize());
}
